package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// A table never analysed has no row estimate (reltuples = -1): the rows
// gauge counts instead of reading 0 for a table that has rows.
func TestRowsGaugeOfANeverAnalysedTable(t *testing.T) {
	t.Parallel()
	b := setupSweep(t, 100)
	b.insertKeys(t, "k", 11, time.Hour)
	var reltuples float64
	require.NoError(t, b.admin.QueryRow(context.Background(), `SELECT reltuples FROM pg_class WHERE oid = 'idempotency_keys'::regclass`).Scan(&reltuples))
	require.EqualValues(t, -1, reltuples, "the table was analysed: the test would prove nothing")

	reader := sdkmetric.NewManualReader()
	require.NoError(t, idempotency.RegisterStoreMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), b.maint, 0))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var rows int64 = -1
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "idempotency_keys_rows" {
				rows = g.DataPoints[0].Value
			}
		}
	}
	require.EqualValues(t, 11, rows)
}

// The oldest live key's age is the oldest over every principal (the gauge
// reads one index entry per principal), and an expired key does not count.
func TestOldestLiveKeyGauge(t *testing.T) {
	t.Parallel()
	b := setupSweep(t, 100)
	ctx := context.Background()
	b.insertKeys(t, "live-", 100, time.Hour)       // created 24 h ago, live
	b.insertKeys(t, "expired-", 100, -time.Minute) // created 25 h ago, expired
	// One principal's key, older than every other and still live.
	_, err := b.admin.Exec(ctx, `
		INSERT INTO idempotency_keys (principal_id, endpoint, key, state, fingerprint, response_status, response_content_type, response_body, correlation_id, created_at, expires_at)
		SELECT id, 'POST /v1/payments', 'oldest', 'completed', sha256(''), 201, 'application/json', '{}', 'req', now() - interval '30 hours', now() + interval '1 minute'
		FROM principals WHERE name LIKE 'sweep-%' ORDER BY id DESC LIMIT 1`)
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	require.NoError(t, idempotency.RegisterStoreMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), b.maint, 0))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	age := -1.0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if g, ok := m.Data.(metricdata.Gauge[float64]); ok && m.Name == "idempotency_oldest_live_key_age_seconds" {
				age = g.DataPoints[0].Value
			}
		}
	}
	require.InDelta(t, (30 * time.Hour).Seconds(), age, 60, "the oldest live key is 30 h old")
}
