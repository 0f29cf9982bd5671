package testdb

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func testBudget(t *testing.T, size int) *budget {
	t.Helper()
	return &budget{dir: t.TempDir(), size: size}
}

// acquireAsync asks b for n slots in another goroutine and delivers the
// release function once they are held.
func acquireAsync(t *testing.T, b *budget, n int) <-chan func() {
	got := make(chan func(), 1)
	go func() {
		release, err := b.acquire(n)
		if err != nil {
			t.Error(err)
			release = func() {}
		}
		got <- release
	}()
	return got
}

// A request waits while the others hold too many slots, and goes on as soon
// as enough are freed.
func TestBudgetWaitsForSlots(t *testing.T) {
	t.Parallel()
	b := testBudget(t, 3)
	releaseFirst, err := b.acquire(2)
	require.NoError(t, err)

	got := acquireAsync(t, b, 2)
	select {
	case <-got:
		t.Fatal("4 slots held out of a budget of 3")
	case <-time.After(200 * time.Millisecond):
	}
	releaseFirst()
	select {
	case release := <-got:
		release()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request did not get its slots after they were freed")
	}
}

func TestBudgetRefusesARequestLargerThanItself(t *testing.T) {
	t.Parallel()
	_, err := testBudget(t, 3).acquire(4)
	require.ErrorContains(t, err, "TEST_DB_CONNECTIONS")
}

// Slots are held across processes: what another process holds is not
// handed out here, and is as soon as that process dies.
func TestBudgetIsSharedWithOtherProcesses(t *testing.T) {
	t.Parallel()
	b := testBudget(t, 1)
	slot := filepath.Join(b.dir, "slot-0")
	// The other process is this test binary, running holdSlot.
	holder := exec.Command(os.Args[0], "-test.run=^TestHoldSlot$")
	holder.Env = append(os.Environ(), "TESTDB_HOLD_SLOT="+slot)
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	require.Eventually(t, func() bool {
		l, err := lockFile(slot, false)
		if err == nil {
			l.unlock()
		}
		return err == errBusy
	}, 10*time.Second, 10*time.Millisecond, "the other process took the slot")

	got := acquireAsync(t, b, 1)
	select {
	case <-got:
		t.Fatal("a slot held by another process was handed out")
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, holder.Process.Kill())
	_ = holder.Wait()
	select {
	case release := <-got:
		release()
	case <-time.After(10 * time.Second):
		t.Fatal("the slot was not handed out after its holder died")
	}
}

// TestHoldSlot is the other process of TestBudgetIsSharedWithOtherProcesses:
// with TESTDB_HOLD_SLOT set it locks that slot and waits to be killed;
// otherwise it returns at once.
func TestHoldSlot(t *testing.T) {
	slot := os.Getenv("TESTDB_HOLD_SLOT")
	if slot == "" {
		return
	}
	_, err := lockFile(slot, true)
	require.NoError(t, err)
	time.Sleep(time.Minute)
}
