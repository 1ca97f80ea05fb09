package poller

import (
	"bytes"
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
	idx, names := p.claimable(items)
	found, err := p.claims(ctx, items, idx, names, value, ttl)
	if err != nil {
		return err
	}
	var t takeovers
	now := time.Now()
	for j, i := range idx {
		if err := p.sortClaim(items, i, found[j], c, value, now, &t); err != nil {
			return err
		}
	}
	p.reportMarks(items, &t, c.token)
	if len(t.idx) == 0 {
		return nil
	}
	return p.takeOver(ctx, items, t.idx, t.previous, value, ttl)
}

// takeovers are the rows whose keys claimKeys swaps for our claim, and
// what it found on them.
type takeovers struct {
	idx       []int    // into items
	previous  []string // the value found on each key
	stale     []int    // of idx: the marks of other rows
	staleSeen string   // the first of those marks
	unnamed   int      // of idx: marks of the earlier format
}

func (t *takeovers) add(i int, found string) {
	t.idx, t.previous = append(t.idx, i), append(t.previous, found)
}

// claimable sets the idempotency key and delivered mark of every row that
// is not poisoned, and returns those rows' indexes into items and their
// keys, in the same order.
//
// The batch's keys and marks are written into one string, which each
// row's key and mark are slices of: one allocation per batch for them, not
// two per row. Rows written with the same headers as the row before
// share that row's headers digest (keys.HeadersDigest): most rows carry
// the same headers, often none.
func (p *Poller) claimable(items []item) (idx []int, names []string) {
	idx, names = make([]int, 0, len(items)), make([]string, 0, len(items))
	type span struct{ key, mark int } // ends in buf
	ends := make([]span, len(items))
	var buf strings.Builder
	buf.Grow(len(items) * claimNamesPerRow)
	var headers []byte // of the last row whose headers digest was taken
	var digest [32]byte
	for i := range items {
		if items[i].outcome == poisoned {
			continue
		}
		r := &items[i].row
		if len(idx) == 0 || !bytes.Equal(r.Headers, headers) {
			headers, digest = r.Headers, keys.HeadersDigest(r.Headers)
		}
		var name [160]byte // a key and a mark under a usual prefix; a longer one grows it
		b := p.keys.AppendIdempotency(name[:0], r.ID)
		ends[i].key = buf.Len() + len(b)
		b = keys.AppendMark(b, r.CreatedAt, r.AggregateType, r.AggregateID, r.EventType, keys.ContentWith(r.Payload, digest))
		buf.Write(b)
		ends[i].mark = buf.Len()
		idx = append(idx, i)
	}
	all, start := buf.String(), 0
	for _, i := range idx {
		items[i].key, items[i].mark = all[start:ends[i].key], all[ends[i].key:ends[i].mark]
		start = ends[i].mark
		names = append(names, items[i].key)
	}
	return idx, names
}

// claimNamesPerRow is the room claimable's buffer starts with per row: a
// key under a short prefix and a mark (41 bytes and "1:"); append grows it
// for longer ones.
const claimNamesPerRow = 112

// evalClaims runs claim.lua on names: each absent key gets value for ttl
// milliseconds; the answer holds what each key held, in names order. An
// error means Redis failed the batch.
func (p *Poller) evalClaims(ctx context.Context, names []string, value, ttl string) ([]any, error) {
	found, err := p.evalPerSlot(ctx, claimScript, names, func(lo, hi int) []any { return []any{value, ttl} })
	if err == nil && len(found) != len(names) {
		err = fmt.Errorf("claim.lua answered %d values for %d keys", len(found), len(names))
	}
	if err != nil {
		return nil, fmt.Errorf("poller: claim idempotency keys: %w", err)
	}
	return found, nil
}

// sortClaim sets the outcome of items[i] from reply, claim.lua's answer
// for its key, or adds the row to t when its key is to be taken over. An
// error means Redis failed the batch.
func (p *Poller) sortClaim(items []item, i int, reply any, c claimValue, value string, now time.Time, t *takeovers) error {
	v, pttl, err := claimReply(reply)
	switch {
	case errors.Is(err, redis.Nil), err == nil && v == value:
		// Ours to send. Our own value: the script ran twice on that key
		// (a node answered NOSCRIPT and the pipeline was sent again).
		items[i].outcome = pending
		return nil
	case err != nil && rowError(err):
		items[i].outcome, items[i].err = refused, fmt.Errorf("idempotency key %s: %w", p.keys.Idempotency(items[i].row.ID), err)
		return nil
	case errors.Is(err, errClaimedMeanwhile):
		items[i].outcome = foreign
		return nil
	case err != nil:
		return fmt.Errorf("poller: claim %s: %w", p.keys.Idempotency(items[i].row.ID), err)
	}
	if !sortMark(items, i, v, pttl, now, t) {
		p.sortHeldClaim(items, i, v, c, t)
	}
	return nil
}

// sortMark judges v as a delivered mark on items[i]'s key (keys.Judge):
// this row's mark is a duplicate; another row's mark, or one that does not
// name the payload, is taken over. It reports false when v is no
// delivered mark.
func sortMark(items []item, i int, v string, pttl time.Duration, now time.Time, t *takeovers) bool {
	switch keys.Judge(v, pttl, keys.MarkFingerprint(items[i].mark), items[i].row.CreatedAt, now) {
	case keys.ThisRow:
		items[i].outcome = duplicate
	case keys.OtherRow:
		if len(t.stale) == 0 {
			t.staleSeen = v
		}
		t.add(i, v)
		t.stale = append(t.stale, i)
	case keys.Unnamed:
		t.add(i, v)
		t.unnamed++
	default:
		return false
	}
	return true
}

// sortHeldClaim judges v, found on items[i]'s key, as another runner's
// claim: one c supersedes is taken over, any other is left to its holder,
// and a value outboxd did not write refuses the row.
func (p *Poller) sortHeldClaim(items []item, i int, v string, c claimValue, t *takeovers) {
	other, ok := parseClaimValue(v)
	switch {
	case !ok:
		items[i].outcome = refused
		items[i].err = fmt.Errorf("idempotency key %s holds %q, which outboxd did not write: delete it to let the event go", p.keys.Idempotency(items[i].row.ID), dispatch.Clip(v, 64))
	case c.supersedes(other):
		t.add(i, v)
	default:
		items[i].outcome = foreign
	}
}

// reportMarks counts and logs the delivered marks claimKeys found that it
// does not trust: other rows' marks (see rewound) and marks of the earlier
// format.
func (p *Poller) reportMarks(items []item, t *takeovers, token int64) {
	if len(t.stale) > 0 {
		p.rewound(items, t.stale, t.staleSeen, token)
	}
	if t.unnamed > 0 {
		p.log.Info("delivered marks of an earlier version that do not name the payload: not trusted, the rows are sent again",
			"unnamed_marks", t.unnamed, "fencing_token", token)
	}
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
	if p.rdb == nil {
		return p.pgTakeOver(ctx, items, idx, previous, value)
	}
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
		case tookOver(items, i, n, previous[j]):
			taken++
		}
	}
	p.reportTakeovers(taken)
	return nil
}

// tookOver sets items[i]'s outcome from n, takeover.lua's answer for its
// key (previous, the value it replaced), and reports whether a claim was
// taken over.
func tookOver(items []item, i int, n int, previous string) bool {
	switch n {
	case 1:
		items[i].outcome = pending
		_, ok := parseClaimValue(previous)
		return ok
	case 2:
		items[i].outcome = duplicate // its holder finished meanwhile
	default:
		items[i].outcome = foreign // changed under us: look again next batch
	}
	return false
}

// reportTakeovers counts and logs the claims of earlier holders taken over.
func (p *Poller) reportTakeovers(taken int) {
	if taken > 0 {
		p.m.ClaimsTakenOver.Add(float64(taken))
		p.log.Info("took over claims of an earlier holder", "claims", taken)
	}
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
