package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// apiProcess is the service binary, run as users run it, so that a kill -9
// kills what production would lose.
type apiProcess struct {
	bin  string
	env  []string
	addr string
	log  *os.File
	cmd  *exec.Cmd
	done chan struct{}
}

// buildAPI compiles cmd/api into dir.
func buildAPI(ctx context.Context, dir string, progress io.Writer) (string, error) {
	bin := filepath.Join(dir, "api")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/payments-reference/idempotent-payments/cmd/api")
	build.Stderr = progress
	if err := build.Run(); err != nil {
		return "", fmt.Errorf("build cmd/api: %w", err)
	}
	return bin, nil
}

// newAPI prepares a process on a free loopback port; its log goes to logPath.
func newAPI(bin, logPath string, env []string) (*apiProcess, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	// The suite measures faults, not rate limits: its many clients share one
	// address and a few principals. (A later value of env wins.)
	env = append([]string{"RATE_LIMIT=0", "RATE_LIMIT_UNAUTHENTICATED=0"}, env...)
	return &apiProcess{bin: bin, env: append(env, "ADDR="+addr), addr: addr, log: log}, nil
}

// URL is the API's base URL.
func (a *apiProcess) URL() string { return "http://" + a.addr }

// start runs the binary and waits until /readyz answers 200.
func (a *apiProcess) start(ctx context.Context) error {
	cmd := exec.Command(a.bin, "serve")
	cmd.Env = append(os.Environ(), a.env...)
	cmd.Stdout, cmd.Stderr = a.log, a.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start api: %w", err)
	}
	a.cmd, a.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(a.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-a.done:
			return errors.New("api exited while starting; see its log")
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.URL()+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("api not ready after 30 s")
}

// kill9 ends the process the way a crash or the OOM killer does: no
// shutdown, no rollback sent, sockets closed by the kernel.
func (a *apiProcess) kill9() {
	_ = a.cmd.Process.Kill() // SIGKILL on Unix
	<-a.done
}

// stop shuts the process down gracefully, or kills it after a grace period.
func (a *apiProcess) stop() {
	if a.cmd != nil {
		_ = a.cmd.Process.Signal(os.Interrupt)
		select {
		case <-a.done:
		case <-time.After(20 * time.Second):
			a.kill9()
		}
	}
	a.log.Close()
}
