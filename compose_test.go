package idempotentpayments_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// There is no Docker engine on the project's machines, so docker-compose.yml
// cannot be run in CI; this at least proves it parses, pins every image, and
// wires the services to each other the way the README says.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Build       string            `yaml:"build"`
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			Volumes     []string          `yaml:"volumes"`
			Restart     string            `yaml:"restart"`
			Profiles    []string          `yaml:"profiles"`
			Command     []string          `yaml:"command"`
			DependsOn   map[string]struct {
				Condition string `yaml:"condition"`
			} `yaml:"depends_on"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	raw, err := os.ReadFile("docker-compose.yml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &compose))

	for _, name := range []string{"postgres", "api", "redis", "jaeger", "prometheus", "grafana"} {
		require.Contains(t, compose.Services, name)
	}
	for name, s := range compose.Services {
		if s.Build != "" {
			continue
		}
		_, tag, ok := strings.Cut(s.Image, ":")
		require.True(t, ok && tag != "" && tag != "latest", "service %s: image %q must have a pinned tag", name, s.Image)
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./") {
				_, err := os.Stat(src)
				require.NoError(t, err, "service %s mounts %s", name, src)
			}
		}
	}
	// Beside the local servers the README assumes, not on their ports.
	require.NotContains(t, compose.Services["postgres"].Ports, "5432:5432")
	require.NotContains(t, compose.Services["redis"].Ports, "6379:6379")
	require.Contains(t, compose.Services["postgres"].Healthcheck.Test, "-h", "pg_isready over TCP")
	require.Equal(t, []string{"CMD", "/api", "healthcheck"}, compose.Services["api"].Healthcheck.Test)
	require.Equal(t, "unless-stopped", compose.Services["api"].Restart)
	require.Contains(t, compose.Services["jaeger"].Ports, "4318:4318")
	_, err = os.Stat(".dockerignore")
	require.NoError(t, err)

	api := compose.Services["api"].Environment
	require.Equal(t, "http://jaeger:4318", api["OTEL_EXPORTER_OTLP_ENDPOINT"])
	require.Equal(t, ":9090", api["METRICS_ADDR"])
	for _, url := range []string{"DATABASE_URL", "MAINTENANCE_DATABASE_URL"} {
		require.Contains(t, api[url], "@postgres:5432/payments")
	}
	// The serving process holds no owner credentials: migrations are a
	// one-shot service the API waits for.
	require.Empty(t, api["MIGRATE_DATABASE_URL"])
	require.Equal(t, "false", api["MIGRATE_ON_START"])
	migrate := compose.Services["migrate"]
	require.Equal(t, []string{"migrate", "up"}, migrate.Command)
	require.Contains(t, migrate.Environment["MIGRATE_DATABASE_URL"], "@postgres:5432/payments")
	require.Equal(t, "service_completed_successfully", compose.Services["api"].DependsOn["migrate"].Condition)

	// The citus profile: off by default, the cluster joined, migrated and
	// distributed before its API starts, which holds no owner credentials.
	for _, name := range []string{"citus-coordinator", "citus-worker-1", "citus-worker-2", "citus-cluster", "citus-migrate", "citus-api"} {
		require.Equal(t, []string{"citus"}, compose.Services[name].Profiles, "service %s", name)
	}
	for name, s := range compose.Services {
		if !strings.HasPrefix(name, "citus-") {
			require.Empty(t, s.Profiles, "service %s starts with a plain `docker compose up`", name)
		}
	}
	require.Equal(t, "service_completed_successfully", compose.Services["citus-migrate"].DependsOn["citus-cluster"].Condition)
	require.Equal(t, "service_completed_successfully", compose.Services["citus-api"].DependsOn["citus-migrate"].Condition)
	require.Contains(t, compose.Services["citus-migrate"].Environment["MIGRATE_DATABASE_URL"], "@citus-coordinator:5432/")
	citusAPI := compose.Services["citus-api"].Environment
	require.Empty(t, citusAPI["MIGRATE_DATABASE_URL"])
	require.Equal(t, "false", citusAPI["MIGRATE_ON_START"])
	require.Contains(t, citusAPI["DATABASE_URL"], "payments_app@citus-coordinator:5432/")
	// citus-migrate distributes too (migrations/citus.sql, which
	// TestPaymentsOnCitus runs on a real cluster): every tenant table by
	// principal, colocated with payments; the tables a request
	// authenticates with, copied to every worker.
	distribute, err := os.ReadFile("migrations/citus.sql")
	require.NoError(t, err)
	require.Contains(t, string(distribute), "SELECT create_distributed_table('payments', 'principal_id')")
	// Every other table it distributes is colocated with payments (which
	// tables: TestEveryStatementRoutesToOnePartition lists them).
	require.Equal(t, strings.Count(string(distribute), "SELECT create_distributed_table("),
		1+strings.Count(string(distribute), "', 'principal_id', colocate_with => 'payments')"))
	for _, table := range []string{"idempotency_keys", "idempotency_key_usage", "outbox_jobs"} {
		require.Contains(t, string(distribute), "SELECT create_distributed_table('"+table+"', 'principal_id', colocate_with => 'payments')")
	}
	for _, table := range []string{"principals", "api_keys"} {
		require.Contains(t, string(distribute), "SELECT create_reference_table('"+table+"')")
	}
	require.Contains(t, string(distribute), "citus.propagate_set_commands = 'local'")

	prom, err := os.ReadFile("docker/prometheus.yml")
	require.NoError(t, err)
	require.Contains(t, string(prom), "api:9090")
	require.Contains(t, string(prom), "/etc/prometheus/rules.yml")
	require.Contains(t, compose.Services["prometheus"].Volumes, "./docker/prometheus-rules.yml:/etc/prometheus/rules.yml:ro")
	rules, err := os.ReadFile("docker/prometheus-rules.yml")
	require.NoError(t, err)
	require.Contains(t, string(rules), "reconciliation_oldest_waiting_age_seconds", "an alert on what waits for reconciliation")
}

// The provisioned dashboard parses and queries only metrics the service
// exports (their names are checked against /metrics in cmd/api's TestServe).
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("docker/grafana/dashboards/idempotency.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	exported := []string{
		"idempotency_claim_duration_seconds_bucket", "idempotency_keys_rows", "idempotency_keys_bytes",
		"idempotency_requests_total", "idempotency_sweeper_deleted_rows_total", "idempotency_sweeper_last_run_timestamp_seconds",
		"idempotency_oldest_live_key_age_seconds",
		"http_server_request_duration_seconds_bucket",
	}
	var queries []string
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			queries = append(queries, target.Expr)
		}
	}
	all := strings.Join(queries, "\n")
	for _, m := range exported {
		require.Contains(t, all, m)
	}
	require.Contains(t, all, "histogram_quantile(0.99", "claim p99 is on the dashboard")
}
