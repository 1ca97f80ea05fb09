package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/internal/testkit"
)

// At start the daemon warns when the sink's duplicate window is shorter than
// the retry horizon: here a JetStream stream with a 2-minute window against
// the default horizon of 6 to 13 hours. Rows still flow through the sink.
func TestStartWarnsWhenTheDedupeWindowIsShorterThanTheRetryHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	nc, err := natsgo.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatalf("the machine's NATS (127.0.0.1:4222, JetStream): %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	name := "w" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"},
		Storage: jetstream.MemoryStorage, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })

	logs := &testkit.Logs{}
	a := newApp(t, logs, "info", b.sets("dispatch.sink=nats", "dispatch.nats.subject="+name+".{aggregate_type}")...)
	stop := runApp(t, a)
	defer stop()
	line := logs.WaitLine(t, 10*time.Second, "duplicate window is shorter than the retry horizon")
	if !strings.Contains(line, `"dedupe_window":"2m0s"`) || !strings.Contains(line, `"level":"WARN"`) {
		t.Fatalf("warning line %s: want WARN with the stream's 2m window", line)
	}
	if _, err := b.st.Pool().Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('deal', '1', 'deal.funded', '{"n":1}')`); err != nil {
		t.Fatal(err)
	}
	waitAllMarked(t, b.st)
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want the one row", info.State.Msgs)
	}
}
