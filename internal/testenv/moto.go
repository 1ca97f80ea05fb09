package testenv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
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
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// Moto is a moto_server process: the moto project's emulator of AWS APIs,
// here for SQS and SNS (the JSON protocol of today's SQS clients,
// SendMessageBatch, PublishBatch, FIFO queues and topics, SNS-to-SQS
// subscriptions). Accounts and credentials are not checked; any key works.
type Moto struct {
	Endpoint string // http://127.0.0.1:<port>
	cmd      *exec.Cmd
	http     *http.Client // the clients', its idle connections dropped by Stop (goleak)
}

// MotoRegion is the region tests and benchmarks give the emulator.
const MotoRegion = "us-east-1"

// MotoAccount is the account id moto puts in queue URLs and topic ARNs.
const MotoAccount = "123456789012"

// StartMoto starts moto_server on a free loopback port; it is killed at
// cleanup. moto_server must be on PATH (pip install 'moto[server]').
func StartMoto(t testing.TB) *Moto {
	t.Helper()
	m, err := StartMotoServer(context.Background(), FreePort(t), filepath.Join(t.TempDir(), "moto.log"))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(m.Stop)
	return m
}

// StartMotoServer starts moto_server on port, its output to logFile, and
// waits until it answers. Stop it with Stop.
func StartMotoServer(ctx context.Context, port int, logFile string) (*Moto, error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return nil, fmt.Errorf("moto_server not on PATH (pip install 'moto[server]'): %w", err)
	}
	log, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer log.Close() // the child holds its own descriptor
	m := &Moto{Endpoint: "http://127.0.0.1:" + strconv.Itoa(port), http: &http.Client{Transport: &http.Transport{}}}
	m.cmd = exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	m.cmd.Stdout, m.cmd.Stderr = log, log
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the pyenv shim's python child dies with it
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start moto_server: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.Endpoint+"/moto-api/", nil)
		resp, err := m.http.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return m, nil
			}
		}
		select {
		case <-ctx.Done():
			m.Stop()
			return nil, errors.Join(fmt.Errorf("moto_server on %s did not answer (log: %s)", m.Endpoint, logFile), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop kills the server and its children.
func (m *Moto) Stop() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	_ = m.cmd.Wait()
	m.cmd = nil
	m.http.CloseIdleConnections()
}

// Credentials are what the emulator is given: any key works.
func (m *Moto) Credentials() aws.CredentialsProvider { return StaticAWSCredentials() }

// StaticAWSCredentials are fixed test credentials: a client given them
// never looks for others (an instance metadata service).
func StaticAWSCredentials() aws.CredentialsProvider {
	return credentials.NewStaticCredentialsProvider("test", "test", "")
}

// Env is the environment a process needs to reach the emulator with the
// AWS SDK's default chain (and never an instance metadata service).
func (m *Moto) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=" + MotoRegion,
		"AWS_EC2_METADATA_DISABLED=true"}
}

func (m *Moto) config() aws.Config {
	return aws.Config{Region: MotoRegion, Credentials: m.Credentials(), BaseEndpoint: aws.String(m.Endpoint), HTTPClient: m.http}
}

// SQS is a client of the emulator's SQS.
func (m *Moto) SQS() *sqs.Client { return sqs.NewFromConfig(m.config()) }

// SNS is a client of the emulator's SNS.
func (m *Moto) SNS() *sns.Client { return sns.NewFromConfig(m.config()) }

// CreateQueue creates a queue (a FIFO one when name ends in ".fifo") with
// attrs and returns its URL.
func (m *Moto) CreateQueue(t testing.TB, name string, attrs map[string]string) string {
	t.Helper()
	a := map[string]string{}
	maps.Copy(a, attrs)
	if strings.HasSuffix(name, ".fifo") {
		a["FifoQueue"] = "true"
	}
	out, err := m.SQS().CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: a})
	if err != nil {
		t.Fatalf("testenv: create queue %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

// QueueURL is the URL of a queue of the emulator, existing or not.
func (m *Moto) QueueURL(name string) string { return m.Endpoint + "/" + MotoAccount + "/" + name }

// CreateTopic creates a topic (FIFO when name ends in ".fifo") and
// subscribes the queue at queueURL to it with raw message delivery, so
// the queue holds each message as published, with its attributes. It
// returns the topic's ARN.
func (m *Moto) CreateTopic(t testing.TB, name, queueURL string) string {
	t.Helper()
	ctx := context.Background()
	attrs := map[string]string{}
	if strings.HasSuffix(name, ".fifo") {
		attrs["FifoTopic"] = "true"
	}
	out, err := m.SNS().CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("testenv: create topic %s: %v", name, err)
	}
	queueARN := "arn:aws:sqs:" + MotoRegion + ":" + MotoAccount + ":" + queueURL[strings.LastIndexByte(queueURL, '/')+1:]
	if _, err := m.SNS().Subscribe(ctx, &sns.SubscribeInput{TopicArn: out.TopicArn, Protocol: aws.String("sqs"),
		Endpoint: aws.String(queueARN), Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatalf("testenv: subscribe %s to %s: %v", queueARN, name, err)
	}
	return aws.ToString(out.TopicArn)
}

// TopicARN is the ARN of a topic of the emulator, existing or not.
func (m *Moto) TopicARN(name string) string {
	return "arn:aws:sns:" + MotoRegion + ":" + MotoAccount + ":" + name
}

// Receive reads and deletes messages from the queue until it has at least
// n (in the order received: a FIFO queue hands out a group's next message
// only once the previous one is deleted), or fails the test after a while.
func (m *Moto) Receive(t testing.TB, queueURL string, n int) []sqstypes.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := m.SQS()
	var out []sqstypes.Message
	for len(out) < n {
		got, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(queueURL), MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatalf("testenv: receive from %s (%d of %d so far): %v", queueURL, len(out), n, err)
		}
		for _, msg := range got.Messages {
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(queueURL), ReceiptHandle: msg.ReceiptHandle}); err != nil {
				t.Fatalf("testenv: delete from %s: %v", queueURL, err)
			}
		}
		out = append(out, got.Messages...)
	}
	return out
}

// Count is how many messages the queue holds (visible or not).
func (m *Moto) Count(ctx context.Context, queueURL string) (int, error) {
	out, err := m.SQS().GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, err
	}
	total := 0
	for _, v := range out.Attributes {
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}
