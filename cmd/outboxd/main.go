// Command outboxd relays transactional-outbox rows from Postgres to a sink,
// with one active replica at a time. See README.md.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/deadquery"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/internal/buildinfo"
	"github.com/outboxd/outboxd/internal/gcpolicy"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/reconcile"
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
	err = app.PoolerRefusal(err)
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
	root.AddCommand(runCmd(g, stdout), migrateCmd(g, stdout), versionCmd(stdout), statusCmd(g, stdout), replayCmd(g, stdout), resendCmd(g, stdout), pauseCmd(g, stdout), resumeCmd(g, stdout), deadCmd(g, stdout), reconcileCmd(g, stdout), configCmd(g, stdout), healthCmd(g, stdout))
	return root
}

// load loads the configuration and checks the sections the command uses
// (all when none is given), so a setting it never reads cannot stop it.
func (g *globals) load(uses ...config.Section) (*config.Config, error) {
	return app.LoadConfig(g.configFile, g.sets, uses...)
}

// session is what a command that works on Postgres or Redis starts with:
// the config, a JSON logger (go-redis' own lines routed into it) and a
// context cancelled by SIGTERM/SIGINT, and by SIGHUP (a closed terminal)
// for every command but `run` (see ignoreHangups).
type session struct {
	cfg  *config.Config
	log  *slog.Logger
	ctx  context.Context
	stop context.CancelFunc
}

// start loads the config (checking the sections the command uses) and
// opens a session logging to w at the configured level.
func (g *globals) start(w io.Writer, uses ...config.Section) (*session, error) {
	return g.open(w, []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}, uses...)
}

// startDaemon is start for `run`: SIGTERM/SIGINT end it (a handover), and
// SIGHUP is logged and ignored (ignoreHangups).
func (g *globals) startDaemon(w io.Writer) (*session, error) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP) // from before the config is loaded, as open's
	s, err := g.open(w, []os.Signal{syscall.SIGTERM, syscall.SIGINT})
	if err != nil {
		signal.Stop(hup)
		return nil, err
	}
	stopIgnoring, stop := ignoreHangups(s.log, hup), s.stop
	s.stop = func() { stopIgnoring(); stop() }
	return s, nil
}

// open loads the config and opens a session whose context the signals
// given cancel. The signals are caught from before the config is loaded:
// one that arrives meanwhile stops the command through its own shutdown,
// not by the signal's default action.
func (g *globals) open(w io.Writer, signals []os.Signal, uses ...config.Section) (*session, error) {
	ctx, stop := signal.NotifyContext(context.Background(), signals...)
	cfg, err := g.load(uses...)
	if err != nil {
		stop()
		return nil, err
	}
	log := app.NewLogger(cfg.Log.Level, cfg.Log.Format, w)
	app.RouteRedisLogs(log)
	return &session{cfg: cfg, log: log, ctx: ctx, stop: stop}, nil
}

// ignoreHangups logs each SIGHUP at INFO and otherwise ignores it, so a
// leader is never ended without a handover by a log rotation's postrotate
// or a closed session: outboxd has no configuration to reload, and SIGTERM
// is how it stops. The returned func stops listening and waits for the
// goroutine; SIGHUP's default (exit) applies again after it. hup is
// notified of SIGHUP already.
func ignoreHangups(log *slog.Logger, hup chan os.Signal) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-hup:
				log.Info("SIGHUP ignored", "reason", "outboxd has no configuration reload; SIGTERM stops it")
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(quit)
		<-done
	}
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
		Short: "Run the relay until SIGTERM/SIGINT (SIGHUP is logged and ignored)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.startDaemon(stdout)
			if err != nil {
				return err
			}
			defer s.stop()
			gc := gcpolicy.Apply(os.Getenv, "/proc/self/cgroup", "/sys/fs/cgroup")
			s.log.Info("go collector", "gogc", gc.GCPercent, "memory_limit_bytes", gc.MemoryLimit, "memory_limit_source", gc.LimitSource)
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
				if r.CarriedOver {
					s.log.Info("migration carried over", "version", r.Version, "from", r.Source)
					return
				}
				s.log.Info("migration applied", "version", r.Version, "source", r.Source, "duration_ms", r.Duration.Milliseconds())
			}, app.MigrateOptions(s.cfg.Postgres)...)
			if errors.Is(err, migrations.ErrSearchPath) {
				return &config.KeyError{Key: "postgres.schema", Err: err}
			}
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
	var via viaFlags
	cmd := &cobra.Command{
		Use:   "status [--json] [--via URL]",
		Short: "Show who holds each lock (owner, TTL left, token), the fence tokens Postgres accepted, and the backlog",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if via.on() {
				return viaStatus(cmd, &via, stdout, asJSON)
			}
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
			printStatus(stdout, st)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (for scripts)")
	via.add(cmd)
	return cmd
}

// viaStatus prints the relay's status from its admin API: the same tables,
// or with asJSON the API's JSON (the relay's own view: held_by_this_replica
// is the relay's).
func viaStatus(cmd *cobra.Command, via *viaFlags, stdout io.Writer, asJSON bool) error {
	b, err := via.get(cmd.Context(), "/admin/status", nil)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, b, true)
	}
	var st app.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("--via: the status: %w", err)
	}
	printStatus(stdout, st)
	return nil
}

// printStatus prints status' tables: the locks, the backlog, the
// destinations and the replicas.
func printStatus(stdout io.Writer, st app.Status) {
	printLocks(stdout, st.LockBackend, st.Locks)
	fmt.Fprintf(stdout, "\npending %d   oldest pending %s   dead %d\n", st.Pending,
		(time.Duration(st.OldestPendingAge * float64(time.Second))).Round(time.Second), st.Dead)
	printDestinations(stdout, st.Destinations)
	printReplicas(stdout, st.Replicas)
}

// printLocks prints status' locks table, then each lock's error under it;
// backend is lock.backend, which issues the tokens ("" from a relay that
// does not say: "lease").
func printLocks(stdout io.Writer, backend string, ls []app.LockStatus) {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "LOCK\tHOLDER (instance)\tOWNER\tTTL LEFT\tTOKEN ISSUED (%s)\tFENCE ACCEPTED (postgres)\n", cmp.Or(backend, "lease"))
	for _, l := range ls {
		holder, owner, ttl := "-", "-", "-"
		if l.Owner != "" {
			holder, owner, ttl = cmp.Or(l.Holder, "?"), l.Owner, (time.Duration(l.TTLMillis) * time.Millisecond).Round(100*time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", l.Name, holder, owner, ttl, l.RedisCounter, l.FenceToken)
	}
	_ = tw.Flush()
	for _, l := range ls {
		if l.Error != "" {
			fmt.Fprintf(stdout, "\n%s: %s\n", l.Name, l.Error)
		}
	}
}

// printDestinations prints status' destinations table: each one's sink,
// settings, circuit and pause.
func printDestinations(stdout io.Writer, ds []app.DestinationStatus) {
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DESTINATION\tSINK\tSETTINGS\tCIRCUIT\tPAUSED")
	for _, d := range ds {
		circuit := d.Circuit
		if !d.CircuitSince.IsZero() {
			circuit += " since " + d.CircuitSince.UTC().Format(time.RFC3339)
		}
		paused := "-"
		if d.Paused {
			paused = "paused since " + d.PausedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Name, d.Sink, d.Key, circuit, paused)
	}
	_ = tw.Flush()
}

// printReplicas prints status' replicas table: each running replica seen
// within app.ReplicaFresh, the leader first.
func printReplicas(stdout io.Writer, rs []store.Replica) {
	fmt.Fprintln(stdout)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA (instance)\tROLE\tHTTP\tVERSION\tSTARTED\tLAST SEEN")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.InstanceID, r.Role, r.HTTPAddr, r.Version,
			r.StartedAt.Format(time.RFC3339), r.LastSeen.Format(time.RFC3339))
	}
	if len(rs) == 0 {
		fmt.Fprintln(tw, "(none running)\t-\t-\t-\t-\t-")
	}
	_ = tw.Flush()
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
	var w deadWriteFlags
	var via viaFlags
	cmd := &cobra.Command{
		Use:   "replay --dead [--id N ...] [filters] [--dry-run] [--lock-wait D] [--via URL]",
		Short: "Requeue dead-lettered events (all, by id, or those the filters of `dead list` select), fenced under lock:reconciliation",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !dead {
				return usageError{errors.New("replay needs --dead (only dead-lettered rows can be replayed)")}
			}
			f, err := w.filter(cmd)
			if err != nil {
				return err
			}
			if via.on() {
				return viaDeadWrite(cmd, &via, stdout, "/admin/replay", "requeued", "would requeue")
			}
			if w.dryRun {
				return deadCount(g, stdout, f, "would requeue")
			}
			// The replay writes under lock:reconciliation (Redis) with its
			// fencing token, in batches of reconcile.batch_size.
			return g.withReconciler(stdout, func(s *session, rec *reconcile.Reconciler) error {
				n, err := rec.Replay(s.ctx, f, w.lockWait, func(done int64) {
					s.log.Info("replay progress", "requeued", done)
				})
				if err != nil {
					return deadWriteError("replay", "requeued", "requeuing", n, w.lockWait, err)
				}
				s.log.Info("replay finished", "requeued", n)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&dead, "dead", false, "requeue dead-lettered rows")
	w.add(cmd, "requeued")
	via.add(cmd)
	return cmd
}

// deadCount prints how many dead rows f selects, after what ("would
// requeue"): Postgres only, no lock; a dry run.
func deadCount(g *globals, stdout io.Writer, f store.DeadFilter, what string) error {
	s, err := g.start(stdout, config.PostgresSection)
	if err != nil {
		return err
	}
	defer s.stop()
	st, err := app.OpenStore(s.ctx, s.cfg.Postgres)
	if err != nil {
		return err
	}
	defer st.Close()
	n, err := st.Ops().CountDead(s.ctx, f)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %d dead-lettered events (dry run: nothing changed)\n", what, n)
	return nil
}

// parseDeadQuery reads the dead-letter filters (and paging) set on cmd; an
// invalid value is a usage error naming its flag.
func parseDeadQuery(cmd *cobra.Command) (deadquery.Query, error) {
	q, err := deadquery.Parse(deadquery.FromFlags(cmd.Flags()), time.Now())
	var pe *deadquery.ParamError
	if errors.As(err, &pe) {
		return q, usageError{fmt.Errorf("--%s: %w", pe.Name, pe.Err)}
	}
	return q, err
}

func deadCmd(g *globals, stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead list|show|discard",
		Short: "Inspect dead-lettered events (outboxd replay --dead requeues them)",
		// Runnable, so that a missing or mistyped subcommand is a usage
		// error (exit 2) rather than help and exit 0.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q: want list, show or discard", args[0], cmd.CommandPath())}
			}
			return usageError{fmt.Errorf("%s needs a command: list, show or discard", cmd.CommandPath())}
		},
	}
	cmd.AddCommand(deadListCmd(g, stdout), deadShowCmd(g, stdout), deadDiscardCmd(g, stdout))
	return cmd
}

// openStore loads the config (its postgres section) and opens the store,
// logging to w; the caller closes both.
func (g *globals) openStore(w io.Writer) (*session, *store.Store, error) {
	s, err := g.start(w, config.PostgresSection)
	if err != nil {
		return nil, nil, err
	}
	st, err := app.OpenStore(s.ctx, s.cfg.Postgres)
	if err != nil {
		s.stop()
		return nil, nil, err
	}
	return s, st, nil
}

func deadListCmd(g *globals, stdout io.Writer) *cobra.Command {
	var asJSON bool
	var via viaFlags
	cmd := &cobra.Command{
		Use:   "list [filters] [--limit N] [--after CURSOR] [--json] [--via URL]",
		Short: "List dead-lettered events, newest first, a page at a time",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := parseDeadQuery(cmd)
			if err != nil {
				return err
			}
			if via.on() {
				return viaDeadList(cmd, &via, stdout, asJSON)
			}
			s, st, err := g.openStore(cmd.ErrOrStderr()) // stdout is the list
			if err != nil {
				return err
			}
			defer s.stop()
			defer st.Close()
			page, err := st.Ops().ListDead(s.ctx, store.DeadQuery{Filter: q.Filter, After: q.After, Limit: q.Limit})
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(stdout).Encode(page)
			}
			printDeadTable(stdout, page)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print the page as one JSON object: {"events": [...], "next": CURSOR}`)
	deadquery.AddFlags(cmd.Flags(), deadquery.All...)
	via.add(cmd)
	return cmd
}

// viaDeadList prints a page of the dead-letter list from the admin API
// (GET /admin/dead with the flags given as its parameters).
func viaDeadList(cmd *cobra.Command, via *viaFlags, stdout io.Writer, asJSON bool) error {
	q := url.Values{}
	for k, v := range paramsOf(cmd.Flags(), deadquery.All) {
		q.Set(k, v)
	}
	b, err := via.get(cmd.Context(), "/admin/dead", q)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, b, false)
	}
	var page store.DeadPage
	if err := json.Unmarshal(b, &page); err != nil {
		return fmt.Errorf("--via: the dead-letter list: %w", err)
	}
	printDeadTable(stdout, page)
	return nil
}

// errorCell is how much of last_error the table shows.
const errorCell = 60

func printDeadTable(w io.Writer, page store.DeadPage) {
	if len(page.Events) == 0 {
		fmt.Fprintln(w, "no dead-lettered events")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAGGREGATE\tEVENT TYPE\tATTEMPTS\tDEAD AT\tLAST ERROR")
	for _, e := range page.Events {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\n", e.ID, cell(e.AggregateType+"/"+e.AggregateID, 40),
			cell(e.EventType, 40), e.Attempts, stamp(e.DeadAt), cell(e.LastError, errorCell))
	}
	_ = tw.Flush()
	if page.Next != "" {
		fmt.Fprintf(w, "\nmore: the same command with --after %s\n", page.Next)
	}
}

// cell makes s one table cell: control characters (tabs, newlines) become
// spaces, and it is cut to n characters.
func cell(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// stamp shows a timestamp in UTC, RFC 3339, or infinity.
func stamp(t pgtype.Timestamptz) string {
	b, _ := t.MarshalJSON()
	return strings.Trim(string(b), `"`)
}

func deadShowCmd(g *globals, stdout io.Writer) *cobra.Command {
	var asJSON bool
	var via viaFlags
	cmd := &cobra.Command{
		Use:   "show [--json] [--via URL] ID",
		Short: "Show one dead-lettered event: payload, headers, attempts, last error, timestamps",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("show takes one outbox id, got %d arguments", len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return usageError{fmt.Errorf("show wants an outbox id (a whole number), got %q", args[0])}
			}
			if via.on() {
				return viaDeadShow(cmd, &via, stdout, id, asJSON)
			}
			s, st, err := g.openStore(cmd.ErrOrStderr()) // stdout is the event
			if err != nil {
				return err
			}
			defer s.stop()
			defer st.Close()
			e, err := st.Ops().ShowDead(s.ctx, id)
			if err != nil {
				return err
			}
			hist, err := st.Ops().History(s.ctx, e.ID, e.CreatedAt)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					store.DeadEvent
					History []store.Attempt `json:"history"`
				}{e, hist})
			}
			printDeadEvent(stdout, e)
			printHistory(stdout, hist)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the event as JSON")
	via.add(cmd)
	return cmd
}

// viaDeadShow prints one dead row with its attempt history from the admin
// API (GET /admin/dead/{id}).
func viaDeadShow(cmd *cobra.Command, via *viaFlags, stdout io.Writer, id int64, asJSON bool) error {
	b, err := via.get(cmd.Context(), "/admin/dead/"+strconv.FormatInt(id, 10), nil)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, b, true)
	}
	var e admin.DeadShown
	if err := json.Unmarshal(b, &e); err != nil {
		return fmt.Errorf("--via: the dead row: %w", err)
	}
	printDeadEvent(stdout, e.DeadEvent)
	printHistory(stdout, e.History)
	return nil
}

func printDeadEvent(w io.Writer, e store.DeadEvent) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"id", strconv.FormatInt(e.ID, 10)},
		{"aggregate", cell(e.AggregateType+"/"+e.AggregateID, 200)},
		{"event type", cell(e.EventType, 200)},
		{"attempts", strconv.Itoa(e.Attempts)},
		{"created at", stamp(e.CreatedAt)},
		{"available at", stamp(e.AvailableAt)},
		{"dead at", stamp(e.DeadAt)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	_ = tw.Flush()
	// last_error in full: it is bounded (store.MaxErrorBytes) and what the
	// operator came for; its own line breaks stay.
	fmt.Fprintf(w, "last error:\n  %s\n", strings.ReplaceAll(e.LastError, "\n", "\n  "))
	for _, j := range []struct {
		name string
		raw  json.RawMessage
	}{{"headers", e.Headers}, {"payload", e.Payload}} {
		var b bytes.Buffer
		if err := json.Indent(&b, j.raw, "  ", "  "); err != nil {
			b.Reset()
			b.Write(j.raw)
		}
		fmt.Fprintf(w, "%s:\n  %s\n", j.name, b.String())
	}
}

// printHistory prints a dead row's last failed attempts, oldest first.
func printHistory(w io.Writer, hist []store.Attempt) {
	fmt.Fprintf(w, "history (last %d failed attempts):\n", store.MaxHistory)
	if len(hist) == 0 {
		fmt.Fprintln(w, "  none recorded")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ATTEMPT\tAT\tKIND\tDURATION\tTOKEN\tEXCERPT")
	for _, a := range hist {
		d := "-"
		if a.DurationMS != nil {
			d = (time.Duration(*a.DurationMS) * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%d\t%s\n", a.Attempt, stamp(a.At), cell(a.Kind, 40), d, a.FencingToken, cell(a.Excerpt, 120))
	}
	_ = tw.Flush()
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
			// The reconciler waits poller.lock_wait for its lock; stdout is the summary.
			return g.withReconciler(cmd.ErrOrStderr(), func(s *session, rec *reconcile.Reconciler) error {
				sum, err := rec.RunOnce(s.ctx, time.Now(), s.cfg.Poller.LockWait)
				var held *lock.HolderError
				if errors.As(err, &held) {
					return fmt.Errorf("%s is held by %s for %s more; try again later", keys.ReconcileLock,
						held.Holder(), held.TTL.Round(time.Second))
				}
				if err != nil {
					return err
				}
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(sum)
			}, config.PollerSection)
		},
	}
	cmd.Flags().BoolVar(&once, "once", false, "run one reconciliation now")
	return cmd
}
