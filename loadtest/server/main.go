// Command server is the load test's API: the service exactly as `api serve`
// runs it (internal/app), plus what only the load test needs, which the
// production binary does not carry (loadtest/designs): the baseline route,
// the Redis peer's route when LOADTEST_REDIS_PEER names a Redis, and the
// claim statement's time in Server-Timing, and a processor simulator that
// takes LOADTEST_PROCESSOR_LATENCY (median) and LOADTEST_PROCESSOR_LATENCY_P99
// to answer. The load test builds and starts it.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/payments-reference/idempotent-payments/internal/app"
	"github.com/payments-reference/idempotent-payments/internal/config"
	"github.com/payments-reference/idempotent-payments/loadtest/designs"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	cfg, err := config.Load(os.Getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	var rdb *redis.Client
	if addr := os.Getenv("LOADTEST_REDIS_PEER"); addr != "" {
		rdb = redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
	}
	opts := app.Options{Handler: designs.Handler(rdb), WrapTracer: designs.WrapTracer}
	for name, d := range map[string]*time.Duration{"LOADTEST_PROCESSOR_LATENCY": &opts.SimLatency, "LOADTEST_PROCESSOR_LATENCY_P99": &opts.SimLatencyP99} {
		if v := os.Getenv(name); v != "" {
			if *d, err = time.ParseDuration(v); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	return app.Serve(ctx, cfg, log, os.Getenv, opts)
}
