package testenv

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
)

// KinesaliteVersion is the kinesalite (npm: a Kinesis emulator on Node.js)
// the tests and the benchmark run.
const KinesaliteVersion = "3.3.3"

// ErrNoNPM: npm is not installed or the npm registry cannot be reached, so
// kinesalite cannot be installed (scripts/kinesalite.sh installs it before
// the tests). Tests that need it fail, saying so.
var ErrNoNPM = errors.New("testenv: kinesalite is not installed and npm cannot install it")

// KinesaliteDir is where kinesalite is installed: $OUTBOXD_TEST_KINESALITE_DIR,
// or $HOME/.cache/outboxd/kinesalite.
func KinesaliteDir() string {
	if d := os.Getenv("OUTBOXD_TEST_KINESALITE_DIR"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "outboxd", "kinesalite")
}

// InstallKinesalite returns the kinesalite executable, installing it with
// npm into KinesaliteDir when missing. Test packages run in parallel, so
// the install holds a lock file. The error wraps ErrNoNPM when npm is
// missing or offline.
func InstallKinesalite(ctx context.Context) (string, error) {
	dir := KinesaliteDir()
	bin := filepath.Join(dir, "node_modules", ".bin", "kinesalite")
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("%w: node is not on PATH", ErrNoNPM)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("testenv: kinesalite dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".install.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("testenv: kinesalite lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("testenv: kinesalite lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("%w: npm is not on PATH", ErrNoNPM)
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ictx, npm, "install", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error",
		"kinesalite@"+KinesaliteVersion)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := out.String()
		for _, offline := range []string{"ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ECONNRESET", "ENETUNREACH"} {
			if strings.Contains(msg, offline) {
				return "", fmt.Errorf("%w: npm install kinesalite@%s: %s", ErrNoNPM, KinesaliteVersion, strings.TrimSpace(msg))
			}
		}
		return "", fmt.Errorf("testenv: npm install kinesalite@%s into %s: %w: %s", KinesaliteVersion, dir, err, strings.TrimSpace(msg))
	}
	return bin, nil
}

// Kinesalite is a kinesalite process on a loopback port, in memory, with
// streams active at once (no CREATING delay).
type Kinesalite struct {
	Endpoint string // http://127.0.0.1:<port>
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process ended
	waitErr  error         // Wait's answer, once exited is closed
}

// RunKinesalite starts kinesalite on port and waits until it answers a
// Kinesis request (a TCP connection alone could be another process that
// took the port first). Stop it with Stop. ErrKinesaliteExited: the
// process ended before it answered (the port was taken meanwhile).
func RunKinesalite(ctx context.Context, port int) (*Kinesalite, error) {
	bin, err := InstallKinesalite(ctx)
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// kinesalite listens on every interface; its port is the test's own.
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--createStreamMs", "0", "--deleteStreamMs", "0",
		"--updateStreamMs", "0", "--shardLimit", "1000")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start kinesalite: %w", err)
	}
	k := &Kinesalite{Endpoint: "http://" + addr, cmd: cmd, exited: make(chan struct{})}
	go func() { k.waitErr = cmd.Wait(); close(k.exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-k.exited:
			k.cmd = nil
			return nil, fmt.Errorf("%w: port %d: %v", ErrKinesaliteExited, port, k.waitErr)
		default:
		}
		if err := k.ping(ctx); err == nil {
			return k, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			k.Stop()
			return nil, fmt.Errorf("testenv: kinesalite on %s did not answer: %w", addr, cmp.Or(ctx.Err(), err))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ErrKinesaliteExited: kinesalite ended before it answered.
var ErrKinesaliteExited = errors.New("testenv: kinesalite exited before it answered")

// ping asks k for its streams.
func (k *Kinesalite) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := k.Client().ListStreams(ctx, &kinesis.ListStreamsInput{})
	return err
}

// Stop kills the process and waits for it.
func (k *Kinesalite) Stop() {
	if k.cmd == nil || k.cmd.Process == nil {
		return
	}
	_ = k.cmd.Process.Kill()
	<-k.exited
	k.cmd = nil
}

// StartKinesalite runs kinesalite for t on a free port, stopped at
// cleanup. It fails t, never skips it, when kinesalite cannot be had: a
// skipped Kinesis test would pass having checked nothing. kinesalite
// accepts any AWS credentials, but requests must be signed.
func StartKinesalite(t testing.TB) *Kinesalite {
	t.Helper()
	k, err := RunKinesalite(context.Background(), FreePort(t))
	for try := 0; errors.Is(err, ErrKinesaliteExited) && try < 3; try++ {
		k, err = RunKinesalite(context.Background(), FreePort(t)) // the port was taken: another
	}
	if err != nil {
		t.Fatalf("%v (scripts/kinesalite.sh installs kinesalite)", err)
	}
	t.Cleanup(k.Stop)
	return k
}

// Client is a Kinesis client for k, with the static credentials kinesalite
// accepts.
func (k *Kinesalite) Client() *kinesis.Client {
	return kinesis.New(kinesis.Options{Region: "us-east-1", BaseEndpoint: aws.String(k.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
}

// CreateStream creates a stream of shards shards and waits until it is
// ACTIVE. Kinesalite answers CreateStream with the stream CREATING and
// makes it ACTIVE from a timer even with --createStreamMs 0; under load a
// PutRecords sent at once is refused ("not found").
func (k *Kinesalite) CreateStream(ctx context.Context, name string, shards int32) error {
	c := k.Client()
	if _, err := c.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(shards)}); err != nil {
		return err
	}
	w := kinesis.NewStreamExistsWaiter(c, func(o *kinesis.StreamExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = 10*time.Millisecond, 100*time.Millisecond
	})
	if err := w.Wait(ctx, &kinesis.DescribeStreamInput{StreamName: aws.String(name)}, time.Minute); err != nil {
		return fmt.Errorf("stream %s not active: %w", name, err)
	}
	return nil
}

// KinesisRecord is a record as a consumer reads it.
type KinesisRecord struct {
	Shard, PartitionKey, Sequence string
	Data                          []byte
}

// Records reads every record of the stream, shard by shard, each shard in
// sequence order.
func (k *Kinesalite) Records(ctx context.Context, stream string) ([]KinesisRecord, error) {
	c := k.Client()
	shards, err := c.ListShards(ctx, &kinesis.ListShardsInput{StreamName: aws.String(stream)})
	if err != nil {
		return nil, err
	}
	var out []KinesisRecord
	for _, sh := range shards.Shards {
		it, err := c.GetShardIterator(ctx, &kinesis.GetShardIteratorInput{StreamName: aws.String(stream),
			ShardId: sh.ShardId, ShardIteratorType: types.ShardIteratorTypeTrimHorizon})
		if err != nil {
			return nil, err
		}
		next := it.ShardIterator
		for next != nil {
			res, err := c.GetRecords(ctx, &kinesis.GetRecordsInput{ShardIterator: next, Limit: aws.Int32(10000)})
			if err != nil {
				return nil, err
			}
			for _, r := range res.Records {
				out = append(out, KinesisRecord{Shard: aws.ToString(sh.ShardId), PartitionKey: aws.ToString(r.PartitionKey),
					Sequence: aws.ToString(r.SequenceNumber), Data: r.Data})
			}
			if len(res.Records) == 0 {
				break // an open shard's iterator never ends: empty means caught up
			}
			next = res.NextShardIterator
		}
	}
	return out, nil
}
