// Package peer runs the relays outboxd is compared with, on the same
// Postgres, so a benchmark can alternate them with outboxd in one run.
package peer

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// countingPublisher is the forwarder's no-op destination.
type countingPublisher struct{ n atomic.Int64 }

func (c *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	c.n.Add(int64(len(msgs)))
	return nil
}
func (c *countingPublisher) Close() error { return nil }

// WatermillDrain writes n enveloped messages of payloadBytes each with
// watermill's forwarder publisher into the empty database at dsn, then runs
// watermill-sql's forwarder (subscriber batch size batch, 10 ms poll) to a
// no-op publisher and returns how long it took to forward all n, from the
// forwarder's start. With vacuum, the tables are vacuumed and analyzed
// before the start (hint bits set, statistics taken); without, the
// forwarder starts on them as the publisher left them.
func WatermillDrain(ctx context.Context, dsn string, batch, n, payloadBytes int, vacuum bool) (time.Duration, error) {
	db, err := stdsql.Open("pgx", dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(16)
	logger := watermill.NopLogger{}
	schema := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batch}
	pub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return 0, err
	}
	fwdPub := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: "forwarder_topic"})
	pad := strings.Repeat("x", max(payloadBytes-40, 0))
	for i := 0; i < n; i += 1000 {
		msgs := make([]*message.Message, min(1000, n-i))
		for j := range msgs {
			msgs[j] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"seq":%d,"pad":"%s"}`, i+j, pad))
		}
		if err := fwdPub.Publish("events", msgs...); err != nil {
			return 0, err
		}
	}
	if vacuum {
		if _, err := db.ExecContext(ctx, `VACUUM ANALYZE`); err != nil {
			return 0, err
		}
	}
	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true, PollInterval: 10 * time.Millisecond,
	}, logger)
	if err != nil {
		return 0, err
	}
	out := &countingPublisher{}
	fwd, err := forwarder.NewForwarder(sub, out, logger, forwarder.Config{ForwarderTopic: "forwarder_topic"})
	if err != nil {
		return 0, err
	}
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = fwd.Run(rctx) })
	for out.n.Load() < int64(n) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	cancel()
	_ = fwd.Close()
	wg.Wait()
	return elapsed, ctx.Err()
}
