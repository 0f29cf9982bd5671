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
