package webhooks

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
)

const instrumentationName = "github.com/payments-reference/idempotent-payments/internal/webhooks"

// NewAttemptCounter returns webhook_deliveries_total, the Deliverer's count
// of attempts by outcome (delivered, gone, failed).
func NewAttemptCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	c, err := mp.Meter(instrumentationName).Int64Counter("webhook_deliveries",
		metric.WithDescription("Webhook delivery attempts by outcome: delivered (2xx), gone (410: the endpoint is disabled), failed (anything else; tried again on the schedule)."))
	if err != nil {
		return nil, fmt.Errorf("webhook deliveries counter: %w", err)
	}
	return c, nil
}

// RegisterMetrics reports webhook_oldest_undelivered_age_seconds: how long
// the oldest delivery still to be made (waiting, running, or between
// attempts) has existed; 0 when none. Read from River's table with pool
// (the maintenance role), cached for ttl.
func RegisterMetrics(mp metric.MeterProvider, pool *database.Pool, ttl time.Duration) error {
	var (
		mu   sync.Mutex
		at   time.Time
		last float64
	)
	_, err := mp.Meter(instrumentationName).Float64ObservableGauge("webhook_oldest_undelivered_age_seconds",
		metric.WithDescription("Age of the oldest webhook delivery not yet made (its event's job still waits, runs, or retries); 0 when none."),
		metric.WithFloat64Callback(func(ctx context.Context, o metric.Float64Observer) error {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(at) >= ttl {
				err := pool.WithConn(ctx, func(c database.DBTX) (err error) {
					last, err = outbox.OldestUnfinished(ctx, c, deliveryKind)
					return err
				})
				if err != nil {
					return nil // no observation: the gauge is absent, not wrong
				}
				at = time.Now()
			}
			o.Observe(last)
			return nil
		}))
	if err != nil {
		return fmt.Errorf("webhook gauge: %w", err)
	}
	return nil
}
