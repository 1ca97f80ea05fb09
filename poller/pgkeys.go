package poller

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxd/outboxd/store"
)

// The idempotency keys in Postgres (idempotency.store: postgres; Deps.Redis
// nil): the same claims, takeovers and delivered marks as the Lua scripts
// write in Redis, in outboxd's own table (store.ClaimKeys,
// store.TakeOverKeys, store.Settle). The marks and releases ride the
// batch's fenced write of its outcome (store.CompleteSettled), so a batch
// costs one statement more than the bare protocol, the claim, and no
// round trip to another service.

// errClaimedMeanwhile: another writer claimed the key while the claim ran.
// The row is left for a later batch, as a key changed under a takeover is.
var errClaimedMeanwhile = errors.New("claimed by another writer meanwhile")

// claims claims the keys of items[idx] (names, their Redis keys) for
// value, and answers per key as claim.lua does (claimReply reads it).
func (p *Poller) claims(ctx context.Context, items []item, idx []int, names []string, value, ttl string) ([]any, error) {
	if p.rdb != nil {
		return p.evalClaims(ctx, names, value, ttl)
	}
	if len(idx) == 0 {
		return nil, nil
	}
	got, err := p.store.ClaimKeys(ctx, idsOf(items, idx), value, p.cfg.ClaimTTL)
	if err != nil {
		return nil, fmt.Errorf("poller: claim idempotency keys: %w", err)
	}
	out := make([]any, len(got))
	for j, g := range got {
		switch {
		case g.Ours:
			out[j] = nil
		case g.Found != "":
			out[j] = g.Found
		default:
			out[j] = errClaimedMeanwhile
		}
	}
	return out, nil
}

// pgTakeOver is takeOver on Postgres: one statement for every key.
func (p *Poller) pgTakeOver(ctx context.Context, items []item, idx []int, previous []string, value string) error {
	marks := make([]string, len(idx))
	for j, i := range idx {
		marks[j] = items[i].mark
	}
	got, err := p.store.TakeOverKeys(ctx, idsOf(items, idx), previous, marks, value, p.cfg.ClaimTTL)
	if err != nil {
		return fmt.Errorf("poller: take over claims: %w", err)
	}
	if len(got) != len(idx) {
		return fmt.Errorf("poller: take over claims: %d answers for %d keys", len(got), len(idx))
	}
	taken := 0
	for j, i := range idx {
		if tookOver(items, i, got[j], previous[j]) {
			taken++
		}
	}
	p.reportTakeovers(taken)
	return nil
}

// complete writes the batch's outcome; with the keys in Postgres, the
// keys' end of the batch (keyWrites' rules: a sent row's key gets its
// mark, a pending or failed row's claim is dropped) goes in the same
// statement.
func (p *Poller) complete(ctx context.Context, fence store.Fence, o store.Outcomes, items []item, ours string) (store.Completed, error) {
	if p.rdb != nil {
		return p.store.Complete(ctx, fence, o)
	}
	k := store.Settle{Claim: ours, MarkTTL: DeliveredTTL}
	for _, it := range items {
		switch it.outcome {
		case sent:
			k.MarkIDs, k.Marks = append(k.MarkIDs, it.row.ID), append(k.Marks, it.mark)
		case pending, failed:
			k.ReleaseIDs = append(k.ReleaseIDs, it.row.ID)
		}
	}
	return p.store.CompleteSettled(ctx, fence, o, k)
}

// idsOf is the ids of items[idx].
func idsOf(items []item, idx []int) []int64 {
	ids := make([]int64, len(idx))
	for j, i := range idx {
		ids[j] = items[i].row.ID
	}
	return ids
}
