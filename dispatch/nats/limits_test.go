package nats

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/dispatch"
)

// headerBlockSize and maxHeaderBlock are checked against the server: a
// header block of exactly the limit is stored, one byte more is refused
// with err_code 10097.
func TestHeaderBlockLimitMatchesTheServer(t *testing.T) {
	ts := newStream(t, sharedURL, nil)
	js := jetStreamOf(t, sharedURL)
	for _, extra := range []int{0, 1} {
		m := nats.NewMsg(ts.prefix + ".x")
		m.Header.Set("big", "")
		m.Header.Set("big", strings.Repeat("x", maxHeaderBlock-headerBlockSize(m.Header)+extra))
		if got := headerBlockSize(m.Header); got != maxHeaderBlock+extra {
			t.Fatalf("size %d, want %d", got, maxHeaderBlock+extra)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, err := js.PublishMsg(ctx, m)
		cancel()
		var api *jetstream.APIError
		switch {
		case extra == 0 && err != nil:
			t.Fatalf("a header block of exactly %d bytes was refused: %v", maxHeaderBlock, err)
		case extra == 1 && (!errors.As(err, &api) || api.ErrorCode != errCodeHeaderTooLarge):
			t.Fatalf("a header block of %d bytes: %v, want err_code %d", maxHeaderBlock+1, err, errCodeHeaderTooLarge)
		}
	}
}

// An event whose header block JetStream can never store is Permanent
// before it is published; the others go out.
func TestHeaderBlockAboveLimitIsPermanentForItsEventOnly(t *testing.T) {
	ts := newStream(t, sharedURL, nil)
	s, _ := newSink(t, Config{URL: sharedURL, Subject: ts.prefix + ".{aggregate_type}"})
	big := event(2, "order", "2")
	big.Headers = json.RawMessage(`{"big":"` + strings.Repeat("x", 70<<10) + `"}`)
	res := s.Send(t.Context(), batch(event(1, "order", "1"), big, event(3, "order", "3")))
	if got := strings.Join(outcomes(res), ","); got != "delivered,permanent,delivered" {
		t.Fatalf("outcomes %s (%v), want delivered,permanent,delivered", got, res[1].Err)
	}
	if !strings.Contains(res[1].Err.Error(), "header block") || !dispatch.IsPermanent(res[1].Err) {
		t.Fatalf("want a permanent error about the header block, got %v", res[1].Err)
	}
	if n := ts.count(t); n != 2 {
		t.Fatalf("stream holds %d messages, want 2", n)
	}
}
