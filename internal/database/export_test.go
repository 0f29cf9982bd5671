package database

import (
	"context"
	"time"
)

// ListLag exposes the list lag's collection to the package's external tests.
type ListLag struct{ h *horizonLag }

// NewListLag returns a list lag read through pool.
func NewListLag(pool *Pool) ListLag { return ListLag{&horizonLag{pool: pool}} }

// Collect samples at now and returns the lag.
func (l ListLag) Collect(ctx context.Context, now time.Time) (time.Duration, error) {
	return l.h.collect(ctx, now)
}
