package processor_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/processor"
)

// Every kind of answer gets the verdict the money path relies on; above all,
// an unknown outcome is never NotMoved, even on the last attempt.
func TestJudge(t *testing.T) {
	t.Parallel()
	unknown := []error{
		errors.New("processor /v1/charges: status 503"),
		context.DeadlineExceeded,
		fmt.Errorf("processor /v1/charges: %w", errors.New("connection reset by peer")),
	}
	for _, err := range unknown {
		v, _ := processor.Judge(err, false)
		require.Equal(t, processor.Retry, v, "%v", err)
		v, reason := processor.Judge(err, true)
		require.Equal(t, processor.Unknown, v, "%v on the last attempt", err)
		require.Empty(t, reason)
	}
	for _, tc := range []struct {
		err     error
		verdict processor.Verdict
		reason  string
	}{
		{nil, processor.Moved, ""},
		{&processor.DeclineError{Reason: "card_declined"}, processor.NotMoved, "card_declined"},
		{fmt.Errorf("charge: %w", &processor.RejectedError{Status: 400}), processor.NotMoved, processor.ReasonRejected},
		{processor.ErrNoRecord, processor.NotMoved, processor.ReasonNoRecord},
	} {
		for _, last := range []bool{false, true} {
			v, reason := processor.Judge(tc.err, last)
			require.Equal(t, tc.verdict, v, "%v (last %t)", tc.err, last)
			require.Equal(t, tc.reason, reason, "%v (last %t)", tc.err, last)
		}
	}
}
