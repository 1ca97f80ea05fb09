// Command outboxd-demo is the demo's two ends: a webhook receiver that prints
// what it gets (and checks signatures), and a producer that writes business
// rows and outbox events in one transaction with store.Enqueue.
//
//	outboxd-demo receive -addr 127.0.0.1:8081 [-secret S]
//	outboxd-demo produce -dsn DSN -rate 20 -for 10s
//	outboxd-demo createdb -dsn DSN   (creates DSN's database if missing)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/store"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: outboxd-demo receive|produce [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "receive":
		err = receive(ctx, os.Args[2:])
	case "produce":
		err = produce(ctx, os.Args[2:])
	case "createdb":
		err = createdb(ctx, os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "outboxd-demo: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outboxd-demo:", err)
		os.Exit(1)
	}
}

func receive(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("receive", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8081", "listen address")
	secret := fs.String("secret", "", "webhook secret to verify signatures with")
	_ = fs.Parse(args)
	var n atomic.Int64
	srv := &http.Server{Addr: *addr, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev dispatch.Event
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		sig := "unsigned"
		if *secret != "" {
			ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
			sig = "signature ok"
			if r.Header.Get("webhook-signature") != webhook.Sign([]byte(*secret), r.Header.Get("webhook-id"), ts, body) {
				sig = "SIGNATURE MISMATCH"
			}
		}
		fmt.Printf("received #%d id=%d %s/%s %s token=%s %s payload=%s\n", n.Add(1), ev.ID, ev.AggregateType,
			ev.AggregateID, ev.EventType, r.Header.Get("X-Fencing-Token"), sig, ev.Payload)
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	}()
	fmt.Printf("demo receiver listening on http://%s\n", *addr)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}

func produce(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("produce", flag.ExitOnError)
	dsn := fs.String("dsn", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "Postgres DSN")
	rate := fs.Int("rate", 20, "events per second")
	dur := fs.Duration("for", 10*time.Second, "how long to produce (0: until interrupted)")
	_ = fs.Parse(args)
	pool, err := pgxpool.New(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *dur > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *dur)
		defer cancel()
	}
	tick := time.NewTicker(time.Second / time.Duration(max(*rate, 1)))
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			fmt.Printf("produced %d events\n", n)
			return nil
		case <-tick.C:
		}
		deal := strconv.Itoa(n % 5)
		// The business write and the event commit together, or not at all.
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return store.Enqueue(ctx, tx, store.Event{
				AggregateType: "deal", AggregateID: deal, EventType: "deal.funded",
				Payload: json.RawMessage(fmt.Sprintf(`{"deal":%s,"seq":%d,"amount_cents":%d}`, deal, n, 1000+n)),
				Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			})
		})
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return err
		}
		n++
	}
}

func createdb(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("createdb", flag.ExitOnError)
	dsn := fs.String("dsn", "", "Postgres DSN of the database to create")
	_ = fs.Parse(args)
	cfg, err := pgx.ParseConfig(*dsn)
	if err != nil {
		return err
	}
	name := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = @name)`, pgx.NamedArgs{"name": name}).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	}
	return err
}
