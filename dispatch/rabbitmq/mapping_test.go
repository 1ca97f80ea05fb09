package rabbitmq

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/cetest"
)

// TestMessageMapping: the body is the payload's bytes as they are; the
// routing key is the template filled from the row; the AMQP properties
// and the headers table are the contract's, row headers pass through and
// a colliding one does not override (one warning per batch names it).
func TestMessageMapping(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	var lg logs
	s := newSink(t, Config{Exchange: a.exchange, Log: lg.logger()})

	e := ev(101, "deal", "42", "deal.funded")
	e.Payload = json.RawMessage(`{"amount": 1,  "tags":["a" ,"b"]}`) // spacing kept as is
	e.Headers = json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tenant":"acme","retries":3,"ID":"spoofed"}`)
	e.CreatedAt = time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	res := send(t, s, e)
	allDelivered(t, res)

	ds := a.drain(q)
	if len(ds) != 1 {
		t.Fatalf("queue holds %d messages, want 1", len(ds))
	}
	d := ds[0]
	if string(d.Body) != string(e.Payload) {
		t.Errorf("body %q, want the payload as is %q", d.Body, e.Payload)
	}
	if d.Exchange != a.exchange || d.RoutingKey != "outbox.event.deal" {
		t.Errorf("published to %q with key %q, want %q and the default template's outbox.event.deal", d.Exchange, d.RoutingKey, a.exchange)
	}
	if d.MessageId != "101" || d.Type != "deal.funded" || d.ContentType != "application/json" ||
		d.DeliveryMode != amqp.Persistent || !d.Timestamp.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("properties: message_id %q type %q content_type %q delivery_mode %d timestamp %v",
			d.MessageId, d.Type, d.ContentType, d.DeliveryMode, d.Timestamp)
	}
	want := amqp.Table{
		"id": "101", "aggregate_type": "deal", "aggregate_id": "42", "event_type": "deal.funded",
		"created_at": "2026-01-02T03:04:05.6Z", "fencing_token": "7",
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "acme", "retries": "3",
	}
	assertTable(t, d.Headers, want)

	warns := lg.records("WARN")
	if len(warns) != 1 || warns[0]["outbox_id"] != float64(101) || !strings.Contains(lg.String(), `"dropped":["ID"]`) {
		t.Errorf("want one warning naming outbox_id 101 and the dropped header ID; logs:\n%s", lg.String())
	}
}

// TestCloudEvents: with CloudEvents on, the attributes join the headers
// with the AMQP binding's cloudEvents_ prefix (§3.1.3.1; datacontenttype is
// the content_type property); the routing key follows a template over both
// placeholders.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	a.declareExchange(amqp.ExchangeTopic)
	q := a.queue("#", nil)
	s := newSink(t, Config{Exchange: a.exchange, RoutingKey: "{aggregate_type}.{event_type}",
		CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "billing"}})

	e := ev(7, "invoice", "9", "invoice.paid")
	allDelivered(t, send(t, s, e))
	ds := a.drain(q)
	if len(ds) != 1 {
		t.Fatalf("queue holds %d messages, want 1", len(ds))
	}
	if ds[0].RoutingKey != "invoice.invoice.paid" {
		t.Errorf("routing key %q, want invoice.invoice.paid", ds[0].RoutingKey)
	}
	assertTable(t, ds[0].Headers, amqp.Table{
		"id": "7", "aggregate_type": "invoice", "aggregate_id": "9", "event_type": "invoice.paid",
		"created_at": "2026-03-04T05:06:07Z", "fencing_token": "7",
		"cloudEvents_specversion": "1.0", "cloudEvents_id": "7", "cloudEvents_source": "billing", "cloudEvents_type": "invoice.paid",
		"cloudEvents_time": "2026-03-04T05:06:07Z", "cloudEvents_aggregatetype": "invoice", "cloudEvents_aggregateid": "9",
	})
	if ds[0].ContentType != "application/json" {
		t.Errorf("content_type %q, want application/json (datacontenttype)", ds[0].ContentType)
	}
}

// TestCloudEventsDecodeWithTheSDK: in both modes the message the broker
// delivered decodes, as the AMQP binding defines it (cloudEvents_
// headers, content_type for datacontenttype or the event format), with the
// CloudEvents SDK to the row's event; message_id, type and the contract's
// headers stay.
func TestCloudEventsDecodeWithTheSDK(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{dispatch.CloudEventsBinary, dispatch.CloudEventsStructured} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			a := newAdmin(t)
			a.declareExchange(amqp.ExchangeTopic)
			q := a.queue("#", nil)
			s := newSink(t, Config{Exchange: a.exchange, CloudEvents: dispatch.CloudEvents{Enabled: true, Source: "urn:billing eu", Mode: mode}})
			e := ev(8, "invoice", "9 €", "invoice paid")
			allDelivered(t, send(t, s, e))
			d := a.drain(q)[0]
			h := map[string]string{}
			for k, v := range d.Headers {
				h[k], _ = v.(string)
			}
			got, err := cetest.Decode(cetest.Message{Prefix: "cloudEvents_", ContentType: d.ContentType, Headers: h, Body: d.Body})
			if err != nil {
				t.Fatalf("the SDK cannot decode %v / %s: %v", h, d.Body, err)
			}
			if err := cetest.Check(got, cetest.Want{ID: 8, Source: "urn:billing eu", Type: "invoice paid",
				Time: e.CreatedAt, AggregateType: "invoice", AggregateID: "9 €", Data: string(e.Payload)}); err != nil {
				t.Errorf("decoded %s\n%v", got, err)
			}
			if d.MessageId != "8" || d.Type != "invoice paid" || h["id"] != "8" || h["aggregate_id"] != "9 €" {
				t.Errorf("message_id %q type %q headers %v: the contract's mapping is kept in every mode", d.MessageId, d.Type, h)
			}
		})
	}
}

func assertTable(t *testing.T, got, want amqp.Table) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %q = %#v, want %q", k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected header %q = %#v", k, v)
		}
	}
}

// TestDefaults: an empty Config means the contract's defaults, and the
// sink says what it can do.
func TestDefaults(t *testing.T) {
	t.Parallel()
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.exchange != "outbox" || s.target != "amqp://127.0.0.1:5672/" {
		t.Errorf("exchange %q target %q", s.exchange, s.target)
	}
	if got := s.key.Expand(ev(1, "deal", "1", "x")); got != "outbox.event.deal" {
		t.Errorf("routing key %q", got)
	}
	c := s.Capabilities()
	if c.DedupeWindow != 0 || c.Ordering != "per queue (one channel, publish order)" || c.MaxBatch != 0 {
		t.Errorf("capabilities %+v", c)
	}
}

// TestConfigErrors: New refuses what cannot work, without quoting a
// password; it does not contact the broker.
func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"scheme", Config{URL: "http://guest:hunter2@127.0.0.1:5672/"}, "url"},
		{"port", Config{URL: "amqp://guest:hunter2@127.0.0.1:port/"}, "url"},
		{"unencoded password", Config{URL: "amqp://guest:hun#ter2@127.0.0.1:5672/"}, "url"},
		{"template", Config{RoutingKey: "outbox.{aggregate}"}, "unknown placeholder"},
		{"long exchange", Config{Exchange: strings.Repeat("x", 256)}, "above AMQP's limit"},
		{"control character", Config{Exchange: "out\nbox"}, "control character"},
	} {
		s, err := New(c.cfg)
		if err == nil {
			s.Close()
			t.Errorf("%s: New accepted %+v", c.name, c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "hun#") {
			t.Errorf("%s: error %q: want it to mention %q and no password", c.name, err, c.want)
		}
	}
}
