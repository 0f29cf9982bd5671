package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// limitedScript starts and stops a PostgreSQL of the load test's own inside
// a memory limit (a memory cgroup, page cache included). It is a script, not
// Go, so that a reader can run the same server by hand for pgbench or psql.
const limitedScript = "scripts/limited-postgres"

// startLimited starts a PostgreSQL inside memory bytes and returns its
// superuser URL and a function that stops it and deletes its files. It runs
// from the repository's root, where `go run ./loadtest` is run.
func startLimited(ctx context.Context, memory int64, progress io.Writer) (url string, stop func(), err error) {
	script, err := filepath.Abs(limitedScript)
	if err != nil {
		return "", nil, err
	}
	if _, err := os.Stat(script); err != nil {
		return "", nil, fmt.Errorf("-memory starts PostgreSQL with %s: run the load test from the repository's root (%w)", limitedScript, err)
	}
	do := func(ctx context.Context, verb string, env ...string) (string, error) {
		cmd := exec.CommandContext(ctx, script, verb)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = progress
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", limitedScript, verb, err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	// A server left by an interrupted run is ours to remove.
	if _, err := do(ctx, "down"); err != nil {
		return "", nil, err
	}
	stop = func() {
		if _, err := do(context.WithoutCancel(ctx), "down"); err != nil {
			fmt.Fprintln(progress, err)
		}
	}
	if _, err := do(ctx, "up", "MEMORY="+strconv.FormatInt(memory, 10)); err != nil {
		stop()
		return "", nil, err
	}
	if url, err = do(ctx, "url"); err != nil {
		stop()
		return "", nil, err
	}
	return url, stop, nil
}

// parseBytes reads 384MB, 1GB, 512MiB or a plain number of bytes.
func parseBytes(v string) (int64, error) {
	s := strings.ToUpper(strings.TrimSpace(v))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "IB"), "B")
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, errors.New("want a size such as 384MB or 1GB")
	}
	return n * mult, nil
}
