package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// loader grows the key table with realistic rows.
type loader struct {
	admin    *pgxpool.Pool
	clients  []client
	response []byte
}

func newLoader(admin *pgxpool.Pool, clients []client, responseBytes int) *loader {
	// A stored payment response of about the requested size.
	body := `{"id":"01a237a6-1ce6-7a98-be43-37d8ff4b5115","amount":1000,"amount_refunded":0,"currency":"usd","status":"succeeded","description":"` +
		strings.Repeat("x", max(0, responseBytes-200)) + `","metadata":{},"created_at":"2026-12-02T16:46:02.979998Z"}`
	return &loader{admin: admin, clients: clients, response: []byte(body)}
}

// fillTo adds rows until the table holds at least target rows, with COPY,
// then VACUUM ANALYZE so the stage starts from a settled table, as in a
// steady state where autovacuum keeps up.
func (l *loader) fillTo(ctx context.Context, target int64, progress io.Writer, label string) error {
	var have int64
	if err := l.admin.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&have); err != nil {
		return err
	}
	if n := target - have; n > 0 {
		if err := l.copyRows(ctx, n, progress, label); err != nil {
			return err
		}
	}
	fmt.Fprintf(progress, "\r%s: vacuum analyze%30s", label, "")
	_, err := l.admin.Exec(ctx, `VACUUM ANALYZE idempotency_keys`)
	return err
}

func (l *loader) copyRows(ctx context.Context, n int64, progress io.Writer, label string) error {
	conn, err := l.admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	principals := make([]uuid.UUID, len(l.clients))
	for i, c := range l.clients {
		principals[i] = uuid.MustParse(c.principal)
	}
	var copied atomic.Int64
	stop := make(chan struct{})
	var printer sync.WaitGroup
	defer printer.Wait()
	defer close(stop)
	printer.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Fprintf(progress, "\r%s: loading %s/%s rows   ", label, humanCount(copied.Load()), humanCount(n))
			}
		}
	})

	now := time.Now()
	rng := mrand.New(mrand.NewPCG(uint64(now.UnixNano()), 7))
	fp := make([]byte, 32)
	var i int64
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= n {
			return nil, nil
		}
		i++
		copied.Store(i)
		_, _ = rand.Read(fp)
		// Created at any moment of the last 24 hours: live rows, spread
		// over the window as in a steady state.
		created := now.Add(-time.Duration(rng.Int64N(int64(24 * time.Hour))))
		var traceID [16]byte
		var spanID [8]byte
		_, _ = rand.Read(traceID[:])
		_, _ = rand.Read(spanID[:])
		return []any{
			principals[rng.IntN(len(principals))], "POST /v1/payments", uuid.NewString(), "completed",
			append([]byte(nil), fp...), int16(201), "application/json", l.response,
			"req_" + hex.EncodeToString(fp[:16]), "00-" + hex.EncodeToString(traceID[:]) + "-" + hex.EncodeToString(spanID[:]) + "-01",
			created, created.Add(25 * time.Hour),
		}, nil
	})
	_, err = conn.CopyFrom(ctx, pgx.Identifier{"idempotency_keys"},
		[]string{"principal_id", "endpoint", "key", "state", "fingerprint", "response_status", "response_content_type",
			"response_body", "correlation_id", "trace_parent", "created_at", "expires_at"}, src)
	if err != nil {
		return fmt.Errorf("copy %d rows: %w", n, err)
	}
	return nil
}

func sha256Sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}
