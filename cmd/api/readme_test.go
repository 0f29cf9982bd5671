package main

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// The README's walk-through, run exactly as a reader pastes it (bash, at the
// repository's root, `go run ./cmd/api` included) against a started service:
// every status its comments show is the status the service answers, in order.
func TestREADMEWalkThroughRuns(t *testing.T) {
	t.Parallel()
	block := readmeBlock(t, "## Walk-through with curl")
	addr, vars, _ := startForREADME(t, 0)
	out := paste(t, block, vars, "BASE=http://"+addr)

	status := regexp.MustCompile(`(?m)^HTTP/1\.1 (\d{3})`)
	shown := regexp.MustCompile(`(?m)^# HTTP/1\.1 (\d{3})`)
	require.Equal(t, matches(shown, block), matches(status, out), "statuses the README shows vs. what the service answered; output:\n%s", out)
	require.Contains(t, out, `"principal":"acme"`, "keys list printed the key")
}

// The README's webhook walk-through, pasted twice as a reader might: the
// receiver is listening before the first delivery, so attempt 1 is the one
// that succeeds (it once raced `go run`'s compile and failed with
// "connection refused"); the second paste finds the receiver's database
// already there; each paste stops the receiver it started.
func TestREADMEWebhookWalkThroughRuns(t *testing.T) {
	t.Parallel()
	block := readmeBlock(t, "## Receiving webhooks")
	// The receiver's pool (pgxpool's least, 4) and a psql at a time.
	addr, vars, db := startForREADME(t, 5)
	receiverDB := "readme_receiver_" + strings.TrimPrefix(addr, "127.0.0.1:")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, database.DropDatabase(ctx, db.AdminURL, receiverDB))
	})
	receiver := freeAddr(t)
	pg, err := url.Parse(db.AdminURL) // a superuser, as the README's PG is
	require.NoError(t, err)
	pg.Path, pg.RawQuery = "", ""
	for i := range 2 {
		out := paste(t, block, vars, "BASE=http://"+addr, "PG="+pg.String(), "RECEIVER="+receiver, "RECEIVER_DB="+receiverDB)
		require.Contains(t, out, `"attempt":1,"status_code":200`, "paste %d: the first delivery was not the one taken; output:\n%s", i+1, out)
		require.Contains(t, out, "msg=applied", "paste %d: the receiver did not apply the event; output:\n%s", i+1, out)
		require.Contains(t, out, `"type":"payment.succeeded"`, "paste %d; output:\n%s", i+1, out)
		_, err := net.DialTimeout("tcp", receiver, time.Second)
		require.Error(t, err, "paste %d left the receiver running", i+1)
	}
}

// The README's walk-throughs on a Citus cluster (issue #33), pasted as on
// one server, against a service on the coordinator: every status the same,
// and the webhook delivered and applied by the example receiver; then, on
// the same cluster, what they do not show: a receiver that answers 410, and
// the sweepers.
func TestREADMEWalkThroughsRunOnCitus(t *testing.T) {
	c := startCitus(t, 26372)
	block := readmeBlock(t, "## Walk-through with curl")
	addr, vars := startServiceForREADME(t, c.url("payments_app"), c.url("postgres"), c.url("payments_maintenance"))
	out := paste(t, block, vars, "BASE=http://"+addr)

	status := regexp.MustCompile(`(?m)^HTTP/1\.1 (\d{3})`)
	shown := regexp.MustCompile(`(?m)^# HTTP/1\.1 (\d{3})`)
	require.Equal(t, matches(shown, block), matches(status, out), "statuses the README shows vs. what the service on Citus answered; output:\n%s", out)

	// The receiver keeps its own database on the coordinator, a plain one.
	receiver := freeAddr(t)
	pg, err := url.Parse(c.url("postgres"))
	require.NoError(t, err)
	pg.Path, pg.RawQuery = "", ""
	out = paste(t, readmeBlock(t, "## Receiving webhooks"), vars, "BASE=http://"+addr, "PG="+pg.String(),
		"RECEIVER="+receiver, "RECEIVER_DB=readme_receiver")
	require.Contains(t, out, `"attempt":1,"status_code":200`, "the first delivery was not the one taken; output:\n%s", out)
	require.Contains(t, out, "msg=applied", "the receiver did not apply the event; output:\n%s", out)
	c.goneEndpointAndSweep(t, addr, env(vars))
	c.requireOneShard(t)
}

// startForREADME starts the service on a database of its own and returns
// where it listens, the settings a pasted `go run ./cmd/api keys` needs,
// and the database; extra reserves connections for what the block starts.
func startForREADME(t *testing.T, extra int) (string, map[string]string, testdb.DB) {
	t.Helper()
	// The service pool (4), the outbox's (2), the maintenance pool (3), and
	// the owner connection of each `keys` command.
	db := testdb.New(t, 10+extra)
	addr, vars := startServiceForREADME(t, db.AppURL, db.OwnerURL, db.MaintenanceURL)
	return addr, vars, db
}

// startServiceForREADME starts the service on the database the three URLs
// name and returns where it listens and the settings a pasted `go run
// ./cmd/api keys` needs.
func startServiceForREADME(t *testing.T, appURL, ownerURL, maintenanceURL string) (string, map[string]string) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the walk-through needs curl (apt-get install curl)")
	}
	addr := freeAddr(t)
	vars := map[string]string{
		"ADDR": addr, "METRICS_ADDR": "off", "DB_MAX_CONNS": "4", "OUTBOX_DB_MAX_CONNS": "2",
		"DATABASE_URL": appURL, "MIGRATE_DATABASE_URL": ownerURL, "MAINTENANCE_DATABASE_URL": maintenanceURL,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runLogging(ctx, nil, env(vars), io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	waitOK(t, "http://"+addr+"/readyz")
	return addr, vars
}

// paste runs block in bash -e at the repository's root, with the service's
// database settings and extra in its environment, and returns its output.
func paste(t *testing.T, block string, vars map[string]string, extra ...string) string {
	t.Helper()
	ctx, stop := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stop()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", block)
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), extra...)
	for k, v := range vars {
		if strings.HasSuffix(k, "DATABASE_URL") {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	// Its own process group, so that what it started in the background (the
	// receiver) is ended with it when it fails or times out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	require.NoError(t, err, "the pasted block failed:\n%s", out)
	return string(out)
}

// readmeBlock returns the first sh block after the README's heading.
func readmeBlock(t *testing.T, heading string) string {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	require.True(t, ok, "no %q heading in README.md", heading)
	_, after, ok = strings.Cut(after, "```sh\n")
	require.True(t, ok, "no sh block after %q", heading)
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

// Every README block that talks to a running service ($BASE) is one of the
// blocks above, which the tests paste; a new one must join them.
func TestEveryREADMEBlockAgainstTheServiceIsRun(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	tested := map[string]bool{"## Walk-through with curl": true, "## Receiving webhooks": true}
	heading := ""
	for _, part := range strings.Split(string(raw), "\n```") {
		if i := strings.LastIndex(part, "\n## "); i >= 0 {
			heading, _, _ = strings.Cut(part[i+1:], "\n")
		}
		if strings.HasPrefix(part, "sh\n") && strings.Contains(part, "$BASE") {
			require.True(t, tested[heading], "README's block under %q uses $BASE but no test pastes it", heading)
		}
	}
}
