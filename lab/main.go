// Command lab runs the failure lab: each naive design of idempotency keys
// that docs/idempotency.md warns about, beside this service's design, on
// real PostgreSQL and Redis, and prints what each did.
//
//	go run ./lab                          # about 10 s on a quiet machine, the local PostgreSQL and Redis
//	go run ./lab -rows 5000000            # the expiry scenarios at a few million rows
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
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/lab/scenario"
)

func main() {
	fs := flag.NewFlagSet("lab", flag.ExitOnError)
	serverURL := fs.String("database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "a superuser on the PostgreSQL server to use; the lab creates its own database there")
	redisAddr := fs.String("redis-addr", "127.0.0.1:6379", "the Redis the Redis-claim scenario uses")
	rows := fs.Int("rows", 100_000, "rows in the expiry scenarios' tables")
	concurrency := fs.Int("concurrency", 16, "concurrent retries in the duplicate scenarios")
	keep := fs.Bool("keep", false, "keep the lab's database afterwards")
	wide := fs.Bool("wide", false, "print one table, a scenario a line (about 250 columns), instead of a block per scenario that fits 120")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	held, err := run(ctx, *serverURL, *keep, *wide, scenario.Env{RedisAddr: *redisAddr, Rows: *rows, Concurrency: *concurrency}, os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lab:", err)
		os.Exit(2)
	}
	if !held {
		os.Exit(1)
	}
}

// run creates and migrates the lab's database, runs every scenario, prints
// what each did, and reports whether every lesson came out as taught.
func run(ctx context.Context, serverURL string, keep, wide bool, env scenario.Env, stdout, progress io.Writer) (bool, error) {
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
	l, err := scenario.Open(ctx, env)
	if err != nil {
		return false, err
	}
	defer l.Close()

	var results []result
	all := true
	for i, s := range scenario.Scenarios {
		fmt.Fprintf(progress, "%d/%d %s\n", i+1, len(scenario.Scenarios), s.Name)
		out, err := s.Run(ctx, l)
		if err != nil {
			return false, fmt.Errorf("%s: %w", s.Name, err)
		}
		results = append(results, result{name: s.Name, out: out})
		all = all && out.NaiveBroke && out.OursHeld
	}
	if wide {
		printWide(stdout, results)
	} else {
		printNarrow(stdout, results)
	}
	return all, nil
}

type result struct {
	name string
	out  scenario.Outcome
}

// lesson is what the row showed, in its figures; "NOT SHOWN" leads it when
// the naive build did not break or ours did not hold.
func (r result) lesson() string {
	s := r.out.Shown
	if r.out.Structural != "" {
		s += " (structural)"
	}
	if !r.out.NaiveBroke || !r.out.OursHeld {
		return "NOT SHOWN: " + s
	}
	return s
}

// printWide prints one table, a scenario a line.
func printWide(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tscenario\tnaive build\tthis service\tlesson")
	for i, r := range results {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", i+1, r.name, r.out.Naive, r.out.Ours, r.lesson())
	}
	tw.Flush()
	printStructural(w, results)
}

// printNarrow prints a block per scenario, wrapped to fit 120 columns.
func printNarrow(w io.Writer, results []result) {
	for i, r := range results {
		fmt.Fprintf(w, "%2d  %s: %s\n", i+1, r.name, r.lesson())
		wrap(w, "      naive build:  ", r.out.Naive)
		wrap(w, "      this service: ", r.out.Ours)
	}
	printStructural(w, results)
}

// printStructural says what each structural verdict rests on.
func printStructural(w io.Writer, results []result) {
	for i, r := range results {
		if r.out.Structural != "" {
			wrap(w, fmt.Sprintf("row %d is structural: ", i+1), r.out.Structural)
		}
	}
}

// wrap writes text after prefix, folded at word boundaries to 120 columns,
// continuation lines indented under the text.
func wrap(w io.Writer, prefix, text string) {
	const width = 120
	indent := strings.Repeat(" ", len(prefix))
	line := prefix
	for _, word := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(word) > width {
			fmt.Fprintln(w, line)
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	fmt.Fprintln(w, line)
}

func dropDatabase(serverURL, name string, progress io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := database.DropDatabase(ctx, serverURL, name); err != nil {
		fmt.Fprintln(progress, err)
	}
}
