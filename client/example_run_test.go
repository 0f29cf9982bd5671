package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/client"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// The package example, run against the real service (the api binary, its
// database, its in-process processor simulator), prints what it says.
func TestExampleAgainstTheService(t *testing.T) {
	t.Parallel()
	// The service pool (2), its maintenance pool (2), the outbox's pool
	// (River's producer and maintenance, 2), and the owner connection of
	// `keys create`.
	db := testdb.New(t, 8)
	dir := t.TempDir()
	bin := filepath.Join(dir, "api")
	build := exec.Command("go", "build", "-o", bin, "github.com/payments-reference/idempotent-payments/cmd/api")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build cmd/api: %s", out)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	env := append(os.Environ(), "ADDR="+addr, "METRICS_ADDR=off", "DB_MAX_CONNS=2", "OUTBOX_WORKERS=2", "OUTBOX_DB_MAX_CONNS=2", "LOG_LEVEL=warn",
		"DATABASE_URL="+db.AppURL, "MIGRATE_DATABASE_URL="+db.OwnerURL, "MAINTENANCE_DATABASE_URL="+db.MaintenanceURL)

	keys := exec.Command(bin, "keys", "create", "--principal", "example", "--scopes", "payments:read,payments:write,refunds:write")
	keys.Env = env
	out, err = keys.Output()
	require.NoError(t, err)
	var key struct{ Secret string }
	require.NoError(t, json.Unmarshal(out, &key))

	var log bytes.Buffer
	serve := exec.Command(bin)
	serve.Env, serve.Stdout, serve.Stderr = env, &log, &log
	require.NoError(t, serve.Start())
	t.Cleanup(func() {
		_ = serve.Process.Signal(os.Interrupt)
		_ = serve.Wait()
		if t.Failed() {
			t.Logf("service log:\n%s", log.String())
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "the service never became ready")

	c, err := client.New("http://"+addr, key.Secret)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var printed bytes.Buffer
	require.NoError(t, payAndRefund(ctx, c, &printed))
	require.Equal(t, "payment processing livemode false\npayment succeeded\nrefund pending 1000\n", printed.String())
}
