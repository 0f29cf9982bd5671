// Command webhook-receiver is an example webhook endpoint for the payments
// API: it verifies each delivery and applies each event exactly once
// (package receiver). README.md ("Receiving webhooks") runs it.
//
//	RECEIVER_DATABASE_URL=postgres://... WEBHOOK_SECRETS=whsec_... go run ./examples/webhook-receiver
//
// WEBHOOK_SECRETS is the endpoint's secret; during a rotation, the old and
// the new, comma-separated. RECEIVER_ADDR is where it listens (:8081).
package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/client"
	"github.com/payments-reference/idempotent-payments/examples/webhook-receiver/receiver"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("webhook-receiver", "error", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	secrets := strings.Split(os.Getenv("WEBHOOK_SECRETS"), ",")
	if secrets[0] == "" {
		return errors.New("set WEBHOOK_SECRETS to the endpoint's secret (whsec_...), as POST /v1/webhook_endpoints showed it")
	}
	dbURL := os.Getenv("RECEIVER_DATABASE_URL")
	if dbURL == "" {
		return errors.New("set RECEIVER_DATABASE_URL to a database for the receiver's own tables")
	}
	addr := os.Getenv("RECEIVER_ADDR")
	if addr == "" {
		addr = ":8081"
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, receiver.Schema); err != nil {
		return err
	}
	r := &receiver.Receiver{Pool: pool, OnApply: func(e client.Event) {
		log.Info("applied", "webhook_id", e.Id, "type", e.Type)
	}}
	srv := &http.Server{Addr: addr, Handler: client.WebhookHandler(r.Apply, secrets...), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("receiving webhooks", "addr", addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
