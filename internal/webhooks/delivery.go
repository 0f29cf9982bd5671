package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/riverqueue/river"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/events"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
)

// DeliveryArgs is the outbox job that delivers one event to one endpoint.
type DeliveryArgs struct {
	EventID    uuid.UUID `json:"event_id"`
	EndpointID uuid.UUID `json:"endpoint_id"`
	Principal  uuid.UUID `json:"principal_id"`
}

// Kind names the job in River's table.
func (DeliveryArgs) Kind() string { return deliveryKind }

const deliveryKind = "deliver_webhook"

// MaxErrorLength bounds an attempt's recorded error, in characters, as the
// webhook_deliveries.error column does.
const MaxErrorLength = 500

// Fanout implements events.Fanout: one delivery job per enabled endpoint of
// the event's principal whose enabled_events take the event's type,
// inserted by one statement in the event's own
// transaction. The jobs carry the trace of ctx (the worker that decided
// the payment, itself in the trace of the request that made it), so one
// trace shows request, charge, event and delivery.
type Fanout struct {
	// Schedule is the delivery schedule; its length is each job's attempts.
	Schedule []time.Duration
}

// FanOut implements events.Fanout.
func (f Fanout) FanOut(ctx context.Context, principal, eventID uuid.UUID) ([]database.Statement, error) {
	// No event (the change was already made): no row joins, no job.
	jobs, err := outbox.EnqueueEach(ctx, deliveryKind, outbox.QueueWebhooks, len(f.Schedule), `
		SELECT e.principal_id, jsonb_build_object('event_id', e.id, 'endpoint_id', w.id, 'principal_id', e.principal_id)
		FROM events e JOIN webhook_endpoints w ON w.principal_id = e.principal_id AND w.status = 'enabled'
		WHERE e.principal_id = $5 AND w.principal_id = $5 AND e.id = $6
		  AND ('*' = ANY (w.enabled_events) OR e.type = ANY (w.enabled_events))`, principal, eventID)
	return []database.Statement{jobs}, err
}

// Outcomes of an attempt, as recorded in webhook_deliveries_total.
const (
	OutcomeDelivered = "delivered" // 2xx: done
	OutcomeGone      = "gone"      // 410: the endpoint is disabled, done
	OutcomeFailed    = "failed"    // anything else: tried again on the schedule
)

// Deliverer is the outbox worker that delivers an event to an endpoint.
type Deliverer struct {
	river.WorkerDefaults[DeliveryArgs]
	Pool    *database.Pool // the service role; the tenant is set per job
	Keyring Keyring
	// Client makes the POST: URLPolicy.Client's, whose dialer refuses
	// non-public addresses.
	Client *http.Client
	// Schedule is Fanout's: when each next attempt is made.
	Schedule []time.Duration
	// AttemptTimeout bounds one POST (the client's own timeout should be
	// the same); the job's timeout is a little longer.
	AttemptTimeout time.Duration
	// Attempts counts attempts by outcome (NewAttemptCounter); nil: none.
	Attempts metric.Int64Counter
	// Concurrency is the most attempts to one endpoint that run at once,
	// across every instance (a lease each, webhook_endpoint_leases); a job
	// over it waits its turn without spending an attempt. 0: no bound.
	Concurrency int
	// DisableAfter disables an endpoint whose every attempt has failed for
	// this long, and records a webhook_endpoint.disabled event for its
	// owner. 0: never.
	DisableAfter time.Duration
	// Livemode is the service's, for the events it records.
	Livemode bool
}

// lease is how long an attempt's lease on its endpoint lasts: longer than
// the job's timeout, so that it only ends before the attempt does when the
// worker died.
func (d *Deliverer) lease() time.Duration { return d.AttemptTimeout + 15*time.Second }

// NextRetry follows the schedule: after attempt n failed, attempt n+1 is
// made Schedule[n] later.
func (d *Deliverer) NextRetry(job *river.Job[DeliveryArgs]) time.Time {
	return time.Now().Add(d.Schedule[min(job.Attempt, len(d.Schedule)-1)])
}

// Timeout bounds an attempt of the job: the POST, and the two round trips
// around it.
func (d *Deliverer) Timeout(*river.Job[DeliveryArgs]) time.Duration {
	return d.AttemptTimeout + 10*time.Second
}

// Work makes one attempt: read the event and the endpoint, POST the event
// signed, record the attempt. A 2xx or a 410 ends the job in the same
// transaction as the attempt's record; anything else records the attempt
// and returns an error, so River makes the next attempt on the schedule.
func (d *Deliverer) Work(ctx context.Context, job *river.Job[DeliveryArgs]) error {
	a := job.Args
	var ev events.Event
	var ep Endpoint
	var found, leased bool
	read := []database.Statement{events.Load(a.Principal, a.EventID, &ev), loadForDelivery(a.Principal, a.EndpointID, &ep, &found)}
	if d.Concurrency > 0 {
		read = append(read, takeLease(a.Principal, a.EndpointID, job.ID, d.lease(), d.Concurrency, &leased)...)
	}
	err := database.SendInTenant(ctx, d.Pool, a.Principal, read...)
	if errors.Is(err, events.ErrNotFound) {
		return nil // swept after its retention: nothing left to send
	}
	if err != nil {
		return fmt.Errorf("webhook delivery %d: read event and endpoint: %w", job.ID, err)
	}
	if !found || ep.Status != StatusEnabled {
		return nil // deleted or disabled since the job was queued
	}
	if d.Concurrency > 0 && !leased {
		// Concurrency attempts to this endpoint are running: try again
		// in a while, without spending an attempt. Jittered, so that the
		// jobs waiting for one slow endpoint do not come back together.
		return river.JobSnooze(d.AttemptTimeout/10 + rand.N(d.AttemptTimeout/10+1))
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("webhook delivery %d: render event: %w", job.ID, err)
	}
	at := time.Now()
	sig, err := d.Keyring.Sign(ep, ev.ID.String(), at, body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("webhook delivery %d: %w", job.ID, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "idempotent-payments-webhooks/1")
	req.Header.Set("webhook-id", ev.ID.String())
	req.Header.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	// A delivery is safe to repeat (the receiver applies a webhook-id
	// once), so Go's transport may resend it at once on a keep-alive
	// connection that the receiver had closed (it restarted, say), rather
	// than fail the attempt: an Idempotency-Key entry with no value marks
	// the request so without sending the header.
	req.Header["Idempotency-Key"] = nil

	start := time.Now()
	resp, postErr := d.Client.Do(req)
	rec := Delivery{ID: uuid.Must(uuid.NewV7()), EndpointID: ep.ID, EventID: ev.ID, Attempt: job.Attempt}
	if postErr == nil {
		// Read (a bounded part of) the answer so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		rec.StatusCode = &resp.StatusCode
	} else {
		// The URL may carry the receiver's own token: it stays out of the
		// record and of the job's error (which River logs).
		var ue *url.Error
		if errors.As(postErr, &ue) {
			postErr = ue.Err
		}
		msg := database.StorableText(postErr.Error(), MaxErrorLength)
		rec.Error = &msg
	}
	rec.DurationMS = int(time.Since(start).Milliseconds())

	outcome := OutcomeFailed
	switch {
	case postErr != nil:
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		outcome = OutcomeDelivered
	case resp.StatusCode == http.StatusGone:
		outcome = OutcomeGone
	}
	if d.Attempts != nil {
		d.Attempts.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
	}
	record := []database.Statement{recordAttempt(a.Principal, rec)}
	if d.Concurrency > 0 {
		record = append(record, database.Statement{SQL: releaseSQL, Args: []any{a.Principal, ep.ID, job.ID}})
	}
	switch outcome {
	case OutcomeDelivered:
		record = append(record, database.Statement{SQL: deliveredSQL, Args: []any{a.Principal, ep.ID}})
	case OutcomeGone:
		record = append(record, database.Statement{SQL: disableSQL, Args: []any{a.Principal, ep.ID}})
	case OutcomeFailed:
		failed, err := d.failed(ctx, a.Principal, ep)
		if err != nil {
			return fmt.Errorf("webhook delivery %d: record attempt %d: %w", job.ID, job.Attempt, err)
		}
		record = append(record, failed...)
	}
	if outcome != OutcomeFailed {
		record = append(record, outbox.Complete(job.JobRow))
	}
	if err := database.SendInTenant(ctx, d.Pool, a.Principal, record...); err != nil {
		return fmt.Errorf("webhook delivery %d: record attempt %d: %w", job.ID, job.Attempt, err)
	}
	if outcome == OutcomeFailed {
		if postErr != nil {
			return fmt.Errorf("webhook delivery %d: attempt %d: %w", job.ID, job.Attempt, postErr)
		}
		return fmt.Errorf("webhook delivery %d: attempt %d: the receiver answered %d", job.ID, job.Attempt, resp.StatusCode)
	}
	return nil
}

// failed is the statements of what a failed attempt changes on its endpoint: the
// run of failures starts now if none had, and an endpoint that has failed
// for DisableAfter is disabled, with a webhook_endpoint.disabled event for
// its owner (sent to their other endpoints that take it, and listable).
// The event is recorded if and only if this attempt disabled the endpoint:
// its INSERT ... SELECT reads the endpoint only where the UPDATE marked it
// with the event's id, as a settle's event (events.Announcer).
func (d *Deliverer) failed(ctx context.Context, principal uuid.UUID, ep Endpoint) ([]database.Statement, error) {
	stmts := []database.Statement{{SQL: `UPDATE webhook_endpoints SET failing_since = now()
		WHERE principal_id = $1 AND id = $2 AND status = 'enabled' AND failing_since IS NULL`, Args: []any{principal, ep.ID}}}
	if d.DisableAfter <= 0 {
		return stmts, nil
	}
	eventID := uuid.Must(uuid.NewV7())
	disabled := ep
	disabled.Status, disabled.DisabledReason = StatusDisabled, new(ReasonFailing)
	data, err := events.Data(disabled)
	if err != nil {
		return nil, err
	}
	stmts = append(stmts,
		database.Statement{SQL: `UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'failing', disable_event_id = $3
		WHERE principal_id = $1 AND id = $2 AND status = 'enabled' AND failing_since <= now() - $4::interval`,
			Args: []any{principal, ep.ID, eventID, d.DisableAfter}},
		database.Statement{SQL: `INSERT INTO events (id, principal_id, type, data, livemode)
		SELECT $3, principal_id, '` + EventDisabled + `', $4, $5
		FROM webhook_endpoints WHERE principal_id = $1 AND id = $2 AND disable_event_id = $3`,
			Args: []any{principal, ep.ID, eventID, data, d.Livemode}})
	jobs, err := Fanout{Schedule: d.Schedule}.FanOut(ctx, principal, eventID)
	return append(stmts, jobs...), err
}

// deliveredSQL ends an endpoint's run of failures.
const deliveredSQL = `UPDATE webhook_endpoints SET failing_since = NULL
	WHERE principal_id = $1 AND id = $2 AND failing_since IS NOT NULL`

// takeLease is the statements that take a lease for job on
// principal's endpoint, if it is enabled and fewer than limit attempts hold
// one: *leased says whether it was taken. The endpoint's advisory lock,
// held to the end of the transaction, orders concurrent takers, so that two
// cannot both take the last one; leases whose worker died are dropped
// first. A job's second take (its retry) renews its own lease.
func takeLease(principal, endpoint uuid.UUID, job int64, lease time.Duration, limit int, leased *bool) []database.Statement {
	return []database.Statement{
		{SQL: `SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoint_leases:' || $1::text, 0))`, Args: []any{endpoint}},
		{SQL: `DELETE FROM webhook_endpoint_leases WHERE principal_id = $1 AND endpoint_id = $2 AND expires_at < now()`, Args: []any{principal, endpoint}},
		{SQL: `
		INSERT INTO webhook_endpoint_leases (principal_id, endpoint_id, job_id, expires_at)
		SELECT w.principal_id, w.id, $3, now() + $4::interval
		FROM webhook_endpoints w
		WHERE w.principal_id = $1 AND w.id = $2 AND w.status = 'enabled'
		  AND (SELECT count(*) FROM webhook_endpoint_leases l
		       WHERE l.principal_id = $1 AND l.endpoint_id = $2 AND l.job_id <> $3) < $5
		ON CONFLICT (principal_id, endpoint_id, job_id) DO UPDATE SET expires_at = EXCLUDED.expires_at`,
			Args: []any{principal, endpoint, job, lease, limit}, Done: func(tag pgconn.CommandTag) error {
				*leased = tag.RowsAffected() == 1
				return nil
			}},
	}
}

// releaseSQL ends an attempt's lease.
const releaseSQL = `DELETE FROM webhook_endpoint_leases WHERE principal_id = $1 AND endpoint_id = $2 AND job_id = $3`
