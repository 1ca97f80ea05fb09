package poller

import (
	"context"
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scripts/claim.lua
	claimSrc    string
	claimScript = redis.NewScript(claimSrc)
	//go:embed scripts/finish.lua
	finishSrc    string
	finishScript = redis.NewScript(finishSrc)
	//go:embed scripts/takeover.lua
	takeoverSrc    string
	takeoverScript = redis.NewScript(takeoverSrc)
)

// evalPerSlot runs a per-key batch script over names (Redis keys), args(lo, hi) giving
// the arguments for names[lo:hi]: one call for all of them, or one call per
// key (pipelined) in Redis Cluster, whose scripts cannot span hash slots,
// and behind a proxy that refuses a script over several slots (CROSSSLOT:
// the script did not run). It returns the scripts' array replies joined,
// one element per key. If Redis lost its script cache (a restart) the
// scripts are sent whole and run again: finish.lua is idempotent, and a
// second claim.lua on a key finds our own claim, which claim reads as ours.
func (p *Poller) evalPerSlot(ctx context.Context, s *redis.Script, names []string, args func(lo, hi int) []any) ([]any, error) {
	if len(names) == 0 {
		return nil, nil
	}
	step := len(names)
	if _, cluster := p.rdb.(*redis.ClusterClient); cluster {
		step = 1
	}
	exec := func(sha bool) ([]*redis.Cmd, error) {
		pipe := p.rdb.Pipeline()
		var cmds []*redis.Cmd
		for lo := 0; lo < len(names); lo += step {
			hi := lo + step
			if sha {
				cmds = append(cmds, s.EvalSha(ctx, pipe, names[lo:hi], args(lo, hi)...))
			} else {
				cmds = append(cmds, s.Eval(ctx, pipe, names[lo:hi], args(lo, hi)...))
			}
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := exec(true)
	if redis.HasErrorPrefix(err, "CROSSSLOT") && step > 1 {
		step = 1
		cmds, err = exec(true)
	}
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmds, err = exec(false)
	}
	if err != nil {
		return nil, err
	}
	var out []any
	for _, c := range cmds {
		switch v := c.Val().(type) {
		case []any:
			out = append(out, v...)
		default: // a count
			out = append(out, v)
		}
	}
	return out, nil
}
