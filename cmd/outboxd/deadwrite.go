package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/store"
)

// deadWriteFlags are the flags of a command that changes dead rows under
// lock:reconciliation (replay, dead discard): --id, the filters of `dead
// list`, --dry-run and --lock-wait.
type deadWriteFlags struct {
	ids      []int64
	dryRun   bool
	lockWait time.Duration
}

// add registers the flags on cmd; past says what becomes of the rows
// ("requeued").
func (w *deadWriteFlags) add(cmd *cobra.Command, past string) {
	cmd.Flags().Int64SliceVar(&w.ids, "id", nil, "only these outbox ids (repeatable or comma-separated)")
	cmd.Flags().BoolVar(&w.dryRun, "dry-run", false, "print how many rows would be "+past+" and change nothing (takes no lock)")
	cmd.Flags().DurationVar(&w.lockWait, "lock-wait", reconcile.DefaultReplayLockWait, "how long to wait for lock:reconciliation while a reconciliation holds it")
	deadquery.AddFlags(cmd.Flags(), deadquery.Filters...)
}

// filter is the rows the flags select; an invalid flag is a usage error
// naming it.
func (w *deadWriteFlags) filter(cmd *cobra.Command) (store.DeadFilter, error) {
	if w.lockWait <= 0 {
		return store.DeadFilter{}, usageError{fmt.Errorf("--lock-wait: want a positive duration, got %s", w.lockWait)}
	}
	q, err := parseDeadQuery(cmd)
	if err != nil {
		return store.DeadFilter{}, err
	}
	f := q.Filter
	f.IDs = w.ids
	return f, nil
}

// withReconciler runs do with a reconciler on the configuration's
// Postgres, Redis and reconcile settings (and the sections more), logging
// to w, closed afterwards.
func (g *globals) withReconciler(w io.Writer, do func(s *session, rec *reconcile.Reconciler) error, more ...config.Section) error {
	return g.withReconcilerApp(w, func(s *session, _ *app.App, rec *reconcile.Reconciler) error { return do(s, rec) }, more...)
}

// withReconcilerApp is withReconciler with the App it was built from.
func (g *globals) withReconcilerApp(w io.Writer, do func(s *session, a *app.App, rec *reconcile.Reconciler) error, more ...config.Section) error {
	s, err := g.start(w, append([]config.Section{config.PostgresSection, config.RedisSection, config.ReconcileSection}, more...)...)
	if err != nil {
		return err
	}
	defer s.stop()
	a, err := s.app()
	if err != nil {
		return err
	}
	defer a.Close()
	rec, err := a.Reconciler()
	if err != nil {
		return err
	}
	return do(s, a, rec)
}

func deadDiscardCmd(g *globals, stdout io.Writer) *cobra.Command {
	var all bool
	var w deadWriteFlags
	var via viaFlags
	cmd := &cobra.Command{
		Use:   "discard [--id N ...] [filters] [--all] [--dry-run] [--lock-wait D] [--via URL]",
		Short: "Delete dead-lettered events (by id, or those the filters of `dead list` select; --all for every one), fenced under lock:reconciliation, printing each",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := w.filter(cmd)
			if err != nil {
				return err
			}
			// A dry run answers for the command as written: without --all
			// it would be refused, so the dry run is too.
			if !all && isZeroFilter(f) {
				return usageError{errors.New("--all: without an --id or a filter, discard deletes every dead-lettered event; say --all to mean it")}
			}
			if via.on() {
				return viaDeadWrite(cmd, &via, stdout, "/admin/discard", "discarded", "would discard")
			}
			if w.dryRun {
				return deadCount(g, stdout, f, "would discard")
			}
			return g.withReconciler(stdout, func(s *session, rec *reconcile.Reconciler) error {
				n, err := rec.Discard(s.ctx, f, w.lockWait, func(rows []store.Discarded) {
					for _, r := range rows {
						fmt.Fprintf(stdout, "discarded %d %s/%s %s\n", r.ID, r.AggregateType, r.AggregateID, r.EventType)
					}
				})
				if err != nil {
					return deadWriteError("discard", "discarded", "discarding", n, w.lockWait, err)
				}
				fmt.Fprintf(stdout, "discarded %d dead-lettered events\n", n)
				s.log.Info("discard finished", "discarded", n)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "with no --id and no filter: discard every dead-lettered event")
	w.add(cmd, "discarded")
	via.add(cmd)
	return cmd
}

// isZeroFilter: f selects every dead row.
func isZeroFilter(f store.DeadFilter) bool {
	return len(f.IDs) == 0 && f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" &&
		f.Since.IsZero() && f.Until.IsZero() && f.Error == ""
}

// deadWriteError explains why a replay or discard (op; its rows "past",
// "doing") stopped after n rows: the lock held elsewhere past lockWait
// (nothing changed), taken over midway, or another failure.
func deadWriteError(op, past, doing string, n int64, lockWait time.Duration, err error) error {
	var held *lock.HolderError
	switch {
	case errors.As(err, &held):
		return fmt.Errorf("%s is held by %s for %s more (a reconciliation is running); nothing was %s: try again later or with a longer --lock-wait (waited %s)",
			keys.ReconcileLock, held.Holder(), held.TTL.Round(time.Second), past, lockWait)
	case errors.Is(err, store.ErrStaleFence):
		return fmt.Errorf("%s stopped after %s %d events: %s was taken over by a newer holder, whose fence refused the %s's next write; the other rows are still dead: run the %s again: %w",
			op, doing, n, keys.ReconcileLock, op, op, err)
	case n > 0:
		return fmt.Errorf("%s stopped after %s %d events; the other rows are still dead: %w", op, doing, n, err)
	}
	return err
}

// viaDeadWrite sends a replay or discard (its flags) to the admin API's
// path and prints its count: past ("requeued") or, for a dry run, would.
func viaDeadWrite(cmd *cobra.Command, via *viaFlags, stdout io.Writer, path, past, would string) error {
	var res admin.DeadWriteResult
	err := via.post(cmd.Context(), path, paramsOf(cmd.Flags(), admin.DeadWriteParams), &res)
	if err != nil {
		return err
	}
	for _, r := range res.Discarded {
		fmt.Fprintf(stdout, "discarded %d %s/%s %s\n", r.ID, r.AggregateType, r.AggregateID, r.EventType)
	}
	if res.DryRun {
		fmt.Fprintf(stdout, "%s %d dead-lettered events (dry run: nothing changed)\n", would, res.Count)
		return nil
	}
	fmt.Fprintf(stdout, "%s %d dead-lettered events\n", past, res.Count)
	return nil
}
