package poller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
)

// claimValue is the value a runner puts on an idempotency key while it delivers
// the row: "claim:<token>:<owner>:<batch>". The token says whose term the
// delivery belongs to, so a later holder can tell an abandoned claim from a
// live one without waiting for its TTL.
type claimValue struct {
	token int64
	owner string // the lock acquisition's owner value
	batch string // unique per batch within the term
}

func (c claimValue) String() string {
	return "claim:" + strconv.FormatInt(c.token, 10) + ":" + c.owner + ":" + c.batch
}

// parseClaimValue reads a claim value; ok is false for anything else. Claims of
// earlier versions ("claim:<token>:<nonce>") parse with an empty owner.
func parseClaimValue(v string) (c claimValue, ok bool) {
	rest, ok := strings.CutPrefix(v, "claim:")
	if !ok {
		return c, false
	}
	tok, rest, _ := strings.Cut(rest, ":")
	t, err := strconv.ParseInt(tok, 10, 64)
	if err != nil || t <= 0 {
		return c, false
	}
	c.token = t
	if owner, batch, found := strings.Cut(rest, ":"); found {
		c.owner, c.batch = owner, batch
	} else {
		c.batch = rest
	}
	return c, true
}

// supersedes reports whether our claim may take over other at once: other
// was made under an earlier term, whose lease (and so its trust deadline,
// after which its holder starts no send and writes none) ended before ours
// began; or by an earlier batch of our own term, which has finished. A claim
// of a newer term, or of the same token from another owner, is left alone.
func (c claimValue) supersedes(other claimValue) bool {
	return other.token < c.token || (other.token == c.token && other.owner == c.owner && other.batch != c.batch)
}

// claimKeys sets every sendable row's idempotency key to our claim if absent
// (claim.lua, one call per batch; per key in Redis Cluster), and classifies
// the rows by what was there. This row's delivered mark is a duplicate;
// a mark left by an earlier row with the same id (keys.Judge: the ids came
// round again), or one of the earlier format that does not name the
// payload, is never trusted: it is taken over like the claims of an
// earlier holder, at once and by compare-and-set (one more round trip, only
// when there are any), and the row is sent. A crash costs about one lock
// TTL, never claim_ttl. A key Redis cannot use as a string (WRONGTYPE) or
// holding a value outboxd did not write fails that row alone; an outage
// fails the batch.
func (p *Poller) claimKeys(ctx context.Context, items []item, c claimValue) error {
	value := c.String()
	ttl := strconv.FormatInt(p.cfg.ClaimTTL.Milliseconds(), 10)
	var idx []int // items claimed, in names order
	var names []string
	for i := range items {
		if items[i].outcome != poisoned {
			r := items[i].row
			items[i].mark = keys.Mark(r.CreatedAt, r.AggregateType, r.AggregateID, r.EventType, keys.ContentOf(r.Payload, r.Headers))
			items[i].key = p.keys.Idempotency(r.ID)
			idx, names = append(idx, i), append(names, items[i].key)
		}
	}
	found, err := p.evalPerSlot(ctx, claimScript, names, func(lo, hi int) []any { return []any{value, ttl} })
	if err == nil && len(found) != len(names) {
		err = fmt.Errorf("claim.lua answered %d values for %d keys", len(found), len(names))
	}
	if err != nil {
		return fmt.Errorf("poller: claim idempotency keys: %w", err)
	}
	now := time.Now()
	var takeover []int
	var previous []string
	var stale []int      // of takeover: the marks of other rows
	var staleSeen string // the first of those marks
	unnamed := 0         // of takeover: marks of the earlier format
	for j, i := range idx {
		v, pttl, err := claimReply(found[j])
		switch {
		case errors.Is(err, redis.Nil), err == nil && v == value:
			// Ours to send. Our own value: the script ran twice on that key
			// (a node answered NOSCRIPT and the pipeline was sent again).
			items[i].outcome = pending
			continue
		case err != nil && rowError(err):
			items[i].outcome, items[i].err = refused, fmt.Errorf("idempotency key %s: %w", p.keys.Idempotency(items[i].row.ID), err)
			continue
		case err != nil:
			return fmt.Errorf("poller: claim %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		}
		r := items[i].row
		switch keys.Judge(v, pttl, keys.MarkFingerprint(items[i].mark), r.CreatedAt, now) {
		case keys.ThisRow:
			items[i].outcome = duplicate
			continue
		case keys.OtherRow:
			if len(stale) == 0 {
				staleSeen = v
			}
			takeover, previous, stale = append(takeover, i), append(previous, v), append(stale, i)
			continue
		case keys.Unnamed:
			takeover, previous = append(takeover, i), append(previous, v)
			unnamed++
			continue
		}
		other, ok := parseClaimValue(v)
		switch {
		case !ok:
			items[i].outcome = refused
			items[i].err = fmt.Errorf("idempotency key %s holds %q, which outboxd did not write: delete it to let the event go", p.keys.Idempotency(r.ID), dispatch.Clip(v, 64))
		case c.supersedes(other):
			takeover, previous = append(takeover, i), append(previous, v)
		default:
			items[i].outcome = foreign
		}
	}
	if len(stale) > 0 {
		p.rewound(items, stale, staleSeen, c.token)
	}
	if unnamed > 0 {
		p.log.Info("delivered marks of an earlier version that do not name the payload: not trusted, the rows are sent again",
			"unnamed_marks", unnamed, "fencing_token", c.token)
	}
	if len(takeover) == 0 {
		return nil
	}
	return p.takeOver(ctx, items, takeover, previous, value, ttl)
}

// claimReply reads claim.lua's answer for one key: the value found and,
// for a bare "1", its PTTL (-1 otherwise); redis.Nil when the key was ours.
func claimReply(x any) (v string, pttl time.Duration, err error) {
	switch x := x.(type) {
	case nil:
		return "", -1, redis.Nil
	case string:
		return x, -1, nil
	case error:
		return "", -1, x
	case []any:
		if len(x) == 2 {
			s, ok1 := x[0].(string)
			ms, ok2 := x[1].(int64)
			if ok1 && ok2 {
				if ms >= 0 {
					return s, time.Duration(ms) * time.Millisecond, nil
				}
				return s, time.Duration(ms), nil // -1 no TTL, -2 no key
			}
		}
	}
	return "", -1, fmt.Errorf("unexpected reply %T", x)
}

// rewound reports delivered marks found that belong to earlier rows with
// the same ids (stale, indexes into items; seen, the first one's value):
// the ids came round again. Each is counted;
// the first of a term is logged at ERROR, since it means the sequence was
// rewound (TRUNCATE ... RESTART IDENTITY, a restarted sequence, a database
// re-created under the same key prefix, a restore or failover that lost
// rows) and earlier versions would have lost these events.
func (p *Poller) rewound(items []item, stale []int, seen string, token int64) {
	p.m.IdempotencyForeign.Add(float64(len(stale)))
	first := stale[0]
	if old := p.rewindLogged.Load(); old == token || !p.rewindLogged.CompareAndSwap(old, token) {
		p.log.Debug("delivered marks of earlier rows with the same ids, taken over", "foreign_keys", len(stale), "outbox_id", items[first].row.ID)
		return
	}
	attrs := []any{"outbox_id", items[first].row.ID, "fencing_token", token, "foreign_keys", len(stale),
		"row_created_at", items[first].row.CreatedAt, "found", dispatch.Clip(seen, 64)}
	if at, ok := keys.MarkCreatedAt(seen); ok {
		attrs = append(attrs, "found_created_at", at)
	}
	p.log.Error("sequence rewind detected", append(attrs, "detail",
		"idempotency keys of earlier rows with these ids were found; they are not trusted: the rows are sent (logged once per term, counted in outboxd_idempotency_foreign_total)")...)
}

// takeOver swaps what earlier holders or earlier rows left for our claim,
// each only if unchanged (compare-and-set), in one pipelined round trip.
func (p *Poller) takeOver(ctx context.Context, items []item, idx []int, previous []string, value, ttl string) error {
	pipe := p.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(idx))
	for j, i := range idx {
		// EVAL, not EVALSHA: this path is rare, and a pipeline cannot fall back on NOSCRIPT.
		cmds[j] = takeoverScript.Eval(ctx, pipe, []string{items[i].key}, previous[j], value, ttl, items[i].mark)
	}
	if _, err := pipe.Exec(ctx); err != nil && !rowError(err) {
		return fmt.Errorf("poller: take over claims: %w", err)
	}
	taken := 0
	for j, i := range idx {
		n, err := cmds[j].Int()
		switch {
		case err != nil && rowError(err):
			items[i].outcome, items[i].err = refused, fmt.Errorf("idempotency key %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		case err != nil:
			return fmt.Errorf("poller: take over %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		case n == 1:
			items[i].outcome = pending
			if _, ok := parseClaimValue(previous[j]); ok {
				taken++
			}
		case n == 2:
			items[i].outcome = duplicate // its holder finished meanwhile
		default:
			items[i].outcome = foreign // changed under us: look again next batch
		}
	}
	if taken > 0 {
		p.m.ClaimsTakenOver.Add(float64(taken))
		p.log.Info("took over claims of an earlier holder", "claims", taken)
	}
	return nil
}

// rowError: Redis refused one key's command for what the key holds; other
// keys of the pipeline are unaffected. Anything else (I/O, LOADING, OOM) is
// about Redis itself and fails the batch.
func rowError(err error) bool {
	return redis.HasErrorPrefix(err, "WRONGTYPE")
}

// deliver hands what is ours to send to the sink, in id order and in
// chunks of its MaxBatch, and records each row's outcome. An aggregate stops
// at a row it must not pass (a newer holder's claim, a key that failed, a
// failed send): its later rows stay pending, so its order holds. Rows found
