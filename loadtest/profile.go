package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CPUProfile is where the API's CPU went during the first stage's measured
// run, from its own pprof endpoint.
type CPUProfile struct {
	Seconds float64 `json:"seconds"`
	// CPUSeconds is the profile's total samples: CPU time across all cores.
	CPUSeconds float64 `json:"cpu_seconds"`
	// CPUPerRequestMs divides it by the requests answered meanwhile.
	CPUPerRequestMs float64 `json:"cpu_per_request_ms"`
	// ByArea is each area's share of the flat samples, in percent.
	ByArea map[string]float64 `json:"by_area"`
	// Top is pprof's -top, the functions with the most flat samples.
	Top []string `json:"top"`
}

// captureProfile asks the API's pprof endpoint for a CPU profile of d and
// saves it to dir/cpu.pprof. It runs alongside a measured run.
func captureProfile(ctx context.Context, metricsAddr string, d time.Duration, dir string) (string, error) {
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", metricsAddr, int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Do(req)
	if err != nil {
		return "", fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("cpu profile: %s", resp.Status)
	}
	path := filepath.Join(dir, "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

// areas name where a function's CPU goes, by the start of its name; the
// first match wins, and anything else is "other".
var areas = []struct{ prefix, area string }{
	{"github.com/payments-reference/", "this service"},
	{"main.", "this service"},
	{"github.com/jackc/", "pgx (PostgreSQL driver)"},
	{"github.com/riverqueue/", "River (job insert, workers)"},
	{"go.opentelemetry.io/", "OpenTelemetry"},
	{"github.com/prometheus/", "OpenTelemetry"},
	{"github.com/go-chi/", "net/http"},
	{"net/textproto", "net/http"},
	{"encoding/json", "JSON"},
	{"crypto/", "crypto (sha256, TLS)"},
	{"log/slog", "logging"},
	{"net/http", "net/http"},
	{"net.", "network"},
	{"internal/poll", "network"},
	{"syscall", "syscalls"},
	{"internal/runtime/syscall", "syscalls"},
	{"runtime.gc", "GC"},
	{"runtime.scanobject", "GC"},
	{"runtime.markBits", "GC"},
	{"runtime.greyobject", "GC"},
	{"runtime.findObject", "GC"},
	{"runtime.mallocgc", "allocation"},
	{"runtime.memclr", "allocation"},
	{"runtime.", "Go runtime (scheduler, other)"},
	{"internal/runtime/", "Go runtime (scheduler, other)"},
	{"aeshash", "Go runtime (scheduler, other)"},
}

func areaOf(fn string) string {
	for _, a := range areas {
		if strings.HasPrefix(fn, a.prefix) {
			return a.area
		}
	}
	// A standard library package's path has no domain: its first element,
	// before any "/", holds no dot (and a path without "/", such as
	// "sync.(*Mutex).Lock", is one element followed by the symbol).
	if first, _, found := strings.Cut(fn, "/"); !found || !strings.Contains(first, ".") {
		return "Go standard library, other"
	}
	return "other"
}

var (
	totalRe = regexp.MustCompile(`Total samples = ([0-9.]+)(ms|s|mins|hrs)`)
	topRe   = regexp.MustCompile(`^\s*([0-9.]+)(ms|s|mins|hrs|)\s+([0-9.]+)%\s+[0-9.]+%\s+[0-9.]+(?:ms|s|mins|hrs|)\s+[0-9.]+%\s+(.+)$`)
)

func seconds(v, unit string) float64 {
	f, _ := strconv.ParseFloat(v, 64)
	switch unit {
	case "ms":
		return f / 1000
	case "mins":
		return f * 60
	case "hrs":
		return f * 3600
	}
	return f
}

// summarizeProfile reads a CPU profile with go tool pprof.
func summarizeProfile(ctx context.Context, path string, d time.Duration, requests float64) (*CPUProfile, error) {
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=100000", "-nodefraction=0", "-edgefraction=0", path).Output()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof: %w", err)
	}
	p := &CPUProfile{Seconds: d.Seconds(), ByArea: map[string]float64{}}
	if m := totalRe.FindSubmatch(out); m != nil {
		p.CPUSeconds = seconds(string(m[1]), string(m[2]))
	}
	if requests > 0 {
		p.CPUPerRequestMs = p.CPUSeconds * 1000 / requests
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	header := true
	for sc.Scan() {
		line := sc.Text()
		if header {
			header = !strings.Contains(line, "flat%")
			continue
		}
		m := topRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		pct, _ := strconv.ParseFloat(m[3], 64)
		p.ByArea[areaOf(m[4])] += pct
		if len(p.Top) < 20 {
			p.Top = append(p.Top, strings.TrimSpace(line))
		}
	}
	return p, sc.Err()
}

// resummarize recomputes p's areas and top functions from the profile saved
// beside results.json, after a change to how areas are named.
func resummarize(ctx context.Context, dir string, p *CPUProfile) error {
	path := filepath.Join(dir, "cpu.pprof")
	if _, err := os.Stat(path); err != nil {
		return nil // nothing saved: keep what results.json says
	}
	again, err := summarizeProfile(ctx, path, time.Duration(p.Seconds*float64(time.Second)), 0)
	if err != nil {
		return err
	}
	p.ByArea, p.Top = again.ByArea, again.Top
	return nil
}

// profileAreas lists ByArea largest first.
func profileAreas(p *CPUProfile) []string {
	names := make([]string, 0, len(p.ByArea))
	for a := range p.ByArea {
		names = append(names, a)
	}
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case p.ByArea[a] > p.ByArea[b]:
			return -1
		case p.ByArea[a] < p.ByArea[b]:
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

// updateCounters reads idempotency_keys' update counters once the API's
// backends have reported them: PostgreSQL 15 backends flush their table
// statistics when idle, up to seconds after a transaction, so the counters
// are read until they hold still.
func updateCounters(ctx context.Context, admin *pgxpool.Pool) (updates, hot int64, err error) {
	deadline := time.Now().Add(20 * time.Second)
	prevU, prevH := int64(-1), int64(-1)
	for {
		if err := admin.QueryRow(ctx, `
			SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'idempotency_keys'`).Scan(&updates, &hot); err != nil {
			return 0, 0, fmt.Errorf("update counters: %w", err)
		}
		if (updates == prevU && hot == prevH) || time.Now().After(deadline) {
			return updates, hot, nil
		}
		prevU, prevH = updates, hot
		time.Sleep(1500 * time.Millisecond)
	}
}
