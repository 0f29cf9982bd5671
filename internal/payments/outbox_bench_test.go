package payments_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// noJob is an outbox that inserts nothing: the payment write alone.
type noJob struct{}

func (noJob) InsertTx(context.Context, pgx.Tx, river.JobArgs, *river.InsertOpts) (*rivertype.JobInsertResult, error) {
	return &rivertype.JobInsertResult{}, nil
}

// BenchmarkOutbox measures what the charge job costs the payment's
// transaction: the same payment insert, in its own transaction as the
// service runs it, with and without River's job insert, from 8 clients.
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
	jobs, err := outbox.NewClient(pool, river.NewWorkers(), outbox.Config{JobTimeout: time.Second, RescueAfter: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	amount := int64(1000)
	in := payments.NewPayment{Amount: &amount, Currency: "usd"}
	for _, bc := range []struct {
		name string
		jobs outbox.Inserter
	}{{"payment only", noJob{}}, {"payment and job", jobs}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0))) // about clients goroutines
			b.RunParallel(func(pb *testing.PB) {
				principal := uuid.New()
				for pb.Next() {
					err := database.InTenantTx(ctx, pool, principal, database.TxOptions{}, func(tx pgx.Tx) error {
						_, err := payments.Create(ctx, tx, bc.jobs, principal, in, false)
						return err
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
