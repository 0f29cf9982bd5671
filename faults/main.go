// Command faults runs the service through the faults a payments API meets in
// production and checks, against the database, that the idempotency promise
// held through each: the service binary behind an in-process fault proxy,
// clients that retry with the same key, and one fault at a time.
//
//	go run ./faults                       # about a minute on a quiet machine, on the local PostgreSQL
//	go run ./faults -phase 30s -workers 32
//	go run ./faults -failover                 # failovers of a pg_auto_failover formation, about 4 min
//	go run ./faults -failover -standby async  # the same with an asynchronous standby: it loses payments
//	go run ./faults -citus                    # a Citus cluster's worker, then coordinator, killed; about a minute
//
// It creates a database of its own (payments_faults_<time>) on the server
// -database-url names, applies the migrations, and drops it afterwards
// unless -keep is given. It prints one table of what each phase injected and
// what clients saw, then the invariants, and exits 1 if any did not hold.
// docs/reliability.md explains each fault and each invariant.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

func main() {
	fs := flag.NewFlagSet("faults", flag.ExitOnError)
	serverURL := fs.String("database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "a superuser on the PostgreSQL server to use; the suite creates its own database there")
	keep := fs.Bool("keep", false, "keep the suite's database afterwards, for inspection")
	cfg := config{}
	fs.DurationVar(&cfg.phase, "phase", 4*time.Second, "how long each fault lasts")
	fs.IntVar(&cfg.workers, "workers", 12, "concurrent retrying clients")
	fs.DurationVar(&cfg.intentDeadline, "intent-deadline", 30*time.Second, "a client gives up on an intent after this")
	fs.DurationVar(&cfg.idleInTx, "idle-in-tx", 2*time.Second, "the API's DB_IDLE_IN_TX_TIMEOUT: how long a vanished holder keeps a key")
	fs.StringVar(&cfg.out, "out", "faults-out", "directory for api.log and results.json")
	fs.BoolVar(&cfg.wide, "wide", false, "print the phases as one table with their replies, a phase a line (about 230 columns), instead of a table that fits 120")
	failover := fs.Bool("failover", false, "instead of the proxy's faults, failovers of a pg_auto_failover formation this starts (scripts/failover-cluster); each phase lasts at least 15 s")
	standby := fs.String("standby", "sync", "with -failover: sync (the formation's default, synchronous replication) or async (synchronous_commit = local: the lesson of docs/reliability.md)")
	failoverPort := fs.Int("failover-port", 26330, "with -failover: the monitor's port; the nodes take the next two")
	citus := fs.Bool("citus", false, "instead of the proxy's faults, a worker and then the coordinator of a Citus cluster this starts (scripts/citus-cluster) killed under load; each phase lasts at least 9 s")
	citusPort := fs.Int("citus-port", 26384, "with -citus: the coordinator's port; the workers take the next two")
	_ = fs.Parse(os.Args[1:])
	if *standby != "sync" && *standby != "async" {
		fmt.Fprintln(os.Stderr, "faults: -standby is sync or async")
		os.Exit(2)
	}
	if *failover && *citus {
		fmt.Fprintln(os.Stderr, "faults: -failover or -citus, not both")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var held bool
	var err error
	switch {
	case *citus:
		cfg.phase = max(cfg.phase, 9*time.Second)
		// A node's crash recovery took 20 s here: a client's intent, and a
		// refund waiting for its payment's charge, outlast it.
		cfg.intentDeadline = max(cfg.intentDeadline, 90*time.Second)
		held, err = runCitus(ctx, *citusPort, *keep, cfg, os.Stdout, os.Stderr)
	case *failover:
		cfg.phase = max(cfg.phase, 15*time.Second)
		// A charge whose worker lost its connection at the failover stays
		// running until River's rescuer (every 30 s) takes it back after
		// OUTBOX_RESCUE_AFTER (10 s here); a refund of that payment waits
		// for it, and so does its client.
		cfg.intentDeadline = max(cfg.intentDeadline, 90*time.Second)
		held, err = runFailover(ctx, *failoverPort, *standby == "async", *keep, cfg, os.Stdout, os.Stderr)
	default:
		held, err = runOnOwnDatabase(ctx, *serverURL, *keep, cfg, os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(2)
	}
	if !held {
		os.Exit(1)
	}
}

// runOnOwnDatabase creates, migrates and (unless keep) drops a database for
// one run, and writes the report.
func runOnOwnDatabase(ctx context.Context, serverURL string, keep bool, cfg config, stdout, progress io.Writer) (bool, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return false, fmt.Errorf("-database-url: %w", err)
	}
	name := fmt.Sprintf("payments_faults_%d", time.Now().Unix())
	u.Path = "/" + name
	cfg.adminURL = u.String()
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return false, err
	}
	fmt.Fprintln(progress, "creating database", name)
	if err := database.EnsureDatabase(ctx, cfg.adminURL); err != nil {
		return false, err
	}
	if !keep {
		defer dropDatabase(serverURL, name, progress)
	}
	if err := database.Migrate(ctx, cfg.adminURL); err != nil {
		return false, err
	}
	return runAndReport(ctx, cfg, stdout, progress)
}

// runFailover starts a pg_auto_failover formation, runs the failover phases
// against it, and (unless keep) stops and deletes it.
func runFailover(ctx context.Context, port int, async, keep bool, cfg config, stdout, progress io.Writer) (bool, error) {
	c, adminURL, err := startCluster(ctx, port, async, progress)
	if c != nil && !keep {
		defer c.stop()
	}
	if err != nil {
		return false, err
	}
	cfg.adminURL, cfg.cluster = adminURL, c
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return false, err
	}
	return runAndReport(ctx, cfg, stdout, progress)
}

// runCitus starts a Citus cluster, runs the Citus phases against it, and
// (unless keep) stops and deletes it.
func runCitus(ctx context.Context, port int, keep bool, cfg config, stdout, progress io.Writer) (bool, error) {
	c, adminURL, err := startCitus(ctx, port, progress)
	if c != nil && !keep {
		defer c.stop()
	}
	if err != nil {
		return false, err
	}
	cfg.adminURL, cfg.citus = adminURL, c
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return false, err
	}
	return runAndReport(ctx, cfg, stdout, progress)
}

// runAndReport runs the suite, prints the report and writes results.json.
func runAndReport(ctx context.Context, cfg config, stdout, progress io.Writer) (bool, error) {
	res, err := run(ctx, cfg, progress)
	if err != nil {
		return false, err
	}
	writeReport(stdout, res, cfg.wide)
	raw, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.WriteFile(filepath.Join(cfg.out, "results.json"), raw, 0o644); err != nil {
		return false, err
	}
	return res.Held(), nil
}

func dropDatabase(serverURL, name string, progress io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := database.DropDatabase(ctx, serverURL, name); err != nil {
		fmt.Fprintln(progress, err)
	}
}

// writeReport prints the phases and the invariants as two tables. The
// phases' table fits 120 columns, with each phase's replies listed below
// it; wide puts the replies in the table, a phase a line.
func writeReport(w io.Writer, res *Results, wide bool) {
	failover := slices.ContainsFunc(res.Phases, func(p *phaseStats) bool { return p.NoPrimary > 0 })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "phase\tfaults\tintents\tattempts\tunknown c/n\tmax intent\tno 201 for"
	if failover {
		header += "\tno primary"
	}
	header += "\tinvariants"
	if wide {
		header += "\treplies"
	}
	fmt.Fprintln(tw, header)
	for _, p := range res.Phases {
		held := "held"
		if len(p.Broken) > 0 {
			held = fmt.Sprintf("%d broken", len(p.Broken))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d/%d\t%s\t%s", p.Name, p.Faults, p.Intents, p.Attempts,
			p.UnknownThenReplayed, p.UnknownThenExecuted, p.LongestIntent.Round(time.Millisecond),
			p.LongestWithoutSuccess.Round(10*time.Millisecond))
		if failover {
			fmt.Fprintf(tw, "\t%s", p.NoPrimary.Round(100*time.Millisecond))
		}
		fmt.Fprintf(tw, "\t%s", held)
		if wide {
			fmt.Fprintf(tw, "\t%s", strings.Join(replies(p.Replies), ", "))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nunknown c/n: intents first answered outcome-unknown in the phase whose retry found them committed (a replay)")
	fmt.Fprintln(w, "or not (executed once); max intent: the longest from an intent's first attempt to its final answer;")
	fmt.Fprintln(w, "no 201 for: the longest stretch, while clients began intents, in which none got a payment's 201.")
	if !wide {
		fmt.Fprintln(w, "\nreplies, by phase:")
		for _, p := range res.Phases {
			fmt.Fprint(w, wrap("  "+p.Name+": ", replies(p.Replies), 120))
		}
	}
	fmt.Fprintf(w, "\n%d payments, %d refunds in %s.\n%s\n\n", res.Payments, res.Refunds, res.Duration.Round(time.Second), unknownSummary(res))
	if res.LostCharged > 0 {
		fmt.Fprintf(w, "%d of the acknowledged payments the database lost had been charged by the processor\n\n", res.LostCharged)
	}
	fmt.Fprintf(w, "keyed by payment id instead of by intent (before migration 18), %d intents of this run would have been\ncharged twice: the processor received their key under two payment ids\n\n", res.IDKeyedTwice)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "invariant (after the last phase)\tfound\tholds")
	for _, c := range res.Invariants {
		fmt.Fprintf(tw, "%s\t%d\t%v\n", c.Name, c.Found, c.Holds)
	}
	tw.Flush()
}

// unknownSummary says how the outcome-unknown answers were resolved, in
// figures that add up: answers are more than intents because a retry can
// meet a fault again, and an intent whose retries never got a final answer
// is neither committed nor not.
func unknownSummary(res *Results) string {
	s := fmt.Sprintf("%d outcome-unknown answers to %d intents (a retry can meet a fault again); retried with the same key,\n%d had committed (replayed) and %d had not (executed once)",
		res.Unknown, res.UnknownIntents, res.UnknownCommitted, res.UnknownNotCommitted)
	if rest := res.UnknownIntents - res.UnknownCommitted - res.UnknownNotCommitted; rest > 0 {
		s += fmt.Sprintf("; %d got no final answer within the intent deadline", rest)
	}
	return s
}

// wrap prints items after prefix, comma-separated, breaking lines before
// width and indenting continuations under the first item.
func wrap(prefix string, items []string, width int) string {
	var b strings.Builder
	line := prefix
	indent := strings.Repeat(" ", len(prefix))
	for i, it := range items {
		if i < len(items)-1 {
			it += ","
		}
		if line != prefix && line != indent && len(line)+1+len(it) > width {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		if line != prefix && line != indent {
			line += " "
		}
		line += it
	}
	b.WriteString(line + "\n")
	return b.String()
}

// replies lists reply counts, most frequent first.
func replies(m map[string]int) []string {
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, n := range m {
		all = append(all, kv{k, n})
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.n != b.n {
			return b.n - a.n
		}
		return cmp.Compare(a.k, b.k)
	})
	out := make([]string, len(all))
	for i, e := range all {
		out[i] = fmt.Sprintf("%s: %d", e.k, e.n)
	}
	return out
}
