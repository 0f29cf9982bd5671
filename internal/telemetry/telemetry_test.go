package telemetry_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/telemetry"
)

// Without an exporter, spans are not recorded but still have ids, which logs
// and stored keys rely on.
func TestSpansWithoutAnExporterHaveIDs(t *testing.T) {
	t.Parallel()
	tel, err := telemetry.Setup(context.Background(), "test", func(string) string { return "" })
	require.NoError(t, err)
	defer tel.Shutdown(context.Background())
	_, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "s")
	defer span.End()
	require.False(t, span.IsRecording())
	require.True(t, span.SpanContext().IsValid())
}
