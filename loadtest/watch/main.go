// Command watch prints, every few seconds, what the load test's curve is
// about, read from a running service's own /metrics: the claim's p50 and
// p99 over the last interval next to the key table's rows and bytes and the
// age of its oldest live row. It needs no Prometheus and no Docker.
//
//	go run ./loadtest/watch -metrics http://127.0.0.1:9090/metrics
//
// The percentiles are estimated from the histogram's buckets as Prometheus's
// histogram_quantile does (linear within a bucket), so they are as coarse as
// the buckets: 0.5, 1, 2.5, 5, 10 ms... The queries that give the same
// figures in Prometheus are in docs/performance.md.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	url := flag.String("metrics", "http://127.0.0.1:9090/metrics", "the service's metrics address (METRICS_ADDR)")
	every := flag.Duration("every", 5*time.Second, "interval between lines")
	count := flag.Int("count", 0, "lines to print before stopping (0: until interrupted)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := watch(ctx, *url, *every, *count, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "watch:", err)
		os.Exit(1)
	}
}

// watch prints a header, then a line per interval, count lines (0: until
// ctx ends).
func watch(ctx context.Context, url string, every time.Duration, count int, out io.Writer) error {
	prev, err := scrape(ctx, url)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%-8s %10s %12s %12s %10s %14s %12s\n", "time", "claims/s", "claim p50", "claim p99", "key rows", "key bytes", "oldest live")
	for i := 0; count == 0 || i < count; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
		cur, err := scrape(ctx, url)
		if err != nil {
			return err
		}
		claims := cur.claims - prev.claims
		delta := map[float64]float64{}
		for le, n := range cur.buckets {
			delta[le] = n - prev.buckets[le]
		}
		fmt.Fprintf(out, "%-8s %10.0f %12s %12s %10.0f %14s %12s\n", time.Now().Format("15:04:05"), claims/every.Seconds(),
			ms(quantile(0.5, delta)), ms(quantile(0.99, delta)), cur.rows, bytes(cur.bytes), (time.Duration(cur.oldest) * time.Second).String())
		prev = cur
	}
	return nil
}

// sample is one scrape's figures, summed over their label sets.
type sample struct {
	buckets             map[float64]float64 // le -> cumulative count
	claims              float64
	rows, bytes, oldest float64
}

// The service's metric names (internal/idempotency, docs/observability.md).
const (
	claimBucket = "idempotency_claim_duration_seconds_bucket"
	claimCount  = "idempotency_claim_duration_seconds_count"
	keyRows     = "idempotency_keys_rows"
	keyBytes    = "idempotency_keys_bytes"
	oldestAge   = "idempotency_oldest_live_key_age_seconds"
)

func scrape(ctx context.Context, url string) (sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return sample{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return parse(resp.Body)
}

// parse reads the Prometheus text format's lines this command needs.
func parse(r io.Reader) (sample, error) {
	s := sample{buckets: map[float64]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := split(line)
		if !ok {
			continue
		}
		switch name {
		case claimBucket:
			le, err := strconv.ParseFloat(label(labels, "le"), 64)
			if err == nil {
				s.buckets[le] += value
			}
		case claimCount:
			s.claims += value
		case keyRows:
			s.rows += value
		case keyBytes:
			s.bytes += value
		case oldestAge:
			s.oldest = max(s.oldest, value)
		}
	}
	return s, sc.Err()
}

// split cuts `name{labels} value [timestamp]`.
func split(line string) (name, labels string, value float64, ok bool) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, false
		}
		name, labels, rest = line[:i], line[i+1:j], line[j+1:]
	} else {
		var found bool
		if name, rest, found = strings.Cut(line, " "); !found {
			return "", "", 0, false
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return name, labels, v, err == nil
}

// label is one label's value in `a="x",b="y"`.
func label(labels, key string) string {
	for part := range strings.SplitSeq(labels, ",") {
		k, v, _ := strings.Cut(part, "=")
		if strings.TrimSpace(k) == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// quantile estimates q from cumulative bucket counts, as histogram_quantile
// does: linear within the bucket that holds it; NaN without samples.
func quantile(q float64, buckets map[float64]float64) float64 {
	les := make([]float64, 0, len(buckets))
	for le := range buckets {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) == 0 || buckets[les[len(les)-1]] <= 0 {
		return math.NaN()
	}
	total := buckets[les[len(les)-1]]
	rank := q * total
	lower, below := 0.0, 0.0
	for _, le := range les {
		n := buckets[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return lower // above the last finite bucket: its bound is all we know
			}
			if n == below {
				return le
			}
			return lower + (le-lower)*(rank-below)/(n-below)
		}
		lower, below = le, n
	}
	return lower
}

func ms(seconds float64) string {
	if math.IsNaN(seconds) {
		return "-"
	}
	return strconv.FormatFloat(seconds*1000, 'f', 2, 64) + " ms"
}

func bytes(n float64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", n/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", n/(1<<20))
	default:
		return fmt.Sprintf("%.0f KiB", n/(1<<10))
	}
}
