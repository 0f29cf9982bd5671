package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// cluster is a pg_auto_failover formation started by
// scripts/failover-cluster: a monitor, a primary and a standby on loopback
// ports. The suite drives it only through that script, so what it does is
// what a reader can do by hand.
type cluster struct {
	script string // path of scripts/failover-cluster
	dir    string // FAILOVER_DIR
	port   int    // FAILOVER_PORT: the monitor's; node1 and node2 take the next two
	// async makes the standby asynchronous: the primary acknowledges a
	// COMMIT once it is on its own disk (synchronous_commit = local).
	async bool
	// progress receives what the cluster's script and the faults say.
	progress io.Writer
}

// do runs the script with args and returns what it printed.
func (c *cluster) do(ctx context.Context, args ...string) (string, error) {
	return runScript(ctx, c.script, []string{"FAILOVER_DIR=" + c.dir, fmt.Sprintf("FAILOVER_PORT=%d", c.port)}, c.progress, args...)
}

// runScript runs one of the repository's scripts with args and env added to
// this process's environment, its errors to progress, and returns what it
// printed.
func runScript(ctx context.Context, script string, env []string, progress io.Writer, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, script, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = progress
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w", filepath.Base(script), strings.Join(args, " "), err)
	}
	return strings.TrimSpace(out.String()), nil
}

// startCluster brings a formation up in a directory of its own, applies the
// migrations through the multi-host URL, and returns it with the superuser's
// URL. With async, the primary stops waiting for the standby.
func startCluster(ctx context.Context, port int, async bool, progress io.Writer) (*cluster, string, error) {
	script, err := filepath.Abs(filepath.Join("scripts", "failover-cluster"))
	if err != nil {
		return nil, "", err
	}
	if _, err := os.Stat(script); err != nil {
		return nil, "", fmt.Errorf("-failover runs from the repository's root (scripts/failover-cluster): %w", err)
	}
	dir, err := os.MkdirTemp("", "payments-failover-")
	if err != nil {
		return nil, "", err
	}
	// The script creates the directory, as the user PostgreSQL runs as.
	if err := os.Remove(dir); err != nil {
		return nil, "", err
	}
	c := &cluster{script: script, dir: dir, port: port, async: async, progress: progress}
	fmt.Fprintln(progress, "starting a pg_auto_failover formation in", dir)
	if _, err := c.do(ctx, "up"); err != nil {
		return c, "", err
	}
	adminURL, err := c.do(ctx, "admin-url")
	if err != nil {
		return c, "", err
	}
	if err := database.Migrate(ctx, adminURL); err != nil {
		return c, "", err
	}
	if async {
		if err := c.setAsync(ctx, adminURL); err != nil {
			return c, "", err
		}
	}
	return c, adminURL, nil
}

// setAsync makes every node acknowledge a COMMIT without waiting for its
// standby, as a node of a cluster with asynchronous replication does; set on
// each node, so that it holds whichever is primary.
func (c *cluster) setAsync(ctx context.Context, adminURL string) error {
	for _, node := range []string{"node1", "node2"} {
		conn, err := c.connectNode(ctx, adminURL, node)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `ALTER SYSTEM SET synchronous_commit = local`)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
		}
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("synchronous_commit = local on %s: %w", node, err)
		}
	}
	return nil
}

// connectNode connects to one node of the formation (node1 or node2),
// whatever its role: adminURL without its other host and its
// target_session_attrs.
func (c *cluster) connectNode(ctx context.Context, adminURL, node string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return nil, err
	}
	n := map[string]uint16{"node1": 1, "node2": 2}[node]
	if n == 0 {
		return nil, fmt.Errorf("no node %q in the formation", node)
	}
	cfg.Host, cfg.Port = "127.0.0.1", uint16(c.port)+n
	cfg.Fallbacks, cfg.ValidateConnect = nil, nil
	return pgx.ConnectConfig(ctx, cfg)
}

func (c *cluster) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.do(ctx, "down"); err != nil {
		fmt.Fprintln(c.progress, err)
	}
}

// primaryProbe measures how long the formation had no primary that took a
// write: every 100 ms it opens a connection through the multi-host URL, as a
// new client of the service would, and asks for a transaction id, which
// only a primary gives.
type primaryProbe struct {
	mu      sync.Mutex
	lastOK  time.Time
	longest time.Duration
}

func (p *primaryProbe) run(ctx context.Context, adminURL string, stop <-chan struct{}) {
	p.lastOK = time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			p.observe(time.Now(), false)
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, adminURL)
		if err == nil {
			_, err = conn.Exec(cctx, `SELECT txid_current()`)
			conn.Close(cctx)
		}
		cancel()
		p.observe(time.Now(), err == nil)
	}
}

func (p *primaryProbe) observe(now time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if gap := now.Sub(p.lastOK); gap > p.longest {
		p.longest = gap
	}
	if ok {
		p.lastOK = now
	}
}

func (p *primaryProbe) Longest() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.longest
}

// failoverPhases are the failover mode's faults: none, a planned
// switchover, and the primary's machine lost (kill -9 of its keeper and
// every PostgreSQL process, then started again to rejoin as the standby).
// With an asynchronous standby, the kill comes while the standby lags, as an
// asynchronous standby may (pauseReplication). With a synchronous one, a
// last phase holds the standby back while clients hang up on requests whose
// COMMIT waits for it, then kills the primary: the service gives those
// COMMITs up (committed on the primary only), the failover loses them, and
// their retries must execute once, charged under the first attempt's key.
func failoverPhases(c *cluster, adminURL string, cl *client, l **ledger) ([]string, []phase) {
	killPrimary := func(hold bool) func(context.Context, time.Duration) (int, error) {
		return func(ctx context.Context, d time.Duration) (int, error) {
			began := time.Now()
			if err := sleep(ctx, d/3); err != nil {
				return 0, err
			}
			primary, err := c.do(ctx, "primary")
			if err != nil {
				return 0, err
			}
			if hold {
				// Shorter than the service's DB_COMMIT_TIMEOUT (3 s): the
				// client is gone before its COMMIT is given up.
				cl.patience.Store(int64(time.Second))
				defer cl.patience.Store(0)
			}
			if c.async || hold {
				if err := c.pauseReplication(ctx, adminURL, primary, 6*time.Second, 4<<20); err != nil {
					return 0, err
				}
			}
			if _, err := c.do(ctx, "kill", primary); err != nil {
				return 0, err
			}
			cl.patience.Store(0)
			(*l).addFaults(1)
			if err := sleep(ctx, max(0, d-time.Since(began))); err != nil {
				return 0, err
			}
			// The old primary's machine comes back and rejoins as the
			// standby, so that the formation is whole again afterwards.
			_, err = c.do(ctx, "start", primary)
			return 0, err
		}
	}
	names := []string{"no fault", "planned switchover", "kill -9 of the primary's node"}
	phases := []phase{
		{names[0], func(ctx context.Context, d time.Duration) (int, error) { return 0, sleep(ctx, d) }},
		{names[1], func(ctx context.Context, d time.Duration) (int, error) {
			began := time.Now()
			if err := sleep(ctx, d/3); err != nil {
				return 0, err
			}
			if _, err := c.do(ctx, "switchover"); err != nil {
				return 0, err
			}
			return 1, sleep(ctx, max(0, d-time.Since(began)))
		}},
		{names[2], killPrimary(false)},
	}
	if !c.async {
		names = append(names, "standby held back, clients hang up in COMMIT, kill -9 of the primary")
		phases = append(phases, phase{names[3], killPrimary(true)})
	}
	return names, phases
}

// pauseReplication stops the primary's WAL sender for d, or until limit
// bytes of WAL are unsent, and leaves it stopped until the kill that
// follows: the primary keeps acknowledging commits it has not sent, as it
// does when its standby falls behind or the network between them stalls.
// The limit stays under the monitor's promote_wal_log_threshold (16 MB by
// default): a standby further behind is not promoted at all, and the old
// primary must come back, which shows the guard rather than the loss.
func (c *cluster) pauseReplication(ctx context.Context, adminURL, primary string, d time.Duration, limit int64) error {
	conn, err := c.connectNode(ctx, adminURL, primary)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&pid); err != nil {
		return fmt.Errorf("the primary's WAL sender: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	var lag int64
	var setting string
	waiting, mostWaiting := 0, 0
	for deadline := time.Now().Add(d); ; {
		// SyncRep: a backend whose COMMIT is written here and waits for the
		// standby to confirm it.
		if err := conn.QueryRow(ctx, `SELECT (pg_current_wal_lsn() - sent_lsn)::bigint, current_setting('synchronous_commit'),
			(SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep') FROM pg_stat_replication`).Scan(&lag, &setting, &waiting); err != nil {
			return err
		}
		mostWaiting = max(mostWaiting, waiting)
		if lag >= limit || time.Now().After(deadline) {
			break
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	fmt.Fprintf(c.progress, "the primary has %d bytes of WAL it did not send to the standby (synchronous_commit = %s) when it is killed; up to %d COMMITs waited for the standby at once\n", lag, setting, mostWaiting)
	return nil
}
