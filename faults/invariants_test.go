package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The invariants are checked in Go, from each table read alone, since a
// Citus cluster refuses the joins they were written as. Each check finds
// the one thing broken in a snapshot that is otherwise whole, and nothing
// in the whole one.
func TestInvariantsFindWhatIsBroken(t *testing.T) {
	t.Parallel()
	whole := func() *snapshot {
		return &snapshot{
			payments: map[string]paymentRow{
				"p1": {status: "succeeded", amount: 1000, refunded: 300},
				"p2": {status: "processing", amount: 500},
				"p3": {status: "succeeded", amount: 700},
			},
			refunds: map[string]refundRow{
				"r1": {paymentID: "p1", status: "succeeded", amount: 200},
				"r2": {paymentID: "p1", status: "pending", amount: 100},
				"r3": {paymentID: "p1", status: "failed", amount: 50},
			},
			events: []eventRow{
				{"payment.succeeded", "p1"}, {"refund.succeeded", "r1"}, {"refund.failed", "r3"},
				// Labelled for reconciliation, then settled: both events stand.
				{"payment.requires_reconciliation", "p3"}, {"payment.succeeded", "p3"},
				{"webhook_endpoint.disabled", "w1"},
			},
			jobs: []jobRow{
				{kind: "charge_payment", state: "completed", objectID: "p1"},
				{kind: "refund_payment", state: "available", objectID: "r2", live: true},
				{kind: "charge_payment", state: "discarded", objectID: "p3"},
			},
			// p2's charge waits for the relay.
			waiting: map[string]bool{"p2": true},
		}
	}
	s := whole()
	missing, stray := eventChecks(s)
	require.Zero(t, missing)
	require.Zero(t, stray)
	require.Zero(t, overRefunded(s))
	require.Zero(t, jobless(s))
	require.Zero(t, orphaned(s))

	for _, tc := range []struct {
		name  string
		spoil func(*snapshot)
		count func(*snapshot) int
	}{
		{"refunded beyond the amount", func(s *snapshot) {
			s.payments["p3"] = paymentRow{status: "succeeded", amount: 700, refunded: 701}
		}, overRefunded},
		{"refunded out of step with the refunds", func(s *snapshot) {
			s.refunds["r4"] = refundRow{paymentID: "p1", status: "pending", amount: 1}
		}, overRefunded},
		{"a processing payment with no job", func(s *snapshot) { delete(s.waiting, "p2") }, jobless},
		{"a pending refund whose job finished", func(s *snapshot) {
			s.jobs[1] = jobRow{kind: "refund_payment", state: "completed", objectID: "r2"}
		}, jobless},
		{"a discarded job of a processing payment", func(s *snapshot) {
			s.jobs = append(s.jobs, jobRow{kind: "charge_payment", state: "discarded", objectID: "p2"})
		}, orphaned},
		{"a cancelled job of a pending refund", func(s *snapshot) {
			s.jobs = append(s.jobs, jobRow{kind: "refund_payment", state: "cancelled", objectID: "r2"})
		}, orphaned},
		{"a decided payment without its event", func(s *snapshot) { s.events = s.events[1:] }, func(s *snapshot) int {
			missing, _ := eventChecks(s)
			return missing
		}},
		{"an event of a payment that is not there", func(s *snapshot) {
			s.events = append(s.events, eventRow{"payment.succeeded", "p9"})
		}, strayEvents},
		{"an event of a status the payment never had", func(s *snapshot) {
			s.events = append(s.events, eventRow{"payment.failed", "p1"})
		}, strayEvents},
		{"an event of a status the refund never had", func(s *snapshot) {
			s.events = append(s.events, eventRow{"refund.succeeded", "r3"})
		}, strayEvents},
		{"one change recorded twice", func(s *snapshot) {
			s.events = append(s.events, eventRow{"refund.succeeded", "r1"})
		}, strayEvents},
	} {
		s := whole()
		tc.spoil(s)
		require.Equal(t, 1, tc.count(s), tc.name)
	}
}

func strayEvents(s *snapshot) int {
	_, stray := eventChecks(s)
	return stray
}
