package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/reconcile"
)

// resendHelp are resend's flags (the filters as `dead list` names them,
// over delivered rows).
var resendHelp = map[string]string{
	deadquery.Aggregate:    "only this aggregate: TYPE/ID, or TYPE for every aggregate of that type",
	deadquery.EventType:    "only this event type; a glob: * any run of characters, ? one, \\ makes the next literal",
	deadquery.Since:        "created (or, with --time-field dispatched_at, delivered) at or after this: RFC 3339 or a duration ago (90m, 24h, 7d)",
	deadquery.Until:        "created (or delivered) before this: RFC 3339 or a duration ago, as --since",
	deadquery.Error:        "an entry of the row's attempt history contains this text (case-insensitive)",
	admin.IDFrom:           "only ids at least this",
	admin.IDTo:             "only ids at most this",
	admin.TimeField:        "what --since and --until bound: created_at or dispatched_at",
	admin.Limit:            "resend at most this many rows (the oldest first; after --destination)",
	admin.DestinationParam: "only the rows the configured routes send to this destination now (dispatch.destinations, dispatch.routes); without routing the one destination is default",
}

func resendCmd(g *globals, stdout io.Writer) *cobra.Command {
	var via viaFlags
	var ids []int64
	var all, dryRun bool
	var lockWait time.Duration
	cmd := &cobra.Command{
		Use:   "resend [--id N ...] [filters] [--destination NAME] [--all] [--dry-run] [--limit N] [--via URL]",
		Short: "Send delivered events again as new pending rows behind their aggregates' newer ones, marked as redeliveries (Outbox-Resent-From), fenced under lock:reconciliation",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := paramsOf(cmd.Flags(), admin.ResendParams)
			req, err := p.Resend(time.Now())
			var pe *deadquery.ParamError
			if errors.As(err, &pe) {
				return usageError{fmt.Errorf("--%s: %w", pe.Name, pe.Err)}
			}
			if err != nil {
				return err
			}
			if !req.All && req.Filter.IsZero() {
				return usageError{errors.New("--all: without an --id or a filter, resend sends every delivered event again; say --all to mean it")}
			}
			var res admin.ResendResult
			if via.on() {
				err = via.post(cmd.Context(), "/admin/resend", p, &res)
			} else {
				err = g.withReconcilerApp(stdout, func(s *session, a *app.App, rec *reconcile.Reconciler) error {
					table, err := app.Routes(s.cfg)
					if err != nil {
						return err
					}
					svc := admin.New(admin.Deps{Store: a.Store.Ops(), Reconciler: rec, Log: s.log, Routes: table})
					res, err = svc.Resend(s.ctx, admin.Caller{Name: "cli"}, req)
					return err
				})
			}
			if errors.Is(err, admin.ErrInvalid) {
				return usageError{err}
			}
			printResend(stdout, res)
			return err
		},
	}
	cmd.Flags().Int64SliceVar(&ids, admin.ID, nil, "only these outbox ids (repeatable or comma-separated)")
	cmd.Flags().BoolVar(&all, admin.All, false, "with no --id and no filter: resend every delivered event")
	cmd.Flags().BoolVar(&dryRun, admin.DryRun, false, "print how many rows would be resent and change nothing (takes no lock)")
	cmd.Flags().DurationVar(&lockWait, admin.LockWait, reconcile.DefaultReplayLockWait, "how long to wait for lock:reconciliation while a reconciliation holds it")
	for _, n := range []string{deadquery.Aggregate, deadquery.EventType, deadquery.Since, deadquery.Until, deadquery.Error, admin.IDFrom, admin.IDTo, admin.TimeField, admin.Limit, admin.DestinationParam} {
		cmd.Flags().String(n, "", resendHelp[n])
	}
	via.add(cmd)
	return cmd
}

// printResend prints what a resend did (or would do), and the rows it
// could not resend because they are gone.
func printResend(stdout io.Writer, res admin.ResendResult) {
	for _, c := range res.Copies {
		fmt.Fprintf(stdout, "resent %d as %d\n", c.ID, c.Copy)
	}
	if len(res.Gone) > 0 {
		s := make([]string, len(res.Gone))
		for i, id := range res.Gone {
			s[i] = fmt.Sprint(id)
		}
		fmt.Fprintf(stdout, "gone (purged past reconcile.retention, discarded or never written): %s\n", strings.Join(s, ","))
	}
	if !res.GoneBefore.IsZero() {
		fmt.Fprintf(stdout, "gone: rows delivered before %s are past reconcile.retention and were purged\n", res.GoneBefore.Format(time.RFC3339))
	}
	if res.DryRun {
		fmt.Fprintf(stdout, "would resend %d delivered events (dry run: nothing changed)\n", res.Count)
		return
	}
	fmt.Fprintf(stdout, "resent %d delivered events\n", res.Count)
}
