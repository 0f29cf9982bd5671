package payments_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// BenchmarkOutbox measures what the charge job costs the payment's
// transaction: the same payment insert, in its own transaction as the
// service runs it (the payment and its job in one batch), with and without
// the job's insert, from 8 clients.
//
//	go test -run '^$' -bench Outbox -benchtime 10s ./internal/payments
func BenchmarkOutbox(b *testing.B) {
	const clients = 8
	db := testdb.New(b, clients+2)
	ctx := context.Background()
	pool, err := database.Open(ctx, db.AppURL, database.PoolConfig{MaxConns: clients, AcquireTimeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	jobs := outbox.Writer{MaxAttempts: 15}
	amount := int64(1000)
	in := payments.NewPayment{Amount: &amount, Currency: "usd"}
	for _, bc := range []struct {
		name string
		job  bool
	}{{"payment only", false}, {"payment and job", true}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0))) // about clients goroutines
			b.RunParallel(func(pb *testing.PB) {
				principal := uuid.New()
				for pb.Next() {
					err := database.InTenantTx(ctx, pool, principal, database.TxOptions{}, func(tx pgx.Tx) error {
						_, writes, err := payments.Create(ctx, jobs, payments.CreateParams{Principal: principal, New: in, Now: time.Now(), ProcessorKey: uuid.NewString()})
						if err != nil {
							return err
						}
						if !bc.job {
							writes = writes[:1] // the payment's insert, without its job's
						}
						return database.Send(ctx, tx, writes...)
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "payments/s")
		})
	}
}
