package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// pgbenchScript is what the service sends PostgreSQL for one new idempotent
// payment, statement for statement and round trip for round trip, with one
// principal's values written in (pgbench variables can only be numbers):
// BEGIN; a pipeline of authentication, claim and lookup; a pipeline of the
// payment (and the job, pgbenchJobInsert) and the stored response; COMMIT.
// The scope is spelled with chr(58) for its colon: pgbench reads ":write"
// as a variable, even inside a string.
const pgbenchScript = `\set amount random(1, 100000)
\set k random(1, 1000000000000)
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;
\startpipeline
SELECT set_config('lock_timeout', '5000', true);
SELECT key_id, principal_id, scopes FROM authenticate_request('\x{{HASH}}'::bytea, 'payments' || chr(58) || 'write');
INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, correlation_id, trace_parent, expires_at) VALUES ('{{PRINCIPAL}}', 'POST /v1/payments', 'pgbench-' || :client_id || '-' || :k, 'in_progress', sha256(('pgbench' || :k)::bytea), 'req_pgbench', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', now() + 90000000 * interval '1 millisecond') ON CONFLICT (principal_id, endpoint, key) DO NOTHING RETURNING created_at;
SELECT state, fingerprint, response_status, coalesce(response_content_type, ''), coalesce(response_body, ''::bytea), coalesce(response_ref, ''), correlation_id, coalesce(trace_parent, '') FROM idempotency_keys WHERE principal_id = '{{PRINCIPAL}}' AND endpoint = 'POST /v1/payments' AND key = 'pgbench-' || :client_id || '-' || :k AND expires_at >= now();
\endpipeline
\startpipeline
INSERT INTO payments (id, principal_id, amount, currency, status, description, metadata, created_at, processor_key) VALUES (gen_random_uuid(), '{{PRINCIPAL}}', :amount, 'usd', 'succeeded', 'load test', '{"order": "1"}', now(), 'intent_' || encode(sha256(('pgbench' || :client_id || '-' || :k)::bytea), 'hex'));
UPDATE idempotency_keys SET state = 'completed', response_status = 201, response_content_type = 'application/json', response_body = convert_to('{{BODY}}', 'UTF8'), response_ref = NULL WHERE principal_id = '{{PRINCIPAL}}' AND endpoint = 'POST /v1/payments' AND key = 'pgbench-' || :client_id || '-' || :k AND state = 'in_progress';
\endpipeline
END;
`

// pgbenchJobInsert is the outbox job a payment inserts in its transaction,
// written as outbox.Writer writes it (one row into river_job), in the
// pipeline of the payment. The queue is one no worker serves, so pgbench's
// jobs are written, not worked.
const pgbenchJobInsert = `INSERT INTO river_job (args, kind, max_attempts, metadata, queue, state) VALUES (('{"payment_id": "' || gen_random_uuid() || '", "principal_id": "{{PRINCIPAL}}"}')::jsonb, 'charge_payment', 15, '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'::jsonb, 'pgbench_unworked', 'available');
`

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// runPgbench runs the service's SQL with pgbench as the service role and
// returns its throughput, without and with the outbox job's insert. When
// pgbench is not installed it returns a note instead of failing the run.
func runPgbench(ctx context.Context, cfg config, clients []client, progress io.Writer) (withoutJob, withJob float64, note string, err error) {
	withoutJob, note, err = runPgbenchScript(ctx, cfg, clients, progress, pgbenchScript, "the service's SQL without the outbox job")
	if err != nil || note != "" {
		return 0, 0, note, err
	}
	withJob, _, err = runPgbenchScript(ctx, cfg, clients, progress, strings.Replace(pgbenchScript, "UPDATE idempotency_keys SET state", pgbenchJobInsert+"UPDATE idempotency_keys SET state", 1), "the service's SQL with the outbox job")
	return withoutJob, withJob, "", err
}

func runPgbenchScript(ctx context.Context, cfg config, clients []client, progress io.Writer, pgbenchScript, what string) (float64, string, error) {
	bin, err := exec.LookPath("pgbench")
	if err != nil {
		return 0, "pgbench is not installed: service_to_pgbench_ratio not measured", nil
	}
	dir, err := os.MkdirTemp("", "loadtest-pgbench")
	if err != nil {
		return 0, "", err
	}
	defer os.RemoveAll(dir)
	body := strings.Repeat("x", 180)
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(cfg.concurrency), "-j", "2",
		"-T", strconv.Itoa(max(1, int(cfg.compareDuration.Seconds())))}
	for i, c := range clients {
		script := strings.NewReplacer("{{HASH}}", hex.EncodeToString(c.hash), "{{PRINCIPAL}}", c.principal, "{{BODY}}", body).Replace(pgbenchScript)
		path := filepath.Join(dir, fmt.Sprintf("payment-%03d.sql", i))
		if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
			return 0, "", err
		}
		args = append(args, "-f", path)
	}
	appURL := cfg.appDatabaseURL
	if appURL == "" {
		appURL = database.WithUser(cfg.databaseURL, "payments_app")
	}
	pc, err := pgx.ParseConfig(appURL)
	if err != nil {
		return 0, "", err
	}
	fmt.Fprintf(progress, "pgbench: %d clients for %s, %s\n", cfg.concurrency, cfg.compareDuration, what)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "PGHOST="+pc.Host, "PGPORT="+strconv.Itoa(int(pc.Port)), "PGUSER="+pc.User,
		"PGDATABASE="+pc.Database, "PGPASSWORD="+pc.Password)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, "", fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	m := tpsLine.FindSubmatch(out)
	if m == nil {
		return 0, "", fmt.Errorf("pgbench: no tps in its output:\n%s", out)
	}
	if strings.Contains(string(out), "number of failed transactions: ") && !strings.Contains(string(out), "number of failed transactions: 0 ") {
		return 0, "", fmt.Errorf("pgbench: transactions failed:\n%s", out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	return tps, "", err
}
