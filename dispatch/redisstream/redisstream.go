// Package redisstream is the Redis Streams sink: one pipelined XADD per
// event of a batch, all in one round trip (a Cluster client splits the
// pipeline by node), with a reply per entry, approximate MAXLEN trimming and
// the stream key from a template.
//
// What it promises: an event is Delivered only once Redis replied to its
// XADD with the new entry's id (the Result's Ref); the entries of one
// stream key are appended in the batch's order; per aggregate, successes are
// a prefix of the batch; no byte is written after the batch's trust
// deadline (the client must bound commands by their context:
// ContextTimeoutEnabled).
//
// What it does not: Redis 7 has no server-side dedupe, so a retry after a
// lost reply, or an event reported NotAttempted that Redis had taken anyway,
// appends a second entry with the same id field: consumers dedupe on it.
// Redis 8.6 added XADD IDMP; the sink reads the server's version once and
// logs whether IDMP is there, but does not use it (see docs/sinks/redis_stream.md).
//
// It imports nothing of outboxd but dispatch.
package redisstream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md). DefaultStream fills an empty Config.Stream;
// DefaultMaxLen is the config key's default: in Config, 0 means no trimming.
const (
	DefaultStream = "outbox.event.{aggregate_type}"
	DefaultMaxLen = 1000000 // approximate (MAXLEN ~)
)

// PayloadField is the stream entry field that carries the row's payload
// JSON as is (in CloudEvents structured mode, the event), beside the
// header fields.
const PayloadField = "payload"

// Config configures the sink.
type Config struct {
	Client    redis.UniversalClient // where the streams live (the lock's Redis by default); not closed by Close
	Stream    string                // template; DefaultStream when empty
	MaxLen    int64                 // approximate trim length; 0 = no trimming
	KeyPrefix string                // put before every stream key (redis.key_prefix)
	// Reserved are key prefixes no stream key may start with: the relay's
	// own keys (locks, fence counters, idempotency keys), from the wiring.
	// An event whose stream would be one of them is Permanent, never sent.
	Reserved    []string
	CloudEvents dispatch.CloudEvents // dispatch.RedisStreamBinding: ce- fields
	Log         *slog.Logger         // optional
}

// Sink appends batches to Redis streams. Create with New.
type Sink struct {
	mu     sync.Mutex // one Send at a time; guards the fields below it too
	client redis.UniversalClient
	stream dispatch.Template
	maxLen int64
	prefix string
	names  dispatch.NameRules // what a rendered stream key must obey
	ce     dispatch.CloudEvents
	log    *slog.Logger

	closed  bool
	version serverVersion // read once, from the first INFO reply
}

// errClosed answers a Send after Close.
var errClosed = errors.New("redisstream: sink is closed")

// New validates cfg and returns the sink. It does not contact Redis: a
// server that is down makes Send return Retryable results until it is back.
func New(cfg Config) (*Sink, error) {
	if cfg.Client == nil {
		return nil, errors.New("redisstream: no Redis client")
	}
	if !contextTimeouts(cfg.Client) {
		// Without it a command outlives its context: the trust deadline
		// would not bound what is written.
		return nil, errors.New("redisstream: the Redis client must bound commands by their context (set ContextTimeoutEnabled in its options)")
	}
	if cfg.MaxLen < 0 {
		return nil, fmt.Errorf("redisstream: maxlen must be 0 (no trimming) or positive, got %d", cfg.MaxLen)
	}
	tpl, err := dispatch.ParseTemplate(cmp.Or(cfg.Stream, DefaultStream))
	if err != nil {
		return nil, fmt.Errorf("redisstream: stream: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{client: cfg.Client, stream: tpl, maxLen: cfg.MaxLen, prefix: cfg.KeyPrefix, ce: cfg.CloudEvents,
		names: dispatch.NameRules{Kind: dispatch.RedisStreamKey, Prefix: cfg.KeyPrefix, Reserved: cfg.Reserved}, log: log}, nil
}

// contextTimeouts reports whether c's commands are bounded by their
// context's deadline; true for client types it cannot inspect.
func contextTimeouts(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client: // single and sentinel (failover) clients
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Capabilities implements dispatch.Sink. No batch limit (the poller bounds
// batches in rows and bytes), no dedupe window (Redis 7 has none).
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{Ordering: "per stream (append order)"}
}

// Close marks the sink closed: later Sends fail (Retryable). The client is
// the caller's: Close leaves it open.
func (s *Sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// Send implements dispatch.Sink: one pipeline, one XADD per event, bounded
// by the trust deadline taken at the start.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]dispatch.Result, len(b.Events))
	if len(out) == 0 {
		return out
	}
	if s.closed {
		for i := range out {
			out[i] = dispatch.Result{Outcome: dispatch.Retryable, Err: errClosed}
		}
		return out
	}
	ctx, cancel, ok := b.Window(ctx)
	defer cancel()
	if !ok {
		return out // nothing sent: all NotAttempted
	}
	start := time.Now()

	p := s.pipeline(ctx, b)
	_, _ = p.Exec(ctx) // each command holds its own reply or error
	// A command without a reply when the deadline or ctx has ended was cut
	// by us, not refused by Redis.
	cut := ctx.Err() != nil
	for i, cmd := range p.xadds {
		if cmd != nil {
			p.rounds.Set(i, result(cmd, p.keys[i], b.Events[i].ID, cut))
		}
	}
	out = p.rounds.Results()
	if p.info != nil {
		s.readVersion(p.info)
	}
	p.drops.Log(s.log, "row headers dropped: their names collide with the contract's fields or the payload field, or a stream field cannot carry them")
	s.log.Debug("redis stream batch sent", "batch_size", len(b.Events), "delivered", delivered(out),
		"duration_ms", time.Since(start).Milliseconds())
	return out
}

// batchPipeline is a batch's commands, queued and not yet sent.
type batchPipeline struct {
	redis.Pipeliner
	keys   []string           // stream key per event
	xadds  []*redis.StringCmd // XADD per event; nil when not sent
	rounds *dispatch.Rounds   // per-event results; a refused stream key's is set when queued
	info   *redis.StringCmd   // INFO server, until the version is known
	drops  dispatch.DroppedHeaders
}

// pipeline queues one XADD per event, in order (and INFO server until the
// server's version is known: it rides along, no extra round trip).
func (s *Sink) pipeline(ctx context.Context, b dispatch.Batch) *batchPipeline {
	p := &batchPipeline{Pipeliner: s.client.Pipeline(), keys: make([]string, len(b.Events)),
		xadds: make([]*redis.StringCmd, len(b.Events)), rounds: dispatch.NewRounds(b.Events)}
	if !s.version.known {
		p.info = p.Info(ctx, "server")
	}
	for i, ev := range b.Events {
		if p.rounds.Stopped(i) {
			continue // NotAttempted: an earlier event of its aggregate was refused
		}
		key, err := s.stream.Render(ev, s.names)
		if err != nil {
			p.rounds.Set(i, dispatch.Failed(fmt.Errorf("redisstream: %w: fix the row's aggregate_type/event_type or dispatch.redis_stream.stream, then replay", err)))
			continue
		}
		p.keys[i] = key
		fields, dropped := s.fields(ev, b.Token)
		p.drops.Add(ev.ID, dropped)
		p.xadds[i] = p.XAdd(ctx, &redis.XAddArgs{Stream: p.keys[i], MaxLen: s.maxLen, Approx: true, ID: "*", Values: fields})
	}
	return p
}

// delivered counts the Delivered results, for the batch's log line.
func delivered(out []dispatch.Result) int {
	n := 0
	for _, r := range out {
		if r.Outcome == dispatch.Delivered {
			n++
		}
	}
	return n
}

// fields are an entry's field-value pairs: the contract's headers (with
// the CloudEvents fields when enabled), then the payload JSON as is (or
// the structured CloudEvent). A row header
// named like the payload field is dropped, as Headers drops colliding ones.
func (s *Sink) fields(ev dispatch.Event, token int64) ([]any, []string) {
	m := dispatch.Encode(ev, token, s.ce, dispatch.RedisStreamBinding)
	dropped := m.Dropped
	fields := make([]any, 0, 2*len(m.Headers)+2)
	for _, h := range m.Headers {
		if strings.EqualFold(h.Key, PayloadField) {
			dropped = append(dropped, h.Key)
			continue
		}
		fields = append(fields, h.Key, h.Value)
	}
	return append(fields, PayloadField, m.Body), dropped
}

// result is one XADD's outcome.
func result(cmd *redis.StringCmd, key string, id int64, cut bool) dispatch.Result {
	ref, err := cmd.Result()
	if err == nil {
		return dispatch.Result{Outcome: dispatch.Delivered, Ref: ref}
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return dispatch.Failed(classify(reply, key, id))
	}
	// No reply: the connection failed, or the deadline or ctx ended first.
	r := dispatch.Failed(fmt.Errorf("redisstream: event %d: XADD to stream %q got no reply (is Redis reachable?): %w", id, key, err))
	r.Cut = cut
	return r
}

// classify turns Redis' error reply to an XADD into the sink's advice.
// Permanent only for replies that say the command itself is malformed
// (retrying the same command cannot succeed); everything else an operator
// or time can fix, so it is retried.
func classify(reply redis.Error, key string, id int64) error {
	msg := reply.Error()
	code, _, _ := strings.Cut(msg, " ")
	switch {
	case code == "WRONGTYPE":
		return &dispatch.Error{Err: fmt.Errorf("redisstream: event %d: key %q holds a value that is not a stream (WRONGTYPE): rename or delete that key, or change the stream template: %w", id, key, reply)}
	case code == "OOM":
		return &dispatch.Error{Err: fmt.Errorf("redisstream: event %d: XADD to stream %q refused, Redis is out of memory (OOM): raise maxmemory or lower dispatch.redis_stream.maxlen: %w", id, key, reply)}
	case code == "READONLY":
		return &dispatch.Error{Err: fmt.Errorf("redisstream: event %d: XADD to stream %q reached a read-only replica (READONLY): point the sink at the primary: %w", id, key, reply)}
	case code == "NOPERM" || code == "NOAUTH" || code == "WRONGPASS":
		return &dispatch.Error{Err: fmt.Errorf("redisstream: event %d: XADD to stream %q not permitted (%s): grant the user +xadd on the stream keys: %w", id, key, code, reply)}
	case malformed(msg):
		return &dispatch.Error{Err: fmt.Errorf("redisstream: event %d: XADD to stream %q rejected as malformed (retrying cannot help): %w", id, key, reply), Permanent: true}
	default: // LOADING, BUSY, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, NOREPLICAS, ...
		return &dispatch.Error{Err: fmt.Errorf("redisstream: event %d: XADD to stream %q failed: %w", id, key, reply)}
	}
}

// malformedReplies are the error replies of a command that cannot succeed
// as built, whatever the server's state.
var malformedReplies = []string{
	"ERR syntax error",
	"ERR wrong number of arguments",
	"ERR value is not an integer",
	"ERR Invalid stream ID",
}

func malformed(msg string) bool {
	for _, m := range malformedReplies {
		if strings.HasPrefix(msg, m) {
			return true
		}
	}
	return false
}

// serverVersion is the Redis server's version, read once.
type serverVersion struct {
	known        bool
	major, minor int
	text         string
}

// idmp reports whether the server has XADD IDMP (Redis 8.6 and later).
func (v serverVersion) idmp() bool {
	return v.major > 8 || (v.major == 8 && v.minor >= 6)
}

// readVersion takes the server's version from an INFO reply; a refused
// INFO (renamed, or denied by an ACL) is not asked again.
func (s *Sink) readVersion(info *redis.StringCmd) {
	text, err := info.Result()
	var reply redis.Error
	switch {
	case err == nil:
		s.version = parseVersion(text)
	case errors.As(err, &reply):
		s.version = serverVersion{known: true, text: "unknown"}
		s.log.Info("redis stream sink: INFO server refused; cannot tell whether XADD IDMP (Redis 8.6+) is available", "error", err)
		return
	default:
		return // no reply: ask again with the next batch
	}
	if s.version.idmp() {
		s.log.Info("redis stream sink: the server has XADD IDMP (Redis 8.6+); outboxd does not use it: consumers dedupe on the id field",
			"redis_version", s.version.text)
		return
	}
	s.log.Info("redis stream sink: no server-side dedupe (XADD IDMP needs Redis 8.6+): consumers dedupe on the id field",
		"redis_version", s.version.text)
}

// parseVersion reads redis_version from INFO server text.
func parseVersion(info string) serverVersion {
	v := serverVersion{known: true, text: "unknown"}
	for line := range strings.Lines(info) {
		val, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !ok {
			continue
		}
		v.text = val
		parts := strings.SplitN(val, ".", 3)
		v.major, _ = strconv.Atoi(parts[0])
		if len(parts) > 1 {
			v.minor, _ = strconv.Atoi(parts[1])
		}
		break
	}
	return v
}
