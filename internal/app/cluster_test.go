package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
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
	addrs := testenv.StartRedisCluster(t, 3)
	st, dsn := testenv.Store(t)
	ctx := context.Background()
	const events = 300
	rc := &receiver{t: t, secret: []byte("s"), unique: map[int64]bool{}, all: make(chan struct{}), want: events}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	a := newApp(t, io.Discard, "warn",
		"postgres.dsn="+dsn, "redis.mode=cluster", "redis.addrs="+strings.Join(addrs, ","),
		"redis.key_prefix=app:", "dispatch.webhook.url="+srv.URL, "dispatch.webhook.secret=s",
		"http.addr=127.0.0.1:0", "poller.poll_interval=10ms", "poller.batch_size=50",
	)
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
	select {
	case <-rc.all:
	case <-time.After(30 * time.Second):
		t.Fatal("events not delivered over Redis Cluster")
	}
	waitAllMarked(t, st)
	// The delivered marks landed, spread over the cluster's slots.
	for _, id := range []int64{1, 150, 300} {
		v, err := a.KV.Get(ctx, "app:idempotency:notify:"+strconv.FormatInt(id, 10)).Result()
		if err != nil || v != "1" {
			t.Fatalf("idempotency key of %d: %q, %v", id, v, err)
		}
	}
	stop()
}
