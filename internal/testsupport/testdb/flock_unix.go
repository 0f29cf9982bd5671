//go:build linux || darwin || freebsd || openbsd || netbsd || dragonfly

package testdb

import (
	"errors"
	"os"
	"syscall"
)

// errBusy means another holder has the lock.
var errBusy = errors.New("slot busy")

// slotLock is an flock(2) lock on one file. Locks belong to the open file,
// so two tests in one process exclude each other just as two processes do.
type slotLock struct{ f *os.File }

// lockFile locks path, waiting when wait is set and returning errBusy at once
// otherwise.
func lockFile(path string, wait bool) (*slotLock, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_EX
	if !wait {
		how |= syscall.LOCK_NB
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errBusy
		}
		return nil, err
	}
	return &slotLock{f: f}, nil
}

// unlock frees the lock; closing the file does it.
func (l *slotLock) unlock() { l.f.Close() }
