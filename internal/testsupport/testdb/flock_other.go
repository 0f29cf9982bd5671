//go:build !(linux || darwin || freebsd || openbsd || netbsd || dragonfly)

package testdb

import (
	"errors"
	"sync"
)

// errBusy means another holder has the lock.
var errBusy = errors.New("slot busy")

// Where flock(2) is missing, slots are locked within this process only: the
// budget then bounds each test binary, not the whole run. Run such suites
// with `go test -p 1` to keep the run inside the budget.
var (
	localMu    sync.Mutex
	localLocks = map[string]*sync.Mutex{}
)

// slotLock is a lock on one name in this process.
type slotLock struct{ mu *sync.Mutex }

func lockFile(path string, wait bool) (*slotLock, error) {
	localMu.Lock()
	mu, ok := localLocks[path]
	if !ok {
		mu = &sync.Mutex{}
		localLocks[path] = mu
	}
	localMu.Unlock()
	if wait {
		mu.Lock()
	} else if !mu.TryLock() {
		return nil, errBusy
	}
	return &slotLock{mu: mu}, nil
}

func (l *slotLock) unlock() { l.mu.Unlock() }
