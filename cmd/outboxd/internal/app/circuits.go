package app

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
)

// circuits publishes the destinations' circuit breakers (dispatch.Breaker):
// the gauge outboxd_circuit_open{destination} at each transition, and each
// open circuit in Redis (keys.Space.Circuit, a TTL of circuitTTL renewed
// every probe interval while open, deleted on close) for `outboxd status`
// on any replica. Breakers tell it their state (note); run writes it.
type circuits struct {
	a    *App
	kick chan struct{}

	mu     sync.Mutex
	latest map[string]dispatch.BreakerState // by destination: the last state not yet written, or open
	dirty  map[string]bool
	every  time.Duration // the shortest probe interval: how often open circuits are written again
}

// circuitTTL bounds how long a Redis record of an open circuit outlives the
// relay that wrote it (a leader that died with it open).
const circuitTTL = time.Minute

func newCircuits(a *App) *circuits {
	return &circuits{a: a, kick: make(chan struct{}, 1), latest: map[string]dispatch.BreakerState{}, dirty: map[string]bool{}}
}

// breaker wraps the sink of destination d in its circuit breaker.
func (c *circuits) breaker(d destination, s dispatch.Sink) dispatch.Sink {
	b := d.d.Breaker
	failures := b.Failures
	if failures == 0 {
		failures = -1 // never opens
	}
	c.mu.Lock()
	if c.every == 0 || b.ProbeInterval < c.every {
		c.every = b.ProbeInterval
	}
	c.mu.Unlock()
	c.a.Metrics.CircuitOpen.WithLabelValues(d.name).Set(0)
	return dispatch.NewBreaker(d.name, s, dispatch.BreakerConfig{Failures: failures, ProbeEvery: b.ProbeInterval,
		Log: c.a.Log, OnChange: c.note})
}

// note takes a breaker's state; cheap, from the sink's goroutine.
func (c *circuits) note(s dispatch.BreakerState) {
	v := 0.0
	if s.Open {
		v = 1
	}
	c.a.Metrics.CircuitOpen.WithLabelValues(s.Destination).Set(v)
	c.mu.Lock()
	c.latest[s.Destination], c.dirty[s.Destination] = s, true
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// run writes the states to Redis until ctx ends: each change at once, open
// circuits again every probe interval.
func (c *circuits) run(ctx context.Context) error {
	if c.a.KV == nil {
		return nil // idempotency.store postgres: the states stay in this process (/status)
	}
	c.mu.Lock()
	every := max(c.every, time.Second)
	c.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.kick:
		case <-t.C:
			c.mu.Lock()
			for name, s := range c.latest {
				c.dirty[name] = c.dirty[name] || s.Open
			}
			c.mu.Unlock()
		}
		c.write(ctx)
	}
}

// write writes the dirty states; a failure leaves them dirty for the next tick.
func (c *circuits) write(ctx context.Context) {
	c.mu.Lock()
	var todo []dispatch.BreakerState
	for name := range c.dirty {
		todo = append(todo, c.latest[name])
	}
	clear(c.dirty)
	c.mu.Unlock()
	space := keys.New(c.a.Cfg.Redis.KeyPrefix)
	for _, s := range todo {
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var err error
		if s.Open {
			v, _ := json.Marshal(s)
			err = c.a.KV.Set(wctx, space.Circuit(s.Destination), v, circuitTTL).Err()
		} else {
			err = c.a.KV.Del(wctx, space.Circuit(s.Destination)).Err()
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			c.a.Log.Warn("circuit state not written to redis", "destination", s.Destination, "error", err)
			c.mu.Lock()
			if _, newer := c.dirty[s.Destination]; !newer {
				c.dirty[s.Destination] = true
			}
			c.mu.Unlock()
		}
		if !s.Open {
			c.mu.Lock()
			if !c.dirty[s.Destination] {
				delete(c.latest, s.Destination)
			}
			c.mu.Unlock()
		}
	}
}

// circuitState is destination name's circuit: the running relay's breaker
// when built holds one, else what Redis holds (closed when nothing).
func (a *App) circuitState(ctx context.Context, name string, built dispatch.Sink) (dispatch.BreakerState, error) {
	if b, ok := built.(*dispatch.Breaker); ok {
		return b.State(), nil
	}
	if a.KV == nil {
		return dispatch.BreakerState{Destination: name}, nil // not shared without Redis
	}
	v, err := a.KV.Get(ctx, keys.New(a.Cfg.Redis.KeyPrefix).Circuit(name)).Bytes()
	if errors.Is(err, redis.Nil) {
		return dispatch.BreakerState{Destination: name}, nil
	}
	if err != nil {
		return dispatch.BreakerState{}, err
	}
	var s dispatch.BreakerState
	if err := json.Unmarshal(v, &s); err != nil {
		return dispatch.BreakerState{}, err
	}
	return s, nil
}
