// Command lab runs the failure lab: each naive design of idempotency keys
// that docs/idempotency.md warns about, beside this service's design, on
// real PostgreSQL and Redis, and prints what each did.
//
//	go run ./cmd/lab                      # about 15 s on the local PostgreSQL and Redis
//	go run ./cmd/lab -rows 5000000        # the expiry scenarios at a few million rows
//
// It creates a database of its own (payments_lab_<unix time>) on the server
// -database-url names, applies the migrations, and drops it afterwards
// unless -keep is given. The eviction scenario starts a private redis-server
// (the binary must be installed), so the Redis at -redis-addr is never
// reconfigured. docs/lab.md maps every row to the hazard it demonstrates.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/lab"
)

func main() {
	fs := flag.NewFlagSet("lab", flag.ExitOnError)
	serverURL := fs.String("database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "a superuser on the PostgreSQL server to use; the lab creates its own database there")
	redisAddr := fs.String("redis-addr", "127.0.0.1:6379", "the Redis the Redis-claim scenario uses")
	rows := fs.Int("rows", 100_000, "rows in the expiry scenarios' tables")
	concurrency := fs.Int("concurrency", 16, "concurrent retries in the duplicate scenarios")
	keep := fs.Bool("keep", false, "keep the lab's database afterwards")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	held, err := run(ctx, *serverURL, *keep, lab.Env{RedisAddr: *redisAddr, Rows: *rows, Concurrency: *concurrency}, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(2)
	}
	if !held {
		os.Exit(1)
	}
}

// run creates and migrates the lab's database, runs every scenario, prints
// the table, and reports whether every lesson came out as taught.
func run(ctx context.Context, serverURL string, keep bool, env lab.Env, stdout, progress io.Writer) (bool, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return false, fmt.Errorf("-database-url: %w", err)
	}
	name := fmt.Sprintf("payments_lab_%d", time.Now().Unix())
	u.Path = "/" + name
	env.AdminURL = u.String()
	fmt.Fprintln(progress, "creating database", name)
	if err := database.EnsureDatabase(ctx, env.AdminURL); err != nil {
		return false, err
	}
	if !keep {
		defer dropDatabase(serverURL, name, progress)
	}
	if err := database.Migrate(ctx, env.AdminURL); err != nil {
		return false, err
	}
	l, err := lab.Open(ctx, env)
	if err != nil {
		return false, err
	}
	defer l.Close()

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tscenario\tnaive build\tthis service\tlesson")
	all := true
	for i, s := range lab.Scenarios {
		fmt.Fprintf(progress, "%d/%d %s\n", i+1, len(lab.Scenarios), s.Name)
		out, err := s.Run(ctx, l)
		if err != nil {
			return false, fmt.Errorf("%s: %w", s.Name, err)
		}
		lesson := "holds"
		if !out.NaiveBroke || !out.OursHeld {
			lesson, all = "NOT SHOWN", false
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", i+1, s.Name, out.Naive, out.Ours, lesson)
	}
	tw.Flush()
	return all, nil
}

func dropDatabase(serverURL, name string, progress io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := database.DropDatabase(ctx, serverURL, name); err != nil {
		fmt.Fprintln(progress, err)
	}
}
