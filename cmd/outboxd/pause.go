package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/store"
)

// defaultPauseWait is how long pause and resume wait, by default, for the
// leader to take them into effect.
const defaultPauseWait = 10 * time.Second

// pauseCmd and resumeCmd pause and resume a destination (or --all): a
// fenced write under lock:reconciliation, then a wait until the leader has
// taken it into effect (app.AwaitPause) or no replica leads
// (docs/operations.md, "Pause and resume").
func pauseCmd(g *globals, stdout io.Writer) *cobra.Command  { return switchCmd(g, stdout, true) }
func resumeCmd(g *globals, stdout io.Writer) *cobra.Command { return switchCmd(g, stdout, false) }

// switchFlags are pause's and resume's flags.
type switchFlags struct {
	all            bool
	lockWait, wait time.Duration
}

func switchCmd(g *globals, stdout io.Writer, pause bool) *cobra.Command {
	var fl switchFlags
	var via viaFlags
	verb, short := "resume", "Resume a paused destination (or --all): its pending events flow again, in order; returns once the leader has taken it into effect"
	if pause {
		verb, short = "pause", "Pause a destination (or --all): its events stay pending, charged no attempt, until resume; returns once the leader has taken it into effect"
	}
	cmd := &cobra.Command{
		Use:   verb + " DESTINATION|--all [--lock-wait D] [--wait D] [--via URL]",
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case fl.all && len(args) > 0, !fl.all && len(args) != 1:
				return usageError{fmt.Errorf("%s takes one DESTINATION or --all", verb)}
			case fl.lockWait <= 0:
				return usageError{fmt.Errorf("--lock-wait: want a positive duration, got %s", fl.lockWait)}
			case fl.wait < 0:
				return usageError{fmt.Errorf("--wait: want a duration of 0 or more, got %s", fl.wait)}
			}
			if via.on() {
				return viaSwitch(cmd, &via, stdout, verb, args, fl)
			}
			return g.withReconcilerApp(stdout, func(s *session, a *app.App, rec *reconcile.Reconciler) error {
				return runSwitch(s, a, rec, verb, args, fl)
			})
		},
	}
	via.add(cmd)
	cmd.Flags().BoolVar(&fl.all, "all", false, "every configured destination (resume --all: every paused one)")
	cmd.Flags().DurationVar(&fl.lockWait, "lock-wait", reconcile.DefaultReplayLockWait, "how long to wait for lock:reconciliation while a reconciliation holds it")
	cmd.Flags().DurationVar(&fl.wait, "wait", defaultPauseWait, "how long to wait for the leader to take it into effect (0: return once written)")
	return cmd
}

// runSwitch writes the pause or resume and waits for it to take effect.
func runSwitch(s *session, a *app.App, rec *reconcile.Reconciler, verb string, args []string, fl switchFlags) error {
	var known []string
	for _, d := range s.cfg.Destinations() {
		known = append(known, d.Name)
	}
	names := known
	if !fl.all {
		if !slices.Contains(known, args[0]) {
			return usageError{fmt.Errorf("unknown destination %q (have %s)", args[0], strings.Join(known, ", "))}
		}
		names = args
	}
	var sw store.Switched
	var err error
	if verb == "pause" {
		sw, err = rec.Pause(s.ctx, names, fl.lockWait)
	} else {
		sw, err = rec.Resume(s.ctx, names, fl.all, fl.lockWait)
		if fl.all {
			names = sw.Names // every paused one, configured here or not
		}
	}
	var held *lock.HolderError
	switch {
	case errors.As(err, &held):
		return lockHeld(held, fl.lockWait, "nothing changed")
	case errors.Is(err, store.ErrStaleFence):
		return fmt.Errorf("%s was taken over by a newer holder, whose fence refused the write; nothing changed: run it again: %w", keys.ReconcileLock, err)
	case err != nil:
		return err
	}
	written := []any{"destinations", strings.Join(names, ","), "changed", len(sw.Names), verb + "d", strings.Join(sw.Names, ","), "generation", sw.Generation}
	if fl.wait == 0 {
		s.log.Info("destinations "+verb+"d", append(written, "in_effect", "not awaited (--wait 0): the leader reads it within a second")...)
		return nil
	}
	eff, err := a.AwaitPause(s.ctx, sw.Generation, fl.wait)
	switch {
	case errors.Is(err, app.ErrPauseNotApplied):
		return fmt.Errorf("%s of %s is written but %w; it takes effect when the leader next reads the paused destinations: see `outboxd status`",
			verb, strings.Join(names, ","), err)
	case err != nil:
		return fmt.Errorf("%s of %s is written; waiting for the leader to take it into effect: %w", verb, strings.Join(names, ","), err)
	case eff.NoLeader:
		written = append(written, "in_effect", "no replica leads: the next leader reads it before its first send")
	default:
		written = append(written, "in_effect", "acknowledged by the leader "+eff.Leader)
	}
	s.log.Info("destinations "+verb+"d", written...)
	return nil
}

// lockHeld says that lock:reconciliation stayed held past --lock-wait, and
// what that left undone.
func lockHeld(held *lock.HolderError, lockWait time.Duration, undone string) error {
	return fmt.Errorf("%s is held by %s for %s more (a reconciliation is running); %s: try again later or with a longer --lock-wait (waited %s)",
		keys.ReconcileLock, held.Holder(), held.TTL.Round(time.Second), undone, lockWait)
}

// viaSwitch sends a pause or resume to the admin API and logs what it
// changed as the command does ("destinations paused" or "... resumed").
func viaSwitch(cmd *cobra.Command, via *viaFlags, stdout io.Writer, verb string, args []string, fl switchFlags) error {
	p := admin.Params{admin.LockWait: fl.lockWait.String()}
	if fl.all {
		p[admin.All] = "true"
	} else {
		p["destinations"] = args[0]
	}
	if fl.wait > 0 {
		p["wait"] = fl.wait.String()
	}
	var res admin.PauseResult
	if err := via.post(cmd.Context(), "/admin/"+verb, p, &res); err != nil {
		return err
	}
	names := strings.Join(args, ",")
	if fl.all {
		names = "all"
	}
	written := []any{"destinations", names, "changed", len(res.Changed), verb + "d", strings.Join(res.Changed, ","), "generation", res.Generation}
	switch {
	case !res.Awaited:
		written = append(written, "in_effect", "not awaited (--wait 0): the leader reads it within a second")
	case res.Effect.NoLeader:
		written = append(written, "in_effect", "no replica leads: the next leader reads it before its first send")
	default:
		written = append(written, "in_effect", "acknowledged by the leader "+res.Effect.Leader)
	}
	slog.New(slog.NewJSONHandler(stdout, nil)).Info("destinations "+verb+"d", written...)
	return nil
}
