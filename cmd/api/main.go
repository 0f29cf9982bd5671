// Command api is the payments service and its operator tools, in one binary:
//
//	api [serve]                                  run the HTTP API (the default)
//	api migrate up                               apply pending migrations
//	api keys create --principal NAME --scopes S  create an API key; prints one JSON line
//	api keys list [--principal NAME]             list API keys, one JSON line each (never a secret)
//	api keys revoke ID                           revoke an API key
//	api sweep                                    delete what is past its retention once (app.SweepOnce); prints one JSON line
//	api reconcile                                settle undecided payments and refunds from the processor's record once; prints one JSON line
//	api processor-sim                            run the payment processor simulator on ADDR
//	api healthcheck                              exit 0 if the API on ADDR answers /healthz (for container healthchecks)
//
// Settings come from environment variables; see internal/config and README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/payments-reference/idempotent-payments/internal/app"
	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/config"
	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/processor/simulator"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  api [serve]
  api migrate up
  api keys create --principal NAME --scopes payments:read,payments:write,refunds:read,refunds:write
  api keys list [--principal NAME]
  api keys revoke ID
  api sweep
  api reconcile
  api processor-sim
  api healthcheck`

// run dispatches to a subcommand. It returns instead of exiting so that
// deferred cleanups run and tests can call it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	return runLogging(ctx, args, getenv, stdout, os.Stderr)
}

// runLogging is run with the log written to logOut.
func runLogging(ctx context.Context, args []string, getenv func(string) string, stdout, logOut io.Writer) error {
	// Help comes before the configuration is read: it must work with a
	// broken environment too, and for every subcommand.
	for i, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || (i == 0 && a == "help") {
			return printHelp(stdout)
		}
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(logOut, &slog.HandlerOptions{Level: cfg.LogLevel}))

	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return app.Serve(ctx, cfg, log, getenv, app.Options{})
	case "migrate":
		if len(args) != 1 || args[0] != "up" {
			return errors.New(usage)
		}
		if err := app.MigrateUp(ctx, cfg); err != nil {
			return err
		}
		log.Info("migrations applied")
		return nil
	case "keys":
		return keys(ctx, cfg, args, stdout)
	case "sweep":
		if len(args) != 0 {
			return errors.New(usage)
		}
		return sweep(ctx, cfg, stdout)
	case "reconcile":
		if len(args) != 0 {
			return errors.New(usage)
		}
		return reconcileOnce(ctx, cfg, log, stdout)
	case "healthcheck":
		return healthcheck(ctx, cfg)
	case "processor-sim":
		if len(args) != 0 {
			return errors.New(usage)
		}
		return serveSimulator(ctx, cfg, log)
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}

// printHelp prints the subcommands and every setting with its default,
// from config.Settings, the table README.md's is checked against. Two lines
// a setting, so that it fits a terminal whatever the default's length.
func printHelp(w io.Writer) error {
	fmt.Fprintf(w, "%s\n\nSettings (environment variables), their defaults, and what they do:\n", usage)
	for _, s := range config.Settings() {
		fmt.Fprintf(w, "  %s=%s\n      %s\n", s.Name, s.Default, s.Help)
	}
	_, err := fmt.Fprintln(w, "  OTEL_EXPORTER_OTLP_ENDPOINT=\n      export traces over OTLP/HTTP; the other standard OTEL_* variables work too\n\nREADME.md, Configuration, says more about each.")
	return err
}

// healthcheck asks the API on ADDR for /healthz, for a container's
// healthcheck in an image that has no curl.
func healthcheck(ctx context.Context, cfg config.Config) error {
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return fmt.Errorf("ADDR %q: %w", cfg.Addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthz: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: status %d", resp.StatusCode)
	}
	return nil
}

func simConfig(cfg config.Config) simulator.Config {
	return simulator.Config{Latency: cfg.Sim.Latency, ErrorRate: cfg.Sim.ErrorRate, DropRate: cfg.Sim.DropRate,
		TimeoutRate: cfg.Sim.TimeoutRate, Hold: cfg.Sim.Hold, CommitDelay: cfg.Sim.CommitDelay, Seed: uint64(time.Now().UnixNano())}
}

// serveSimulator runs the processor simulator alone, on ADDR, until ctx ends.
func serveSimulator(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	srv := &http.Server{Addr: cfg.Addr, Handler: simulator.New(simConfig(cfg)), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("processor simulator listening", "addr", cfg.Addr)
	select {
	case err := <-errc:
		return fmt.Errorf("listen: %w", err)
	case <-ctx.Done():
		return srv.Close()
	}
}

// reconcileOnce settles what waits for reconciliation, for operators: after
// a processor outage, or to see at once what the periodic job would do.
func reconcileOnce(ctx context.Context, cfg config.Config, log *slog.Logger, stdout io.Writer) error {
	if cfg.Simulated() {
		// A simulator started here would have an empty ledger and answer
		// "no record" for everything: that would record payments as failed
		// that the service's own simulator may have charged.
		return errors.New("api reconcile needs a processor (PROCESSOR_URL, or PROCESSOR=stripe): it asks the processor's ledger, and an in-process simulator has none; a serve with the in-process simulator reconciles on its own")
	}
	pool, err := database.Open(ctx, cfg.DatabaseURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: cfg.DBAcquireTimeout, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer pool.Close()
	proc, err := app.NewProcessor(ctx, cfg, log, noop.NewTracerProvider())
	if err != nil {
		return err
	}
	res, err := app.NewReconciler(cfg, pool, proc, log).Run(ctx)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

// sweep deletes what is past its retention once, for operators and cron,
// and reports what it did.
func sweep(ctx context.Context, cfg config.Config, stdout io.Writer) error {
	maint, err := database.Open(ctx, cfg.MaintenanceDatabaseURL, database.PoolConfig{MaxConns: 2, AcquireTimeout: cfg.DBAcquireTimeout, IdleInTxTimeout: cfg.DBIdleInTxTimeout})
	if err != nil {
		return err
	}
	defer maint.Close()
	deleted, err := app.SweepOnce(ctx, cfg, maint)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(deleted)
}

// keys runs the key subcommands as the owner role: the service role cannot
// write API keys.
func keys(ctx context.Context, cfg config.Config, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	conn, err := pgx.Connect(ctx, cfg.MigrateDatabaseURL)
	if err != nil {
		return fmt.Errorf("connect as owner: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	switch args[0] {
	case "create":
		fs := flag.NewFlagSet("keys create", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		name := fs.String("principal", "", "principal (tenant) name")
		scopes := fs.String("scopes", "", "comma-separated scopes")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 0 {
			return errors.New(usage)
		}
		var key auth.NewKey
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) (err error) {
			key, err = auth.CreateKey(ctx, tx, *name, strings.Split(*scopes, ","))
			return err
		})
		if err != nil {
			return err
		}
		return json.NewEncoder(stdout).Encode(key)
	case "list":
		fs := flag.NewFlagSet("keys list", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		name := fs.String("principal", "", "only this principal's keys")
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() != 0 {
			return errors.New(usage)
		}
		list, err := auth.ListKeys(ctx, conn, *name)
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		for _, k := range list {
			if err := enc.Encode(k); err != nil {
				return err
			}
		}
		return nil
	case "revoke":
		if len(args) != 2 {
			return errors.New(usage)
		}
		id, err := uuid.Parse(args[1])
		if err != nil {
			return fmt.Errorf("key id %q is not a uuid", args[1])
		}
		if err := auth.RevokeKey(ctx, conn, id); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "{\"id\":%q,\"revoked\":true}\n", id)
		return nil
	default:
		return errors.New(usage)
	}
}
