package testdb

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// DefaultBudget is how many connections one run of the whole test suite
// holds on the server at most, across every package's test binary, unless
// TEST_DB_CONNECTIONS says otherwise. It leaves room on a server with
// max_connections = 100 where another process holds 50, and on a server with
// max_connections = 50 that is otherwise quiet.
const DefaultBudget = 40

// budget hands out connection slots to tests, across processes.
//
// `go test ./...` runs several test binaries at once (one per package, up to
// GOMAXPROCS of them), and each runs up to GOMAXPROCS parallel tests, so on a
// big machine the tests could open hundreds of connections. A counter in one
// process cannot bound that; slot files locked with flock(2) can: every slot
// is a file in a directory named for the server, a test holds one lock per
// connection it may open, and the kernel drops a dead process's locks, so a
// crashed or killed test never leaks a slot.
//
// A test that needs n slots takes the gate file first and keeps it until it
// holds all n, so small requests cannot starve a large one, and two large
// ones never deadlock each holding half of what the other needs.
type budget struct {
	dir  string
	size int
}

// newBudget returns the budget for the server at hostPort, with size slots.
func newBudget(hostPort string, size int) (*budget, error) {
	sum := sha256.Sum256([]byte(hostPort))
	dir := filepath.Join(os.TempDir(), "idempotent-payments-test-slots-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("connection budget: %w", err)
	}
	return &budget{dir: dir, size: size}, nil
}

// budgetSize reads TEST_DB_CONNECTIONS.
func budgetSize() (int, error) {
	v := os.Getenv("TEST_DB_CONNECTIONS")
	if v == "" {
		return DefaultBudget, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < minConns {
		return 0, fmt.Errorf("TEST_DB_CONNECTIONS=%q: want a whole number of at least %d", v, minConns)
	}
	return n, nil
}

// maxBudgetWait bounds how long a test waits for its slots; past it the
// suite is wedged (or the budget far too small) and the test says so.
const maxBudgetWait = 10 * time.Minute

// acquire blocks until n slots are held and returns the function that frees
// them.
func (b *budget) acquire(n int) (release func(), err error) {
	if n > b.size {
		return nil, fmt.Errorf("a test asks for %d connections but the whole run may hold only %d (TEST_DB_CONNECTIONS)", n, b.size)
	}
	gate, err := lockFile(filepath.Join(b.dir, "gate"), true)
	if err != nil {
		return nil, fmt.Errorf("connection budget gate: %w", err)
	}
	defer gate.unlock()

	var held []*slotLock
	release = func() {
		for _, l := range held {
			l.unlock()
		}
	}
	deadline := time.Now().Add(maxBudgetWait)
	for {
		for i := 0; i < b.size && len(held) < n; i++ {
			l, err := lockFile(filepath.Join(b.dir, "slot-"+strconv.Itoa(i)), false)
			if err == errBusy {
				continue
			}
			if err != nil {
				release()
				return nil, fmt.Errorf("connection budget slot: %w", err)
			}
			held = append(held, l)
		}
		if len(held) == n {
			return release, nil
		}
		if time.Now().After(deadline) {
			release()
			return nil, fmt.Errorf("waited %s for %d of %d connection slots in %s: other tests hold the rest", maxBudgetWait, n, b.size, b.dir)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
