package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/database"
)

// citusCluster is a Citus cluster started by scripts/citus-cluster: a
// coordinator and two workers, each a PostgreSQL on a loopback port. The
// suite drives it only through that script, as a reader can by hand.
type citusCluster struct {
	script string // path of scripts/citus-cluster
	dir    string // CITUS_DIR
	port   int    // CITUS_PORT: the coordinator's; worker n takes port + n
	// progress receives what the script says.
	progress io.Writer
}

// do runs the script with args and returns what it printed.
func (c *citusCluster) do(ctx context.Context, args ...string) (string, error) {
	return runScript(ctx, c.script, []string{"CITUS_DIR=" + c.dir, "CITUS_PORT=" + strconv.Itoa(c.port)}, c.progress, args...)
}

// startCitus brings a cluster up in a directory of its own, applies the
// migrations to the coordinator (which, on Citus, also distributes the
// tables, as `api migrate up` does), and returns it with the coordinator's
// superuser URL.
func startCitus(ctx context.Context, port int, progress io.Writer) (*citusCluster, string, error) {
	script, err := filepath.Abs(filepath.Join("scripts", "citus-cluster"))
	if err == nil {
		_, err = os.Stat(script)
	}
	if err != nil {
		// `go test ./faults/...` runs in faults; `go run ./faults` in the root.
		script, err = filepath.Abs(filepath.Join("..", "scripts", "citus-cluster"))
		if err == nil {
			_, err = os.Stat(script)
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("-citus runs from the repository's root (scripts/citus-cluster): %w", err)
	}
	dir, err := os.MkdirTemp("", "payments-faults-citus-")
	if err != nil {
		return nil, "", err
	}
	// The script creates the directory, as the user PostgreSQL runs as.
	if err := os.Remove(dir); err != nil {
		return nil, "", err
	}
	c := &citusCluster{script: script, dir: dir, port: port, progress: progress}
	fmt.Fprintln(progress, "starting a Citus cluster in", dir)
	if _, err := c.do(ctx, "up"); err != nil {
		return c, "", err
	}
	adminURL, err := c.do(ctx, "url")
	if err != nil {
		return c, "", err
	}
	if err := database.Migrate(ctx, adminURL); err != nil {
		return c, "", err
	}
	return c, adminURL, nil
}

func (c *citusCluster) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.do(ctx, "down"); err != nil {
		fmt.Fprintln(c.progress, err)
	}
}

// citusPhases are the Citus mode's faults: none, then a worker's machine
// lost, then the coordinator's (kill -9 of every PostgreSQL process of the
// node, a third into the phase; started again, with its crash recovery, a
// third later). While a worker is down its tenants cannot pay and the
// others can; while the coordinator is down nobody can.
func citusPhases(c *citusCluster, l **ledger) ([]string, []phase) {
	lose := func(node string) func(context.Context, time.Duration) (int, error) {
		return func(ctx context.Context, d time.Duration) (int, error) {
			began := time.Now()
			if err := sleep(ctx, d/3); err != nil {
				return 0, err
			}
			if _, err := c.do(ctx, "kill", node); err != nil {
				return 0, err
			}
			(*l).addFaults(1)
			if err := sleep(ctx, d/3); err != nil {
				return 0, err
			}
			if _, err := c.do(ctx, "start", node); err != nil {
				return 0, err
			}
			return 0, sleep(ctx, max(0, d-time.Since(began)))
		}
	}
	names := []string{"no fault", "kill -9 of a worker", "kill -9 of the coordinator"}
	return names, []phase{
		{names[0], func(ctx context.Context, d time.Duration) (int, error) { return 0, sleep(ctx, d) }},
		{names[1], lose("worker1")},
		{names[2], lose("coordinator")},
	}
}

// tenants creates the API keys the clients pay with. On one server, one
// tenant. On a Citus cluster, tenants until each worker holds the shards of
// at least two: a worker lost then holds back its own tenants, and the
// others' payments show that they were not held back.
func tenants(ctx context.Context, admin *pgxpool.Pool, citus *citusCluster) ([]string, error) {
	create := func(name string) (key auth.NewKey, err error) {
		err = pgx.BeginFunc(ctx, admin, func(tx pgx.Tx) (err error) {
			key, err = auth.CreateKey(ctx, tx, name, []string{auth.ScopePaymentsWrite, auth.ScopeRefundsWrite})
			return err
		})
		if err != nil {
			return key, fmt.Errorf("create api key: %w", err)
		}
		return key, nil
	}
	if citus == nil {
		key, err := create("faults")
		return []string{key.Secret}, err
	}
	var secrets []string
	perWorker := map[int]int{}
	for i := 0; min(perWorker[citus.port+1], perWorker[citus.port+2]) < 2; i++ {
		if i == 40 {
			return nil, fmt.Errorf("40 tenants, and a worker holds fewer than two: %v", perWorker)
		}
		key, err := create("faults-" + strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		var port int
		if err := admin.QueryRow(ctx, `
			SELECT nodeport FROM citus_shards
			WHERE shardid = get_shard_id_for_distribution_column('payments', $1::uuid)`, key.PrincipalID).Scan(&port); err != nil {
			return nil, fmt.Errorf("where tenant %d's shard is: %w", i, err)
		}
		perWorker[port]++
		secrets = append(secrets, key.Secret)
	}
	return secrets, nil
}
