// Command outboxd relays transactional-outbox rows from Postgres to a sink,
// with one active replica at a time. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/buildinfo"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/store"
)

// usageError marks errors that exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "outboxd:", err)
	var ue usageError
	var ke *config.KeyError
	if errors.As(err, &ue) || errors.As(err, &ke) {
		return 2
	}
	return 1
}

type globals struct {
	configFile string
	sets       []string
}

func newRoot(stdout io.Writer) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "outboxd",
		Short:         "Transactional-outbox relay: Postgres outbox rows to a sink, one active replica, fenced writes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.configFile, "config", "", "config file (YAML); env OUTBOXD_<SECTION>_<KEY> and --set override it")
	root.PersistentFlags().StringArrayVar(&g.sets, "set", nil, "override one key, e.g. --set poller.batch_size=1000 (repeatable)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// With Args and RunE set, cobra hands an unknown subcommand to root
	// instead of returning a plain "unknown command" error: a usage error.
	root.Args = cobra.ArbitraryArgs
	root.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.Name())}
		}
		return cmd.Help()
	}
	root.AddCommand(runCmd(g, stdout), migrateCmd(g, stdout), versionCmd(stdout), statusCmd(g, stdout), replayCmd(g, stdout), reconcileCmd(g, stdout), configCmd(g, stdout), healthCmd(g, stdout))
	return root
}

// load loads the configuration and checks the sections the command uses
// (all when none is given), so a setting it never reads cannot stop it.
func (g *globals) load(uses ...config.Section) (*config.Config, error) {
	return app.LoadConfig(g.configFile, g.sets, uses...)
}

// session is what a command that works on Postgres or Redis starts with:
// the config, a JSON logger (go-redis' own lines routed into it) and a
// context cancelled by SIGTERM/SIGINT.
type session struct {
	cfg  *config.Config
	log  *slog.Logger
	ctx  context.Context
	stop context.CancelFunc
}

// start loads the config (checking the sections the command uses) and
// opens a session logging to w at the configured level.
func (g *globals) start(w io.Writer, uses ...config.Section) (*session, error) {
	cfg, err := g.load(uses...)
	if err != nil {
		return nil, err
	}
	log := app.NewLogger(cfg.Log.Level, cfg.Log.Format, w)
	app.RouteRedisLogs(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	return &session{cfg: cfg, log: log, ctx: ctx, stop: stop}, nil
}

// app connects (lazily) the parts the config describes.
func (s *session) app() (*app.App, error) { return app.New(s.ctx, s.cfg, s.log) }

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.Name(), args)}
	}
	return nil
}

func runCmd(g *globals, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "Run the relay until SIGTERM/SIGINT",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.start(stdout)
			if err != nil {
				return err
			}
			defer s.stop()
			a, err := s.app()
			if err != nil {
				return err
			}
			defer a.Close()
			if err := a.Run(s.ctx); err != nil {
				s.log.Error("outboxd failed", "error", err)
				return err
			}
			return nil
		},
	}
}

func migrateCmd(g *globals, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply the embedded schema migrations (safe from several replicas at once)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.start(stdout, config.PostgresSection)
			if err != nil {
				return err
			}
			defer s.stop()
			applied, err := migrations.Up(s.ctx, s.cfg.Postgres.DSN, func(r migrations.Result) {
				s.log.Info("migration applied", "version", r.Version, "source", r.Source, "duration", r.Duration)
			})
			if err != nil {
				return err
			}
			s.log.Info("migrations up to date", "applied", len(applied))
			return nil
		},
	}
}

func versionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print version and commit",
		Args:  noArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			b := buildinfo.Get()
			fmt.Fprintf(stdout, "outboxd %s (commit %s, %s)\n", b.Version, b.Commit, b.GoVersion)
		},
	}
}

func statusCmd(g *globals, stdout io.Writer) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show who holds each lock (owner, TTL left, token), the fence tokens Postgres accepted, and the backlog",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.start(io.Discard, config.PostgresSection, config.RedisSection) // the table is the output
			if err != nil {
				return err
			}
			defer s.stop()
			a, err := s.app()
			if err != nil {
				return err
			}
			defer a.Close()
			qctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
			defer cancel()
			st, err := a.Status(qctx)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LOCK\tHOLDER (owner)\tTTL LEFT\tTOKEN ISSUED (redis)\tFENCE ACCEPTED (postgres)")
			for _, l := range st.Locks {
				holder, ttl := "-", "-"
				if l.Owner != "" {
					holder, ttl = l.Owner, (time.Duration(l.TTLMillis) * time.Millisecond).Round(100*time.Millisecond).String()
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\n", l.Name, holder, ttl, l.RedisCounter, l.FenceToken)
			}
			_ = tw.Flush()
			for _, l := range st.Locks {
				if l.Error != "" {
					fmt.Fprintf(stdout, "\n%s: %s\n", l.Name, l.Error)
				}
			}
			fmt.Fprintf(stdout, "\npending %d   oldest pending %s   dead %d\n", st.Pending,
				(time.Duration(st.OldestPendingAge * float64(time.Second))).Round(time.Second), st.Dead)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (for scripts)")
	return cmd
}

func configCmd(g *globals, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "config",
		Short: "Print the effective configuration (file, env, --set applied) with secrets redacted",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load()
			if err != nil {
				return err
			}
			enc := yaml.NewEncoder(stdout)
			enc.SetIndent(2)
			defer enc.Close()
			return enc.Encode(cfg.Redacted())
		},
	}
}

func replayCmd(g *globals, stdout io.Writer) *cobra.Command {
	var dead bool
	var ids []int64
	var aggregate string
	cmd := &cobra.Command{
		Use:   "replay --dead [--id N ...] [--aggregate TYPE/ID]",
		Short: "Requeue dead-lettered events (all, by id, or one aggregate's)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !dead {
				return usageError{errors.New("replay needs --dead (only dead-lettered rows can be replayed)")}
			}
			var f store.ReplayFilter
			f.IDs = ids
			if aggregate != "" {
				t, id, ok := strings.Cut(aggregate, "/")
				if !ok || t == "" || id == "" {
					return usageError{fmt.Errorf("--aggregate wants TYPE/ID, got %q", aggregate)}
				}
				f.AggregateType, f.AggregateID = t, id
			}
			s, err := g.start(stdout, config.PostgresSection)
			if err != nil {
				return err
			}
			defer s.stop()
			st, err := store.Open(s.ctx, s.cfg.Postgres.DSN)
			if err != nil {
				return err
			}
			defer st.Close()
			n, err := st.ReplayDead(s.ctx, f, 1000, func(done int64) {
				s.log.Info("replay progress", "requeued", done)
			})
			if err != nil {
				return err
			}
			s.log.Info("replay finished", "requeued", n)
			return nil
		},
	}
	cmd.Flags().BoolVar(&dead, "dead", false, "requeue dead-lettered rows")
	cmd.Flags().Int64SliceVar(&ids, "id", nil, "only these outbox ids (repeatable or comma-separated)")
	cmd.Flags().StringVar(&aggregate, "aggregate", "", "only this aggregate, as TYPE/ID")
	return cmd
}

func reconcileCmd(g *globals, stdout io.Writer) *cobra.Command {
	var once bool
	cmd := &cobra.Command{
		Use:   "reconcile --once",
		Short: "Run one reconciliation now (waits up to poller.lock_wait for lock:reconciliation) and print its summary",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !once {
				return usageError{errors.New("reconcile needs --once (scheduled runs happen inside `outboxd run`)")}
			}
			// The reconciler waits poller.lock_wait for its lock.
			s, err := g.start(cmd.ErrOrStderr(), config.PostgresSection, config.RedisSection,
				config.ReconcileSection, config.PollerSection) // stdout is the summary
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
			sum, err := rec.RunOnce(s.ctx, time.Now(), s.cfg.Poller.LockWait)
			var held *lock.HolderError
			if errors.As(err, &held) {
				return fmt.Errorf("%s is held by owner %s for %s more; try again later", keys.ReconcileLock,
					held.Owner, held.TTL.Round(time.Second))
			}
			if err != nil {
				return err
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(sum)
		},
	}
	cmd.Flags().BoolVar(&once, "once", false, "run one reconciliation now")
	return cmd
}
