package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/store"
)

// pauseCmd and resumeCmd pause and resume a destination (or --all): a
// fenced write under lock:reconciliation that every leader reads each
// second (docs/operations.md, "Pause and resume").
func pauseCmd(g *globals, stdout io.Writer) *cobra.Command  { return switchCmd(g, stdout, true) }
func resumeCmd(g *globals, stdout io.Writer) *cobra.Command { return switchCmd(g, stdout, false) }

func switchCmd(g *globals, stdout io.Writer, pause bool) *cobra.Command {
	var all bool
	var lockWait time.Duration
	verb, short := "resume", "Resume a paused destination (or --all): its pending events flow again, in order"
	if pause {
		verb, short = "pause", "Pause a destination (or --all): its events stay pending, charged no attempt, until resume"
	}
	cmd := &cobra.Command{
		Use:   verb + " DESTINATION|--all [--lock-wait D]",
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case all && len(args) > 0, !all && len(args) != 1:
				return usageError{fmt.Errorf("%s takes one DESTINATION or --all", verb)}
			case lockWait <= 0:
				return usageError{fmt.Errorf("--lock-wait: want a positive duration, got %s", lockWait)}
			}
			return g.withReconciler(stdout, func(s *session, rec *reconcile.Reconciler) error {
				var known []string
				for _, d := range s.cfg.Destinations() {
					known = append(known, d.Name)
				}
				names := known
				if !all {
					if !slices.Contains(known, args[0]) {
						return usageError{fmt.Errorf("unknown destination %q (have %s)", args[0], strings.Join(known, ", "))}
					}
					names = args
				}
				var n int64
				var err error
				if pause {
					n, err = rec.Pause(s.ctx, names, lockWait)
				} else {
					n, err = rec.Resume(s.ctx, names, all, lockWait)
				}
				var held *lock.HolderError
				switch {
				case errors.As(err, &held):
					return lockHeld(held, lockWait, "nothing changed")
				case errors.Is(err, store.ErrStaleFence):
					return fmt.Errorf("%s was taken over by a newer holder, whose fence refused the write; nothing changed: run it again: %w", keys.ReconcileLock, err)
				case err != nil:
					return err
				}
				s.log.Info("destinations "+verb+"d", "destinations", strings.Join(names, ","), "changed", n)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "every configured destination ("+verb+" --all)")
	cmd.Flags().DurationVar(&lockWait, "lock-wait", reconcile.DefaultReplayLockWait, "how long to wait for lock:reconciliation while a reconciliation holds it")
	return cmd
}

// lockHeld says that lock:reconciliation stayed held past --lock-wait, and
// what that left undone.
func lockHeld(held *lock.HolderError, lockWait time.Duration, undone string) error {
	return fmt.Errorf("%s is held by %s for %s more (a reconciliation is running); %s: try again later or with a longer --lock-wait (waited %s)",
		keys.ReconcileLock, held.Holder(), held.TTL.Round(time.Second), undone, lockWait)
}
