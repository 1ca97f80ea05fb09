package blackbox

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/outboxd/outboxd/internal/cetest"
	"github.com/outboxd/outboxd/internal/testenv"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// ceRows is what each row's CloudEvent must say (cetest.Check),
// by outbox id.
func (e *testBundle) ceRows(source string) map[string]cetest.Want {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT id, event_type, created_at, aggregate_type, aggregate_id, payload::text FROM outbox`)
	if err != nil {
		e.t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cetest.Want, error) {
		w := cetest.Want{Source: source}
		err := r.Scan(&w.ID, &w.Type, &w.Time, &w.AggregateType, &w.AggregateID, &w.Data)
		return w, err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]cetest.Want{}
	for _, w := range all {
		out[strconv.FormatInt(w.ID, 10)] = w
	}
	return out
}

// contentTypeHeader is a delivered message's content type: its AMQP property,
// or its content-type header in any spelling.
func (d delivered) contentTypeHeader() string {
	if d.contentType != "" {
		return d.contentType
	}
	for k, v := range d.headers {
		if strings.EqualFold(k, "content-type") {
			return v
		}
	}
	return ""
}

// TestCloudEventsStructuredEverySink: dispatch.cloudevents_mode structured,
// set through the environment, reaches every sink: each message read back
// from the broker (or the webhook receiver) is an application/cloudevents+json
// event that the CloudEvents SDK decodes to its row, source from
// dispatch.cloudevents_source. The webhook's requests, signed with two
// secrets given in the environment, verify with the Standard Webhooks
// reference library holding either secret alone.
func TestCloudEventsStructuredEverySink(t *testing.T) {
	t.Parallel()
	const source = "urn:outboxd:blackbox"
	ceEnv := func(e *testBundle) {
		e.set("OUTBOXD_DISPATCH_CLOUDEVENTS", "true", "OUTBOXD_DISPATCH_CLOUDEVENTS_MODE", "structured",
			"OUTBOXD_DISPATCH_CLOUDEVENTS_SOURCE", source)
	}
	check := func(t *testing.T, e *testBundle, msgs []delivered, n int) {
		t.Helper()
		rows := e.ceRows(source)
		seen := map[string]bool{}
		for _, m := range msgs {
			if ct := m.contentTypeHeader(); ct != "application/cloudevents+json" {
				t.Errorf("%s: content type %q, want application/cloudevents+json", m.where, ct)
			}
			got, err := cetest.Decode(cetest.Message{ContentType: m.contentTypeHeader(), Body: []byte(m.body)})
			if err != nil {
				t.Errorf("%s: the SDK cannot decode %s: %v", m.where, m.body, err)
				continue
			}
			want, ok := rows[got.ID()]
			if !ok {
				t.Errorf("%s: no row has the event's id: %s", m.where, got)
				continue
			}
			if err := cetest.Check(got, want); err != nil {
				t.Errorf("%s: decoded %s\n%v", m.where, got, err)
			}
			seen[got.ID()] = true
		}
		if len(seen) != n {
			t.Errorf("%d distinct events decoded, want %d", len(seen), n)
		}
	}
	for _, c := range []sinkCase{kafkaCase(), natsCase(), rabbitMQCase(), redisStreamCase(), pubsubCase(), awsCase("sqs"), awsCase("sns")} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e, read := c.setup(t)
			ceEnv(e)
			ids := e.insertMany("order", 3, 2)
			e.start()
			waitFor(t, "all rows dispatched", func() bool { return e.count("dispatched_at IS NOT NULL") == len(ids) },
				e.describeRows("dispatched_at IS NULL"))
			check(t, e, read(len(ids)), len(ids))
		})
	}
	// Kinesis records have no headers: in structured mode the record is the
	// event alone, in the JSON event format (docs/sinks/kinesis.md).
	t.Run("kinesis", func(t *testing.T) {
		t.Parallel()
		k := testenv.StartKinesalite(t)
		kinesisStream(t, k, "outbox.event.order", 2)
		e := kinesisEnv(t, k)
		ceEnv(e)
		ids := e.insertMany("order", 3, 2)
		e.start()
		waitFor(t, "all rows dispatched", func() bool { return e.count("dispatched_at IS NOT NULL") == len(ids) },
			e.describeRows("dispatched_at IS NULL"))
		recs, err := k.Records(context.Background(), "outbox.event.order")
		if err != nil {
			t.Fatal(err)
		}
		var msgs []delivered
		for _, r := range recs {
			msgs = append(msgs, delivered{where: "record " + r.Shard + "@" + r.Sequence, body: string(r.Data),
				contentType: "application/cloudevents+json"})
		}
		check(t, e, msgs, len(ids))
	})
	t.Run("webhook", func(t *testing.T) {
		t.Parallel()
		rc := newRecorder(t, nil)
		newKey, oldKey := "whsec_"+base64.StdEncoding.EncodeToString([]byte("blackbox-new")), "whsec_"+base64.StdEncoding.EncodeToString([]byte("blackbox-old"))
		e := setup(t)
		ceEnv(e)
		e.set("OUTBOXD_DISPATCH_WEBHOOK_URL", rc.URL(), "OUTBOXD_DISPATCH_WEBHOOK_SECRET", newKey+" "+oldKey)
		ids := e.insertMany("order", 3, 2)
		e.start()
		waitFor(t, "all rows dispatched", func() bool { return e.count("dispatched_at IS NOT NULL") == len(ids) },
			e.describeRows("dispatched_at IS NULL"))
		var msgs []delivered
		for _, r := range rc.Requests() {
			msgs = append(msgs, delivered{where: "request " + r.Header.Get("webhook-id"), body: string(r.Body),
				contentType: r.Header.Get("Content-Type")})
			for _, k := range []string{newKey, oldKey} {
				wh, err := standardwebhooks.NewWebhook(k)
				if err != nil {
					t.Fatal(err)
				}
				if err := wh.Verify(r.Body, r.Header); err != nil {
					t.Errorf("request %s: a receiver holding one of the secrets refuses it: %v", r.Header.Get("webhook-id"), err)
				}
			}
		}
		check(t, e, msgs, len(ids))
	})
}
