package idempotentpayments_test

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/payments-reference/idempotent-payments"

// imports lists, for every package of the module, the packages it imports
// directly (tests excluded), with go list.
func imports(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`}, patterns...)
	out, err := exec.Command("go", args...).Output()
	require.NoError(t, err)
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		m[strings.TrimPrefix(f[0], module+"/")] = f[1:]
	}
	return m
}

// The dependency rules of docs/external-effects.md ("Layering"): handlers
// parse and render and never reach the processor or the queue; domain
// packages never reach HTTP handling, nor events and webhooks (they hand
// their settles to payments.Announcer, so that a fork can take events out:
// docs/fork.md); the processor boundary depends on nothing of ours; nothing
// imports a command or a test helper.
func TestImportRules(t *testing.T) {
	t.Parallel()
	all := imports(t, module+"/...")
	forbidden := map[string][]string{
		"internal/httpapi":     {module + "/internal/processor", "github.com/riverqueue/"},
		"internal/payments":    {module + "/internal/httpapi", "net/http", module + "/internal/events", module + "/internal/webhooks"},
		"internal/refunds":     {module + "/internal/httpapi", "net/http", module + "/internal/events", module + "/internal/webhooks"},
		"internal/idempotency": {module + "/internal/httpapi", module + "/internal/payments", module + "/internal/refunds", "net/http"},
		"internal/outbox":      {module + "/internal/httpapi", module + "/internal/payments", module + "/internal/refunds", module + "/internal/processor"},
		"internal/processor":   {module + "/internal/"},
		"internal/reconcile":   {module + "/internal/httpapi", "net/http", module + "/internal/events", module + "/internal/webhooks"},
		"internal/events":      {module + "/internal/httpapi", module + "/internal/refunds", module + "/internal/webhooks", "net/http"},
		"internal/webhooks":    {module + "/internal/httpapi", module + "/internal/payments", module + "/internal/refunds"},
		"internal/database":    {module + "/internal/"},
	}
	for pkg, imps := range all {
		for _, imp := range imps {
			for _, bad := range forbidden[pkg] {
				require.False(t, strings.HasPrefix(imp, bad), "%s must not import %s", pkg, imp)
			}
			if strings.HasPrefix(pkg, "internal/") && !strings.HasPrefix(pkg, "internal/testsupport/") {
				for _, bad := range []string{module + "/cmd/", module + "/loadtest", module + "/faults", module + "/examples", module + "/internal/testsupport/"} {
					require.False(t, strings.HasPrefix(imp, bad), "%s must not import %s", pkg, imp)
				}
			}
		}
	}
	require.Contains(t, all, "internal/httpapi", "go list saw the packages")
}

// The production binary carries no test helper, fault injector, lab, load
// test or benchmark-only code, nor their dependencies (plots, Redis).
func TestProductionBinaryDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", module+"/cmd/api").Output()
	require.NoError(t, err)
	deps := string(out)
	require.Contains(t, deps, module+"/internal/httpapi\n")
	for _, bad := range []string{
		module + "/internal/testsupport/", module + "/lab", module + "/loadtest", module + "/faults",
		"github.com/stretchr/testify", "github.com/testcontainers/", "gonum.org/", "github.com/redis/go-redis",
	} {
		require.NotContains(t, deps, bad)
	}
}

// Batching has one door (docs/architecture.md, "Statements are values"):
// domain packages return database.Statements, and only internal/database
// turns them into a pgx batch, so that no domain function's signature is
// shaped by the round trip it travels in.
func TestOnlyTheDatabasePackageBuildsBatches(t *testing.T) {
	t.Parallel()
	var seen, batching []string
	for _, root := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case d.IsDir() && path == filepath.Join("internal", "testsupport"):
				return filepath.SkipDir
			case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
				return nil
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			seen = append(seen, path)
			if bytes.Contains(src, []byte("pgx.Batch")) && filepath.Dir(path) != filepath.Join("internal", "database") {
				batching = append(batching, path)
			}
			return nil
		})
		require.NoError(t, err)
	}
	require.Contains(t, seen, filepath.Join("internal", "payments", "payments.go"), "the walk saw the service")
	require.Empty(t, batching, "build batches with database.Send: return database.Statements instead")
}
