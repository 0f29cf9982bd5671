package scenario_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
	"github.com/payments-reference/idempotent-payments/lab/scenario"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Every lesson the lab teaches is tested: the naive build breaks the way
// the lesson says, and this service's design holds. The scenarios share one
// database (they fill and empty idempotency_keys), so they run in order.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("-short skips it: the failure lab, about 15 s; the full test command (and CI) runs it")
	}
	t.Parallel()
	db := testdb.New(t, scenario.AppConns+scenario.MaintConns+scenario.AdminConns+2)
	redisAddr := os.Getenv("LAB_REDIS_ADDR")
	if redisAddr == "" {
		redisAddr = "127.0.0.1:6379"
	}
	ctx := context.Background()
	l, err := scenario.Open(ctx, scenario.Env{AdminURL: db.AdminURL, RedisAddr: redisAddr, Rows: 100_000, Concurrency: 16})
	require.NoError(t, err)
	t.Cleanup(l.Close)
	for _, s := range scenario.Scenarios {
		t.Run(s.Name, func(t *testing.T) {
			out, err := s.Run(ctx, l)
			require.NoError(t, err)
			t.Logf("naive: %s\nours:  %s", out.Naive, out.Ours)
			require.True(t, out.NaiveBroke, "the naive build did not break: %s", out.Naive)
			require.True(t, out.OursHeld, "ours did not hold: %s", out.Ours)
			require.Regexp(t, `^naive: .+; ours: .+`, out.Shown, "the lesson column says what the row showed")
		})
	}
}
