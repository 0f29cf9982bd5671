package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// processCounters are the started API's own counters, read from its
// /metrics: the CPU it used and the heap allocations it made. Their growth
// over a run, divided by the requests answered, is what a request costs the
// API, in figures that do not depend on how busy the machine was.
type processCounters struct {
	cpuSeconds float64 // process_cpu_seconds_total
	mallocs    float64 // go_memstats_mallocs_total
}

// readCounters scrapes addr's /metrics.
func readCounters(ctx context.Context, addr string) (processCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return processCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return processCounters{}, fmt.Errorf("read the API's metrics: %w", err)
	}
	defer resp.Body.Close()
	var c processCounters
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var slot *float64
		switch name {
		case "process_cpu_seconds_total":
			slot = &c.cpuSeconds
		case "go_memstats_mallocs_total":
			slot = &c.mallocs
		default:
			continue
		}
		if *slot, err = strconv.ParseFloat(strings.TrimSpace(value), 64); err != nil {
			return processCounters{}, fmt.Errorf("metric %s: %w", name, err)
		}
		found++
	}
	if err := sc.Err(); err != nil {
		return processCounters{}, err
	}
	if found != 2 {
		return processCounters{}, fmt.Errorf("the API's metrics lack process_cpu_seconds_total or go_memstats_mallocs_total")
	}
	return c, nil
}

// perRequest is what the growth from before to after cost each of n
// requests: CPU milliseconds and allocations.
func perRequest(before, after processCounters, n int) (cpuMs, allocs float64) {
	if n == 0 {
		return 0, 0
	}
	return (after.cpuSeconds - before.cpuSeconds) * 1000 / float64(n), (after.mallocs - before.mallocs) / float64(n)
}
