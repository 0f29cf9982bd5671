package database_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// What StorableText returns, PostgreSQL stores in a column bounded to n
// characters, whatever came in: invalid UTF-8, U+0000, multi-byte
// characters across the cut.
func TestStorableTextIsStored(t *testing.T) {
	t.Parallel()
	pool := openPool(t)
	ctx := context.Background()
	for _, in := range []string{
		"plain", "", strings.Repeat("é", 600), strings.Repeat("a", 499) + "€uro",
		"bad \xff\xfe bytes", "nul \x00 inside", strings.Repeat("\xe2\x82", 300),
	} {
		out := database.StorableText(in, 500)
		require.True(t, utf8.ValidString(out), "%q", in)
		require.LessOrEqual(t, utf8.RuneCountInString(out), 500, "%q", in)
		var got string
		require.NoError(t, pool.WithConn(ctx, func(c database.DBTX) error {
			return c.QueryRow(ctx, `SELECT v FROM (SELECT $1::text AS v) s WHERE length(v) <= 500`, out).Scan(&got)
		}), "%q", in)
		require.Equal(t, out, got)
	}
	require.Equal(t, "plain", database.StorableText("plain", 500))
	require.Equal(t, "ab", database.StorableText("abc", 2))
}
