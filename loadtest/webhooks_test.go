package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// The load test names the deliveries' kind itself, to build without the
// webhooks package in a fork that takes it out; it is the service's.
func TestDeliveryKind(t *testing.T) {
	t.Parallel()
	require.Equal(t, webhooks.DeliveryArgs{}.Kind(), deliveryKind)
}
