package blackbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Black-box tests of dispatch.sink=nats: the built binary publishes rows
// to a JetStream stream of the test's own (subjects "<prefix>.>" on the
// machine's NATS server), read back with an ordered consumer.

// natsTestURL is the NATS server (JetStream on) the tests use.
var natsTestURL = cmp.Or(os.Getenv("OUTBOXD_TEST_NATS_URL"), "nats://127.0.0.1:4222")

// natsStream is a test's stream, deleted at cleanup.
type natsStream struct {
	t      *testing.T
	js     jetstream.JetStream
	name   string
	prefix string // its subjects' first token
}

// newNATSStream creates a file stream named after a random prefix;
// subjects are relative to the prefix ("order" is "<prefix>.order").
func newNATSStream(t *testing.T, subjects ...string) *natsStream {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	nc, err := nats.Connect(natsTestURL)
	if err != nil {
		t.Fatalf("connect to NATS at %s (set OUTBOXD_TEST_NATS_URL): %v", natsTestURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ns := &natsStream{t: t, js: js, name: "BB" + strings.ToUpper(id), prefix: "bb" + id}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: ns.name, Subjects: ns.subjects(subjects)}); err != nil {
		t.Fatalf("create stream %s: %v", ns.name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, ns.name)
	})
	return ns
}

func (ns *natsStream) subjects(rel []string) []string {
	out := make([]string, len(rel))
	for i, s := range rel {
		out[i] = ns.prefix + "." + s
	}
	return out
}

// setSubjects changes the stream's subjects (relative to the prefix).
func (ns *natsStream) setSubjects(rel ...string) {
	ns.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ns.js.UpdateStream(ctx, jetstream.StreamConfig{Name: ns.name, Subjects: ns.subjects(rel)}); err != nil {
		ns.t.Fatalf("update stream %s: %v", ns.name, err)
	}
}

// consume reads every message of the stream from the start with an
// ordered consumer, in stream order.
func (ns *natsStream) consume() []jetstream.Msg {
	ns.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := ns.js.Stream(ctx, ns.name)
	if err != nil {
		ns.t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		ns.t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		ns.t.Fatal(err)
	}
	var out []jetstream.Msg
	for uint64(len(out)) < info.State.Msgs {
		batch, err := cons.Fetch(int(info.State.Msgs)-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			ns.t.Fatal(err)
		}
		n := len(out)
		for m := range batch.Messages() {
			out = append(out, m)
		}
		if err := batch.Error(); err != nil {
			ns.t.Fatalf("fetch from %s: %v", ns.name, err)
		}
		if len(out) == n {
			ns.t.Fatalf("fetch from %s: nothing after %d of %d messages", ns.name, n, info.State.Msgs)
		}
	}
	return out
}

// natsEnv is a testBundle whose replica publishes to ns with subject template
// "<prefix>.{aggregate_type}".
func natsEnv(t *testing.T, ns *natsStream) *testBundle {
	e := setup(t)
	e.set("OUTBOXD_DISPATCH_SINK", "nats",
		"OUTBOXD_DISPATCH_NATS_URL", natsTestURL,
		"OUTBOXD_DISPATCH_NATS_SUBJECT", ns.prefix+".{aggregate_type}")
	return e
}

// natsCase: subject <prefix>.order, Nats-Msg-Id = "<outbox id>:<fingerprint>"
// (its delivered mark's), and the start-up check that found the stream's
// duplicate window.
func natsCase() sinkCase {
	var ns *natsStream
	var e *testBundle
	return sinkCase{
		name: "nats",
		setup: func(t *testing.T) (*testBundle, func(int) []delivered) {
			ns = newNATSStream(t, ">")
			e = natsEnv(t, ns)
			return e, func(int) []delivered {
				var out []delivered
				for _, m := range ns.consume() {
					h := map[string]string{"subject": m.Subject()}
					for k := range m.Headers() {
						h[k] = m.Headers().Get(k)
					}
					out = append(out, delivered{where: "message on " + m.Subject(), headers: h, key: h["aggregate_id"], body: string(m.Data())})
				}
				return out
			}
		},
		check: func(t *testing.T, r *replica, msgs []delivered) {
			for _, m := range msgs {
				if want := e.dedupeID(m.headers["id"]); m.headers["subject"] != ns.prefix+".order" || m.headers["Nats-Msg-Id"] != want {
					t.Errorf("%s: subject %s, Nats-Msg-Id %q, want %s.order and %q (the id and its mark's fingerprint)", m.where, m.headers["subject"], m.headers["Nats-Msg-Id"], ns.prefix, want)
				}
			}
			// The start-up check found the stream's window (2 min,
			// JetStream's default) and compared it with the retry horizon.
			if found := r.logsMatching(func(_ string, rec map[string]any) bool {
				return rec["msg"] == "nats: stream found" && rec["stream"] == ns.name
			}); len(found) != 1 {
				t.Errorf("want one 'nats: stream found' line for %s, got %d; logs:\n%s", ns.name, len(found), r.tail(20))
			}
		},
	}
}

// TestNATSSinkNoStream: rows whose subject no stream captures are retried
// with a readable last_error naming the subject; the other aggregates
// flow; once the stream captures the subject, the rows go through in
// order.
func TestNATSSinkNoStream(t *testing.T) {
	t.Parallel()
	ns := newNATSStream(t, "order")
	e := natsEnv(t, ns)
	e.set("OUTBOXD_POLLER_MAX_ATTEMPTS", "1000")
	var orphans []int64
	for i := range 4 {
		orphans = append(orphans, e.insert("orphan", strconv.Itoa(i%2), `{"o":`+strconv.Itoa(i)+`}`, ""))
	}
	flowing := e.insertMany("order", 5, 4)
	e.start()
	waitFor(t, "the other aggregates' rows dispatched", func() bool {
		return e.count("aggregate_type = 'order' AND dispatched_at IS NOT NULL") == len(flowing)
	}, e.describeRows("aggregate_type = 'order'"))
	subject := ns.prefix + ".orphan"
	waitFor(t, "the orphan rows retried with a readable last_error", func() bool {
		return e.count(`aggregate_type = 'orphan' AND attempts >= 2 AND last_error LIKE '%no JetStream stream captures subject%'`) >= 2
	}, e.describeRows("aggregate_type = 'orphan'"))
	for _, w := range e.rows("aggregate_type = 'orphan'") {
		if w.Dispatched || w.Dead {
			t.Fatalf("orphan row settled: %s", w)
		}
		if w.Attempts > 0 && (!strings.Contains(w.LastError, strconv.Quote(subject)) || !strings.Contains(w.LastError, "add the subject to a stream")) {
			t.Errorf("last_error does not name the subject %s and the fix: %s", subject, w)
		}
	}
	t.Logf("last_error: %s", e.rows("aggregate_type = 'orphan' AND attempts > 0")[0].LastError)

	ns.setSubjects("order", "orphan")
	waitFor(t, "the orphan rows dispatched once the stream captures them", func() bool {
		return e.count("aggregate_type = 'orphan' AND dispatched_at IS NOT NULL") == len(orphans)
	}, e.describeRows("aggregate_type = 'orphan'"))
	byAgg := map[string][]int64{}
	for _, m := range ns.consume() {
		if m.Subject() != subject {
			continue
		}
		id, _ := strconv.ParseInt(m.Headers().Get("id"), 10, 64)
		byAgg[m.Headers().Get("aggregate_id")] = append(byAgg[m.Headers().Get("aggregate_id")], id)
	}
	want := map[string][]int64{"0": {orphans[0], orphans[2]}, "1": {orphans[1], orphans[3]}}
	for agg, ids := range want {
		if !slices.Equal(byAgg[agg], ids) {
			t.Errorf("aggregate orphan/%s: stream holds %v, want %v", agg, byAgg[agg], ids)
		}
	}
}
