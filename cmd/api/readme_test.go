package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testdb"
)

// The README's walk-through, run exactly as a reader pastes it (bash, at the
// repository's root, `go run ./cmd/api` included) against a started service:
// every status its comments show is the status the service answers, in order.
func TestREADMEWalkThroughRuns(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the walk-through needs curl (apt-get install curl)")
	}
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	block := walkThrough(t, string(raw))

	// The service pool (4), the outbox's (2), the maintenance pool (3), and
	// the owner connection of each `keys` command.
	db := testdb.New(t, 10)
	addr := freeAddr(t)
	vars := map[string]string{
		"ADDR": addr, "METRICS_ADDR": "off", "DB_MAX_CONNS": "4", "OUTBOX_DB_MAX_CONNS": "2",
		"DATABASE_URL": db.AppURL, "MIGRATE_DATABASE_URL": db.OwnerURL, "MAINTENANCE_DATABASE_URL": db.MaintenanceURL,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runLogging(ctx, nil, env(vars), io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	waitOK(t, "http://"+addr+"/readyz")

	sctx, stop := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stop()
	cmd := exec.CommandContext(sctx, "bash", "-e", "-c", block)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "BASE=http://"+addr)
	for k, v := range vars {
		if strings.HasSuffix(k, "DATABASE_URL") {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the walk-through failed:\n%s", out)

	status := regexp.MustCompile(`(?m)^HTTP/1\.1 (\d{3})`)
	shown := regexp.MustCompile(`(?m)^# HTTP/1\.1 (\d{3})`)
	require.Equal(t, matches(shown, block), matches(status, string(out)), "statuses the README shows vs. what the service answered; output:\n%s", out)
	require.Contains(t, string(out), `"principal":"acme"`, "keys list printed the key")
}

// walkThrough returns the first sh block after the README's walk-through
// heading.
func walkThrough(t *testing.T, readme string) string {
	t.Helper()
	_, after, ok := strings.Cut(readme, "## Walk-through with curl")
	require.True(t, ok, "no walk-through heading in README.md")
	_, after, ok = strings.Cut(after, "```sh\n")
	require.True(t, ok, "no sh block in the walk-through")
	block, _, ok := strings.Cut(after, "\n```")
	require.True(t, ok, "unterminated sh block")
	return block
}

func matches(re *regexp.Regexp, s string) []string {
	var got []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		got = append(got, m[1])
	}
	return got
}
