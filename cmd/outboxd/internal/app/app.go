// Package app builds outboxd's parts from a Config and runs them under one
// context: cmd/outboxd only parses flags and calls it.
package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/console"
	"github.com/outboxd/outboxd/cmd/outboxd/internal/httpapi"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/internal/metrics"
	"github.com/outboxd/outboxd/internal/tracing"
	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/reconcile"
	"github.com/outboxd/outboxd/store"
)

// App holds the connections and parts built from a Config.
type App struct {
	Cfg     *config.Config
	Log     *slog.Logger
	Store   *store.Store
	Nodes   []redis.UniversalClient // lock nodes: one, or several in redlock mode; none when nothing lives in Redis (config.UsesRedis)
	KV      redis.UniversalClient   // idempotency keys and circuit states (the first node); nil with idempotency.store postgres
	Locks   lock.Lease
	Metrics *metrics.Metrics

	extra []redis.UniversalClient // a redis_stream sink's own Redis
	// leasePool is the Postgres lease's own pool (lock.backend: postgres).
	leasePool *pgxpool.Pool
	// leaseEtcd is the etcd lease's client (lock.backend: etcd).
	leaseEtcd *clientv3.Client
	tracing   *tracing.Provider // set by Run (startTracing)
	backlog   backlogGate       // spaces out slow backlog counts (backlog.go)
	circ      *circuits         // the destinations' circuit breakers (circuits.go), made with the first sink
}

// New connects lazily: it does not wait for Postgres or Redis to be up.
// With neither the lease nor the idempotency keys in Redis
// (config.UsesRedis) it builds no Redis client at all.
func New(ctx context.Context, cfg *config.Config, log *slog.Logger) (*App, error) {
	var nodes []redis.UniversalClient
	if cfg.UsesRedis() {
		tlsCfg, err := redisTLS(cfg.Redis.TLS)
		if err != nil {
			return nil, err
		}
		nodes = RedisNodes(cfg.Redis, tlsCfg)
	}
	st, err := OpenStore(ctx, cfg.Postgres)
	if err != nil {
		return nil, err
	}
	a := &App{Cfg: cfg, Log: log, Store: st, Metrics: metrics.New(), Nodes: nodes}
	if cfg.Idempotency.Store == config.IdempotencyRedis {
		a.KV = a.Nodes[0]
	}
	if err := a.newLease(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return a, nil
}

// RedisNodes returns one client (single, sentinel, cluster) or one per
// address (redlock). Context deadlines bound every command.
func RedisNodes(c config.Redis, tlsCfg *tls.Config) []redis.UniversalClient {
	opts := func(addrs []string) *redis.UniversalOptions {
		return &redis.UniversalOptions{
			Addrs: addrs, Username: c.Username, Password: c.Password, DB: c.DB,
			MasterName: c.MasterName, ContextTimeoutEnabled: true, TLSConfig: tlsCfg,
			DialTimeout: 2 * time.Second, ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second,
			// Fail fast instead of piling up retries inside a lease.
			MaxRetries: 1,
		}
	}
	switch c.Mode {
	case "redlock":
		nodes := make([]redis.UniversalClient, len(c.Addrs))
		for i, addr := range c.Addrs {
			nodes[i] = redis.NewClient(opts([]string{addr}).Simple())
		}
		return nodes
	case "cluster":
		return []redis.UniversalClient{redis.NewClusterClient(opts(c.Addrs).Cluster())}
	case "sentinel":
		return []redis.UniversalClient{redis.NewFailoverClient(opts(c.Addrs).Failover())}
	default:
		return []redis.UniversalClient{redis.NewClient(opts(c.Addrs).Simple())}
	}
}

// redisTLS builds the client TLS config from redis.tls.*; nil when disabled.
func redisTLS(c config.TLS) (*tls.Config, error) { return tlsConfig("redis.tls", c) }

// tlsConfig builds a client TLS config from the keys under prefix; nil when
// disabled.
func tlsConfig(prefix string, c config.TLS) (*tls.Config, error) {
	if !c.Enabled {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // operator's explicit choice
	if c.CAFile != "" {
		pem, err := config.ReadFile(prefix+".ca_file", c.CAFile, config.LargeFileLimit)
		if err != nil {
			return nil, err
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &config.KeyError{Key: prefix + ".ca_file", Err: errors.New("no PEM certificate found")}
		}
	}
	if c.CertFile != "" {
		cert, err := keyPair(prefix, c)
		if err != nil {
			return nil, err
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}

// keyPair is the client certificate of the TLS setting under prefix, its
// files read by the file rule (config.ReadFile).
func keyPair(prefix string, c config.TLS) (tls.Certificate, error) {
	certPEM, err := config.ReadFile(prefix+".cert_file", c.CertFile, config.LargeFileLimit)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := config.ReadFile(prefix+".key_file", c.KeyFile, config.LargeFileLimit)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, &config.KeyError{Key: prefix + ".cert_file", Err: err}
	}
	return cert, nil
}

// Close closes every connection.
func (a *App) Close() {
	for _, n := range append(a.Nodes, a.extra...) {
		_ = n.Close()
	}
	if a.leasePool != nil {
		a.leasePool.Close()
	}
	if a.leaseEtcd != nil {
		_ = a.leaseEtcd.Close()
	}
	a.Store.Close()
}

// Sink builds the configured sink: the destination "default" alone as
// its sink, or a dispatch.Router over every destination's sink (the
// registry sinks) following dispatch.routes. A broker that is down does not
// fail the start (its sends fail and are retried); the NATS sink waits up
// to a second for its first connection, to learn the stream's duplicate
// window. Close the sink with CloseSink.
func (a *App) Sink() (dispatch.Sink, error) {
	ds := destinations(a.Cfg)
	var built []dispatch.Destination
	closeBuilt := func() {
		for _, b := range built {
			CloseSink(b.Sink)
		}
	}
	for _, d := range ds {
		s, err := a.buildSink(d)
		if err != nil {
			closeBuilt()
			return nil, err
		}
		built = append(built, dispatch.Destination{Name: d.name, Sink: s})
	}
	names := make([]string, len(built))
	for i, b := range built {
		names[i] = b.Name
	}
	a.Metrics.Destinations(names, dispatch.FailureReasons, dispatch.SendOutcomes)
	if len(built) == 1 && built[0].Name == dispatch.DefaultDestination {
		return built[0].Sink, nil // every event goes there: no routing
	}
	rs, err := routes(a.Cfg)
	if err == nil {
		var r *dispatch.Router
		if r, err = dispatch.NewRouter(built, rs); err == nil {
			return r, nil
		}
	}
	closeBuilt()
	return nil, err
}

// buildSink builds d's sink.
func (a *App) buildSink(d destination) (dispatch.Sink, error) {
	k, err := sinkOf(d)
	if err != nil {
		return nil, err
	}
	s, err := k.build(a, d)
	var ke *config.KeyError
	if err != nil && !errors.As(err, &ke) {
		// A sink's constructor fails only for settings that cannot work.
		err = &config.KeyError{Key: d.key(k.section), Err: err}
	}
	if err != nil {
		return nil, err
	}
	// The one place every sink gets its send spans, its send durations
	// and its circuit breaker (outermost: a send it holds back is no send).
	if a.circ == nil {
		a.circ = newCircuits(a)
	}
	// Each outcome's series looked up once here, not once per send.
	send := make(map[string]prometheus.Observer, len(dispatch.SendOutcomes))
	for _, o := range dispatch.SendOutcomes {
		send[o] = a.Metrics.SendDuration.WithLabelValues(d.name, o)
	}
	timed := dispatch.Timed(a.traced(d, s), func(outcome string, took time.Duration) {
		send[outcome].Observe(took.Seconds())
	})
	return a.circ.breaker(d, timed), nil
}

// sinksOf are the destinations' sinks by name: a Router's, or sink
// itself as "default".
func sinksOf(sink dispatch.Sink) map[string]dispatch.Sink {
	out := map[string]dispatch.Sink{}
	if r, ok := sink.(*dispatch.Router); ok {
		for _, d := range r.Destinations() {
			out[d.Name] = d.Sink
		}
		return out
	}
	out[dispatch.DefaultDestination] = sink
	return out
}

// CloseSink releases what a sink holds (broker connections), if anything.
func CloseSink(s dispatch.Sink) {
	if c, ok := s.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// Poller builds the batch runner.
func (a *App) Poller(sink dispatch.Sink) *poller.Poller {
	return poller.New(a.pollerConfig(), poller.Deps{
		Store: a.Store, Locks: a.Locks, Redis: a.KV, Sink: sink, Log: a.Log, Metrics: a.Metrics,
		Tracer: a.tracerProvider(),
	})
}

func (a *App) pollerConfig() poller.Config {
	c := a.Cfg.Poller
	return poller.Config{
		LockTTL: c.LockTTL, LockWait: c.LockWait, BatchSize: c.BatchSize, PollInterval: c.PollInterval,
		MaxAttempts: c.MaxAttempts, ClaimTTL: c.ClaimTTL,
		BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax, ShutdownTimeout: a.Cfg.ShutdownTimeout,
		MaxPayloadBytes: int64(c.MaxPayloadBytes), BatchMaxBytes: int64(c.BatchMaxBytes),
		KeyPrefix: a.Cfg.Redis.KeyPrefix, Notify: c.Notify, GapWait: c.GapWait, Instance: a.Cfg.InstanceID,
		LockBackend: a.Cfg.Lock.Backend,
	}
}

// Reconciler builds the scheduled reconciliation.
func (a *App) Reconciler() (*reconcile.Reconciler, error) { return a.reconcilerOn(a.Store) }

// reconcilerOn builds a reconciler writing through s.
func (a *App) reconcilerOn(s *store.Store) (*reconcile.Reconciler, error) {
	c := a.Cfg.Reconcile
	return reconcile.New(reconcile.Config{
		Schedule: c.Schedule, LockTTL: c.LockTTL, Retention: c.Retention, DeadRetention: c.DeadRetention,
		BatchSize: c.BatchSize, ShutdownTimeout: a.Cfg.ShutdownTimeout, KeyPrefix: a.Cfg.Redis.KeyPrefix,
		Instance: a.Cfg.InstanceID, LockBackend: a.Cfg.Lock.Backend,
	}, reconcile.Deps{Store: s, Locks: a.Locks, Redis: a.KV, Log: a.Log, Metrics: a.Metrics})
}

// Run runs the daemon until ctx is cancelled: the batch runner, the
// reconciliation schedule and the HTTP endpoints, each owned by one errgroup.
// It returns nil on a clean shutdown.
func (a *App) Run(ctx context.Context) error {
	// Tracing starts first and stops last: the sinks are built traced, and
	// their last spans are exported after they closed.
	stopTracing, err := a.startTracing(ctx)
	if err != nil {
		return err
	}
	defer stopTracing()
	sink, err := a.Sink()
	if err != nil {
		return err
	}
	defer CloseSink(sink)
	p := a.Poller(sink)
	rec, err := a.Reconciler()
	if err != nil {
		return err
	}
	a.syncNotifyTrigger(ctx)

	ln, err := net.Listen("tcp", a.Cfg.HTTP.Addr)
	if err != nil {
		return fmt.Errorf("http.addr %s: %w", a.Cfg.HTTP.Addr, err)
	}
	// The operations endpoints read on a pool of their own: one connection
	// per request admitted at once (http.max_concurrent) and one more for
	// /readyz's ping, which a crowd of slow requests then cannot starve.
	ops, err := OpenOpsStore(ctx, a.Cfg.Postgres, a.Cfg.HTTP.MaxConcurrent+1)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer ops.Close()
	offLoopback := !httpapi.Loopback(a.Cfg.HTTP.Addr)
	deps, err := a.httpDeps(p, rec, sink, ops, offLoopback)
	if err != nil {
		_ = ln.Close()
		return err
	}
	ring := console.NewRing(console.DefaultSamples, console.DefaultSampleEvery, console.FromRegistry(a.Metrics.Registry, time.Now))
	deps.UI = a.consoleUI(deps.Admin, p, sink, ops, ring, consoleTokens(deps), offLoopback)
	srv := httpapi.Server(httpapi.Handler(deps), httpapi.Timeouts{})
	a.logStarted(ln.Addr().String(), sink, offLoopback)
	g, gctx := errgroup.WithContext(ctx)
	if a.Cfg.Lock.Backend == config.LockRedis {
		// Evicted lock keys hand the lease over while its holder works.
		g.Go(func() error { a.warnEviction(gctx); return nil })
	}
	g.Go(func() error { return ring.Run(gctx) })
	g.Go(func() error {
		a.heartbeat(gctx, ln.Addr().String(), func() bool { return p.HeldToken() > 0 })
		return nil
	})
	g.Go(func() error {
		if err := a.awaitSession(gctx); err != nil || gctx.Err() != nil {
			return err
		}
		rg, rctx := errgroup.WithContext(gctx)
		rg.Go(func() error { return p.Run(rctx) })
		rg.Go(func() error { return rec.Run(rctx) })
		rg.Go(func() error { return a.circ.run(rctx) })
		return rg.Wait()
	})
	g.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.Cfg.ShutdownTimeout)
		defer cancel()
		err := srv.Shutdown(sctx)
		if errors.Is(err, context.DeadlineExceeded) {
			// A connection still open at the deadline (a browser's
			// preconnected socket counts as busy for 5 s, a slow client)
			// is closed: the relay's own work has stopped by then.
			return srv.Close()
		}
		return err
	})
	err = g.Wait()
	a.Log.Info("outboxd stopped")
	return err
}

// httpDeps is what the HTTP endpoints read: the checks behind /readyz, the
// registry and the backlog refresh behind /metrics, /dead and /status, all
// on the operations pool ops.
func (a *App) httpDeps(p *poller.Poller, rec *reconcile.Reconciler, sink dispatch.Sink, ops *store.Store, offLoopback bool) (httpapi.Deps, error) {
	named, err := a.Cfg.AuthTokens()
	if err != nil {
		return httpapi.Deps{}, err
	}
	var toks []httpapi.Token
	for _, t := range named {
		toks = append(toks, httpapi.Token{Name: t.Name, Value: t.Token})
	}
	// The admin API's writes hold lock:reconciliation on a seat of their
	// own, as the CLI's commands do from their process.
	adminRec, err := a.Reconciler()
	if err != nil {
		return httpapi.Deps{}, err
	}
	checks := map[string]httpapi.Check{
		"postgres": ops.Ping,
		// Reachable is not enough: a leader whose every fetch fails is not
		// doing its job (poller.FetchFailure).
		"fetch": func(context.Context) error { return p.FetchFailure(time.Now()) },
	}
	if len(a.Nodes) > 0 {
		checks["redis"] = a.pingRedis
	}
	d := httpapi.Deps{
		Tokens:        toks,
		Checks:        checks,
		Registry:      a.Metrics.Registry,
		BeforeScrape:  func(ctx context.Context) { a.refreshBacklog(ctx, ops.Ops()); a.refreshPaused(ctx, ops.Ops()) },
		Pprof:         a.Cfg.HTTP.Pprof,
		AuthToken:     a.Cfg.HTTP.AuthToken,
		OffLoopback:   offLoopback,
		MaxConcurrent: a.Cfg.HTTP.MaxConcurrent,
		OpsShare:      opsShare,
		Dead:          ops.Ops(),
		Status: func(ctx context.Context) (any, error) {
			st, err := a.status(ctx, ops.Ops(), map[string]func() int64{keys.PollerLock: p.HeldToken, keys.ReconcileLock: rec.HeldToken}, sinksOf(sink), ops.Ops().Stats)
			ferr := p.FetchFailure(time.Now())
			switch {
			case err != nil && ferr != nil:
				return nil, fmt.Errorf("%w; poller: %w", err, ferr)
			case err != nil:
				return nil, err
			case ferr != nil:
				st.FetchError = ferr.Error()
			}
			return st, nil
		},
	}
	table, err := Routes(a.Cfg)
	if err != nil {
		return httpapi.Deps{}, err
	}
	d.Admin = admin.New(admin.Deps{
		Store: ops.Ops(), Reconciler: adminRec, Status: d.Status, Log: a.Log, Routes: table,
		Destinations: func(ctx context.Context) ([]admin.Destination, error) {
			st, err := a.status(ctx, ops.Ops(), nil, sinksOf(sink), ops.Ops().Stats)
			if err != nil {
				return nil, err
			}
			return adminDestinations(st), nil
		},
		AwaitPause: func(ctx context.Context, gen int64, wait time.Duration) (admin.PauseEffect, error) {
			eff, err := a.AwaitPause(ctx, gen, wait)
			return admin.PauseEffect{Leader: eff.Leader, NoLeader: eff.NoLeader}, err
		},
	})
	return d, nil
}

// adminDestinations are st's destinations as the admin API lists them,
// each with the shared backlog and lag.
func adminDestinations(st Status) []admin.Destination {
	out := []admin.Destination{}
	for _, d := range st.Destinations {
		out = append(out, admin.Destination{
			Name: d.Name, Sink: d.Sink, Circuit: d.Circuit, CircuitSince: d.CircuitSince, CircuitError: d.CircuitError,
			Paused: d.Paused, PausedAt: d.PausedAt, Backlog: st.Pending, LagSeconds: st.OldestPendingAge,
		})
	}
	return out
}

// redisMode is redis.mode, or "none" when neither the lease nor the
// idempotency keys live in Redis (no Redis connection is opened).
func redisMode(cfg *config.Config) string {
	if !cfg.UsesRedis() {
		return "none"
	}
	return cfg.Redis.Mode
}

// logStarted logs "outboxd started" with what this run uses, then the
// start-up warnings.
func (a *App) logStarted(addr string, sink dispatch.Sink, offLoopback bool) {
	lo, hi := poller.RetryHorizon(a.pollerConfig())
	caps := sink.Capabilities()
	a.Log.Info("outboxd started", "http_addr", addr, "lock_backend", a.Cfg.Lock.Backend, "redis_mode", redisMode(a.Cfg),
		"sink", sinkNames(a.Cfg), "sink_ordering", caps.Ordering, "poller_notify", a.Cfg.Poller.Notify,
		// How long a row that keeps failing is retried before it is dead-lettered.
		"retry_horizon_min", lo.Round(time.Second).String(), "retry_horizon_max", hi.Round(time.Second).String())
	a.warnUnsafe(sink, hi)
	if offLoopback && a.Cfg.HTTP.AuthToken == "" {
		a.Log.Warn("http.addr is not a loopback address and no bearer token is set: /dead, /dead/{id} and /debug/pprof/ answer 403; set http.auth_token_file to serve them",
			"http_addr", a.Cfg.HTTP.Addr)
	}
}

// opsShare is the share of each operations connection's time that
// requests reading Postgres may take (httpapi.Deps.OpsShare): delivery
// keeps the rest of the host however many clients read /dead.
const opsShare = 0.05

// sinkNames is the sink of the destination "default" alone, or each
// destination as name=sink ("payments=kafka,notify=webhook").
func sinkNames(cfg *config.Config) string {
	ds := destinations(cfg)
	if len(ds) == 1 && ds[0].name == dispatch.DefaultDestination {
		return ds[0].d.Sink
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.name + "=" + d.d.Sink
	}
	return strings.Join(parts, ",")
}

// warnUnsafe says at start, per destination, where its sink and the
// configuration do not fit together: a destination that drops repeated ids
// for less time than a row can be retried delivers a late retry twice; and
// whatever the sink's registry entry warns about. A router takes batches of
// its smallest destination's limit.
func (a *App) warnUnsafe(sink dispatch.Sink, retryHorizon time.Duration) {
	built := sinksOf(sink)
	for _, d := range destinations(a.Cfg) {
		s, ok := built[d.name]
		if !ok {
			continue
		}
		caps := s.Capabilities()
		if caps.DedupeWindow > 0 && caps.DedupeWindow < retryHorizon {
			a.Log.Warn("the sink's duplicate window is shorter than the retry horizon: a retry after it is delivered again (consumers must dedupe on the id)",
				"destination", d.name, "sink", d.d.Sink, "dedupe_window", caps.DedupeWindow.String(), "retry_horizon_max", retryHorizon.Round(time.Second).String())
		}
		if k, err := sinkOf(d); err == nil && k.warn != nil {
			k.warn(a, d)
		}
	}
	if caps := sink.Capabilities(); caps.MaxBatch > 0 && caps.MaxBatch < a.Cfg.Poller.BatchSize {
		a.Log.Info("the sink takes fewer events per call than poller.batch_size: batches are split",
			"sink", sinkNames(a.Cfg), "max_batch", caps.MaxBatch, "batch_size", a.Cfg.Poller.BatchSize)
	}
}

// syncNotifyTrigger makes the NOTIFY trigger match poller.notify, retrying in
// the background is not worth it: a failure only costs the faster wake-up.
func (a *App) syncNotifyTrigger(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.Store.SetNotifyTrigger(cctx, a.Cfg.Poller.Notify); err != nil {
		a.Log.Warn("notify trigger not changed", "error", err)
	}
}

func (a *App) pingRedis(ctx context.Context) error {
	var errs []error
	for _, n := range a.Nodes {
		if err := n.Ping(ctx).Err(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 && len(a.Nodes)-len(errs) < len(a.Nodes)/2+1 {
		return errors.Join(errs...)
	}
	return nil
}

// refreshBacklog sets the backlog gauges from Postgres, at most as often
// as backlogGate allows; on error they keep their last values (and /readyz
// reports Postgres).
func (a *App) refreshBacklog(ctx context.Context, s store.Ops) {
	a.backlog.run(ctx, time.Now, func(ctx context.Context) {
		st, err := s.Stats(ctx)
		if err != nil {
			return
		}
		a.Metrics.SetBacklog(st.Pending, st.OldestPendingAge, st.Dead)
		a.backlog.keep(st, time.Now())
	})
}

// refreshPaused sets outboxd_destination_paused from Postgres; on error
// the gauges keep their last values.
func (a *App) refreshPaused(ctx context.Context, s store.Ops) {
	paused, err := s.PausedDestinations(ctx)
	if err != nil {
		return
	}
	for _, d := range destinations(a.Cfg) {
		v := 0.0
		for _, p := range paused {
			if p.Destination == d.name {
				v = 1
			}
		}
		a.Metrics.Paused.WithLabelValues(d.name).Set(v)
	}
}

// LockStatus is one lock as /status and `outboxd status` show it.
type LockStatus struct {
	Name       string `json:"name"`
	HeldByMe   bool   `json:"held_by_this_replica"`
	Token      int64  `json:"token,omitempty"`
	Owner      string `json:"owner,omitempty"`
	Holder     string `json:"holder,omitempty"` // the holder's instance_id
	TTLMillis  int64  `json:"ttl_ms,omitempty"`
	FenceToken int64  `json:"postgres_fence_token"`
	// RedisCounter is the last token the lease's backend issued (Status'
	// LockBackend says which); the key's name is the default backend's.
	RedisCounter int64  `json:"redis_fence_counter"`
	Error        string `json:"error,omitempty"` // e.g. a corrupted lock key or fence counter, with its repair
}

// DestinationStatus is one destination as /status and `outboxd status`
// show it: its sink and, from a running relay (/status), what the sink says
// it can do (dispatch.Capabilities).
type DestinationStatus struct {
	Name string `json:"name"`
	Sink string `json:"sink"`
	// Key is where its settings are: "dispatch", "dispatch.destinations.<name>".
	Key          string `json:"key"`
	MaxBatch     int    `json:"max_batch,omitempty"`
	DedupeWindow string `json:"dedupe_window,omitempty"`
	Ordering     string `json:"ordering,omitempty"`
	// Circuit is its circuit breaker: "open" (sends held, probes only) or
	// "closed"; CircuitSince and CircuitError say since when and why.
	Circuit      string    `json:"circuit"`
	CircuitSince time.Time `json:"circuit_open_since,omitzero"`
	CircuitError string    `json:"circuit_last_error,omitempty"`
	// Paused: an operator paused it (`outboxd pause`), since PausedAt.
	Paused   bool      `json:"paused"`
	PausedAt time.Time `json:"paused_at,omitzero"`
}

// Status is the /status body.
type Status struct {
	// LockBackend is lock.backend: where the leases and their token
	// counters (LockStatus.RedisCounter) live.
	LockBackend  string              `json:"lock_backend"`
	Locks        []LockStatus        `json:"locks"`
	Destinations []DestinationStatus `json:"destinations"`
	// FetchError: this replica leads but every fetch of due rows has failed
	// for longer than poller.lock_ttl (then /readyz fails too).
	FetchError string `json:"fetch_error,omitempty"`
	// Replicas are the running replicas seen within ReplicaFresh
	// (heartbeat), the leader first.
	Replicas []store.Replica `json:"replicas"`
	store.Stats
}

// Status reads Postgres and Redis directly (for `outboxd status`); the
// destinations come from the configuration, without their sinks'
// capabilities (those are known once built: /status).
func (a *App) Status(ctx context.Context) (Status, error) {
	return a.status(ctx, a.Store.Ops(), nil, nil, a.Store.Ops().Stats)
}

// status reads Postgres through s; held gives this replica's token per
// lock (0 while not holding); built the sink of each destination, by name,
// once built; stats counts the backlog.
func (a *App) status(ctx context.Context, s store.Ops, held map[string]func() int64, built map[string]dispatch.Sink,
	stats func(context.Context) (store.Stats, error)) (Status, error) {
	st, err := stats(ctx)
	if err != nil {
		return Status{}, err
	}
	fences, err := s.FenceTokens(ctx)
	if err != nil {
		return Status{}, err
	}
	paused, err := s.PausedDestinations(ctx)
	if err != nil {
		return Status{}, err
	}
	replicas, err := a.Store.Ops().Replicas(ctx, ReplicaFresh)
	if err != nil {
		return Status{}, err
	}
	if replicas == nil {
		replicas = []store.Replica{}
	}
	out := Status{Stats: st, LockBackend: a.Cfg.Lock.Backend, Destinations: []DestinationStatus{}, Replicas: replicas}
	for _, d := range destinations(a.Cfg) {
		ds, err := a.destinationStatus(ctx, d, paused, built[d.name])
		if err != nil {
			return Status{}, err
		}
		out.Destinations = append(out.Destinations, ds)
	}
	for _, name := range keys.Locks {
		ls, err := a.lockStatus(ctx, name, fences[name], held[name])
		if err != nil {
			return Status{}, err
		}
		out.Locks = append(out.Locks, ls)
	}
	return out, nil
}

// destinationStatus reports destination d: its sink, whether it is paused,
// the built sink's capabilities (none when s is nil) and its circuit.
func (a *App) destinationStatus(ctx context.Context, d destination, paused []store.PausedDestination, s dispatch.Sink) (DestinationStatus, error) {
	ds := DestinationStatus{Name: d.name, Sink: d.d.Sink, Key: d.prefix}
	for _, p := range paused {
		if p.Destination == d.name {
			ds.Paused, ds.PausedAt = true, p.PausedAt
		}
	}
	if s != nil {
		c := s.Capabilities()
		ds.MaxBatch, ds.Ordering = c.MaxBatch, c.Ordering
		if c.DedupeWindow > 0 {
			ds.DedupeWindow = c.DedupeWindow.String()
		}
	}
	cs, err := a.circuitState(ctx, d.name, s)
	if err != nil {
		return DestinationStatus{}, fmt.Errorf("redis: %w", err)
	}
	ds.Circuit, ds.CircuitSince, ds.CircuitError = "closed", cs.Since, cs.LastError
	if cs.Open {
		ds.Circuit = "open"
	}
	return ds, nil
}

// lockStatus reports lock name: its fence token in Postgres, whether this
// process holds it (held returns the token it holds, 0 for none), its
// holder and token counter in the lease's backend.
func (a *App) lockStatus(ctx context.Context, name string, fence int64, held func() int64) (LockStatus, error) {
	ls := LockStatus{Name: name, FenceToken: fence}
	if held != nil && held() > 0 {
		ls.HeldByMe, ls.Token = true, held()
	}
	h, err := a.Locks.Holder(ctx, name)
	if err != nil && !errors.Is(err, lock.ErrCorrupt) {
		return LockStatus{}, fmt.Errorf("%s: %w", a.Cfg.Lock.Backend, err)
	}
	ls.Owner, ls.Holder, ls.TTLMillis = h.Owner, h.Instance, h.TTL.Milliseconds()
	counter, cerr := a.Locks.LastToken(ctx, name)
	ls.RedisCounter = counter
	// A corrupted key stops every replica from leading: show it here,
	// beside the lock, rather than fail the whole status.
	if errs := errors.Join(err, cerr); errs != nil {
		ls.Error = errs.Error()
	}
	return ls, nil
}

// RouteRedisLogs sends go-redis' own log lines (dial retries and the like,
// plain text on stderr by default) into log at debug level, so the output
// stays one JSON object per line. go-redis keeps one logger per process:
// call it once, from main.
func RouteRedisLogs(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// NewLogger returns the JSON (or text) slog logger on w's level.
func NewLogger(level, format string, w interface{ Write([]byte) (int, error) }) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(strings.ToUpper(level)))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
