package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/internal/testenv"
	"github.com/outboxd/outboxd/store"
)

// The whole relay on a three-master Redis Cluster: the idempotency claims
// and scripts are pipelined across hash slots.
func TestRelayOnRedisCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.StartRedisCluster(t, 3)
	b := setup(t, "s")
	st := b.st
	ctx := context.Background()
	const events = 300
	a := newApp(t, io.Discard, "warn", b.sets(
		"redis.mode=cluster", "redis.addrs="+strings.Join(addrs, ","), "redis.key_prefix=app:",
		"poller.poll_interval=10ms", "poller.batch_size=50",
	)...)
	err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		var evs []store.Event
		for i := range events {
			evs = append(evs, store.Event{AggregateType: "deal", AggregateID: strconv.Itoa(i % 17),
				EventType: "deal.funded", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		}
		return store.Enqueue(ctx, tx, evs...)
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runApp(t, a)
	b.rc.WaitDelivered(t, 30*time.Second, events) // over Redis Cluster
	waitAllMarked(t, st)
	// The delivered marks landed, spread over the cluster's slots.
	for _, id := range []int64{1, 150, 300} {
		v, err := a.KV.Get(ctx, "app:idempotency:notify:"+strconv.FormatInt(id, 10)).Result()
		if err != nil || !strings.HasPrefix(v, "1:") {
			t.Fatalf("idempotency key of %d: %q, %v", id, v, err)
		}
	}
	stop()
	checkContract(t, b.rc.Requests(), []byte(b.secret))
}
