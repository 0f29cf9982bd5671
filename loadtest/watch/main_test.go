package main

import (
	"math"
	"strings"
	"testing"
)

// The service's own exposition, as its /metrics writes it, read into the
// figures the watch prints.
func TestParseAndQuantile(t *testing.T) {
	t.Parallel()
	text := `# HELP idempotency_claim_duration_seconds Time of the claim statement alone
# TYPE idempotency_claim_duration_seconds histogram
idempotency_claim_duration_seconds_bucket{endpoint="POST /v1/payments",otel_scope_name="x",le="0.0005"} 50
idempotency_claim_duration_seconds_bucket{endpoint="POST /v1/payments",otel_scope_name="x",le="0.001"} 90
idempotency_claim_duration_seconds_bucket{endpoint="POST /v1/payments",otel_scope_name="x",le="0.0025"} 100
idempotency_claim_duration_seconds_bucket{endpoint="POST /v1/payments",otel_scope_name="x",le="+Inf"} 100
idempotency_claim_duration_seconds_count{endpoint="POST /v1/payments",otel_scope_name="x"} 100
idempotency_keys_rows{otel_scope_name="x"} 1.5e+06
idempotency_keys_bytes{otel_scope_name="x"} 7.5e+08
idempotency_oldest_live_key_age_seconds{otel_scope_name="x"} 3600
`
	s, err := parse(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if s.claims != 100 || s.rows != 1.5e6 || s.bytes != 7.5e8 || s.oldest != 3600 {
		t.Fatalf("parsed %+v", s)
	}
	// The 50th sample is the 0.5 ms bucket's last; the 99th is 9/10 of the
	// way through the 1-2.5 ms bucket.
	if got := quantile(0.5, s.buckets); math.Abs(got-0.0005) > 1e-9 {
		t.Fatalf("p50 = %v", got)
	}
	if got := quantile(0.99, s.buckets); math.Abs(got-0.00235) > 1e-9 {
		t.Fatalf("p99 = %v", got)
	}
	if got := quantile(0.99, map[float64]float64{0.001: 0, math.Inf(1): 0}); !math.IsNaN(got) {
		t.Fatalf("no samples: %v", got)
	}
}
