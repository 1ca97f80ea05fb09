package poller

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/store"
)

// benchItems is a batch of n rows as a drain reads them: ~220-byte
// payloads over 1,000 aggregates.
func benchItems(n int) []item {
	items := make([]item, n)
	pad := strings.Repeat("x", 170)
	created := time.Now()
	for i := range items {
		items[i].row = store.Row{ID: int64(1_000_000 + i), AggregateType: "deal", AggregateID: strconv.Itoa(i % 1000),
			EventType: "deal.funded", Payload: []byte(`{"seq":` + strconv.Itoa(i) + `,"pad":"` + pad + `"}`),
			Headers: []byte(`{}`), CreatedAt: created}
	}
	return items
}

func benchPoller() *Poller {
	return &Poller{keys: keys.New("bench:1:"), m: metrics.New(), sink: dispatch.Noop{},
		log: slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))}
}

// BenchmarkClaimable is the per-event work of naming a batch's keys and
// delivered marks (1,000 rows per op).
func BenchmarkClaimable(b *testing.B) {
	p, items := benchPoller(), benchItems(1000)
	b.ReportAllocs()
	for b.Loop() {
		for i := range items {
			items[i].key, items[i].mark, items[i].outcome = "", "", 0
		}
		p.claimable(items)
	}
}

// BenchmarkCountOutcomes is the metrics of a batch of 1,000 delivered rows.
func BenchmarkCountOutcomes(b *testing.B) {
	p, items := benchPoller(), benchItems(1000)
	for i := range items {
		items[i].outcome = sent
	}
	ctx, now := context.Background(), time.Now()
	b.ReportAllocs()
	for b.Loop() {
		p.countOutcomes(ctx, items, now)
	}
}

// BenchmarkKeyWrites is finish's sorting of a batch's key writes.
func BenchmarkKeyWrites(b *testing.B) {
	p, items := benchPoller(), benchItems(1000)
	p.claimable(items)
	for i := range items {
		items[i].outcome = sent
	}
	b.ReportAllocs()
	for b.Loop() {
		p.keyWrites(items, make([]string, 0, len(items)), make([]byte, 0, len(items)), make([]string, 0, len(items)))
	}
}
