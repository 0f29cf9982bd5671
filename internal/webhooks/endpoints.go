package webhooks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/events"
	"github.com/payments-reference/idempotent-payments/internal/keyset"
	"github.com/payments-reference/idempotent-payments/internal/outbox"
	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// Limits on endpoints.
const (
	// MaxEndpoints is the most endpoints, enabled or disabled, one
	// principal may have: each event is one delivery job per endpoint.
	MaxEndpoints = 16
	// MaxDescriptionLength bounds an endpoint's description.
	MaxDescriptionLength = 1000
	// MaxRecoverEvents is the most events one recover queues again: a
	// longer window is refused, and recovered in parts.
	MaxRecoverEvents = 1000
)

// An endpoint's statuses. A disabled endpoint and a deleted one get no
// deliveries; a disabled one can be enabled again (Update).
const (
	StatusEnabled  = "enabled"
	StatusDisabled = "disabled"
	StatusDeleted  = "deleted"
)

// Why an endpoint is disabled (Endpoint.DisabledReason).
const (
	// ReasonReceiverGone: its receiver answered 410 Gone.
	ReasonReceiverGone = "receiver_gone"
	// ReasonFailing: every attempt failed for the Deliverer's DisableAfter;
	// a webhook_endpoint.disabled event says so.
	ReasonFailing = "failing"
	// ReasonRequested: its owner disabled it (Update).
	ReasonRequested = "requested"
)

// AllEvents in an endpoint's EnabledEvents sends it every type, including
// types added later.
const AllEvents = "*"

// EventDisabled is the type of the event that says an endpoint was disabled
// because it kept failing.
const EventDisabled = "webhook_endpoint.disabled"

// EventTypes are the event types an endpoint may name in EnabledEvents.
var EventTypes = []string{
	"payment.succeeded", "payment.failed", "payment.requires_reconciliation",
	"refund.succeeded", "refund.failed", "refund.requires_reconciliation",
	EventDisabled,
}

var (
	// ErrNotFound means no endpoint with that id is visible to the
	// principal (or it was deleted).
	ErrNotFound = errors.New("webhook endpoint not found")
	// ErrTooManyEndpoints means the principal has MaxEndpoints already.
	// Nothing was recorded.
	ErrTooManyEndpoints = fmt.Errorf("at most %d webhook endpoints per account", MaxEndpoints)
	// ErrDisabled means the endpoint is disabled: nothing is sent to it.
	ErrDisabled = errors.New("webhook endpoint is disabled")
	// ErrTooManyEvents means a recover's window holds more than
	// MaxRecoverEvents events. Nothing was queued.
	ErrTooManyEvents = fmt.Errorf("more than %d events to recover", MaxRecoverEvents)
)

// Endpoint is a registered webhook endpoint as clients see it.
type Endpoint struct {
	ID          uuid.UUID `json:"id"`
	URL         string    `json:"url"`
	Description *string   `json:"description"`
	Status      string    `json:"status"`
	// EnabledEvents are the event types the endpoint is sent: ["*"] for
	// every type.
	EnabledEvents []string `json:"enabled_events"`
	// DisabledReason says why a disabled endpoint is (Reason*); null
	// otherwise.
	DisabledReason *string `json:"disabled_reason"`
	// FailingSince is when the endpoint's current run of failed attempts
	// began; null after a delivered one.
	FailingSince *time.Time `json:"failing_since"`
	// Secret is shown only in the response that makes it: the creation,
	// or a rotation (and their idempotent replays).
	Secret string `json:"secret,omitempty"`
	// PreviousSecretExpiresAt is when the secret a rotation replaced stops
	// signing deliveries; null when there is none.
	PreviousSecretExpiresAt *time.Time `json:"previous_secret_expires_at"`
	CreatedAt               time.Time  `json:"created_at"`

	secretVersion int
}

// SecretRef names the endpoint's current secret: what an idempotent
// request that showed it stores, instead of its response (ParseSecretRef).
func (e Endpoint) SecretRef() string { return fmt.Sprintf("%s/%d", e.ID, e.secretVersion) }

// ParseSecretRef reads a SecretRef.
func ParseSecretRef(ref string) (uuid.UUID, int, error) {
	idPart, v, ok := strings.Cut(ref, "/")
	id, err := uuid.Parse(idPart)
	var version int
	if _, serr := fmt.Sscanf(v, "%d", &version); !ok || err != nil || serr != nil || version < 1 {
		return uuid.UUID{}, 0, fmt.Errorf("webhook endpoint secret reference %q is malformed", ref)
	}
	return id, version, nil
}

// WithSecret returns e showing its secret of version, derived by k.
func (e Endpoint) WithSecret(k Keyring, version int) Endpoint {
	e.Secret = k.Secret(e.ID, version)
	return e
}

// NewEndpoint is a request to register an endpoint.
type NewEndpoint struct {
	URL         string  `json:"url"`
	Description *string `json:"description"`
	// EnabledEvents defaults to ["*"].
	EnabledEvents []string `json:"enabled_events"`
}

// validateEnabledEvents checks a list of event types: known types, once
// each, or "*" alone.
func validateEnabledEvents(c *validation.Collector, events []string) {
	if len(events) == 0 {
		c.Add("enabled_events", `must name at least one event type, or "*"`)
		return
	}
	seen := map[string]bool{}
	for _, e := range events {
		switch {
		case e == AllEvents && len(events) > 1:
			c.Add("enabled_events", `"*" stands alone: it is every type`)
			return
		case e != AllEvents && !slices.Contains(EventTypes, e):
			c.Add("enabled_events", fmt.Sprintf("%q is not an event type; the types: %s", database.StorableText(e, 64), strings.Join(EventTypes, ", ")))
			return
		case seen[e]:
			c.Add("enabled_events", fmt.Sprintf("names %q twice", e))
			return
		}
		seen[e] = true
	}
}

// Validate checks what can be checked without the network; URLPolicy.Check
// checks the URL's host.
func (n NewEndpoint) Validate() error {
	var c validation.Collector
	switch {
	case n.URL == "":
		c.Add("url", "is required")
	case len(n.URL) > MaxURLLength:
		c.Add("url", fmt.Sprintf("must be at most %d characters", MaxURLLength))
	}
	if n.Description != nil {
		switch {
		case utf8.RuneCountInString(*n.Description) > MaxDescriptionLength:
			c.Add("description", fmt.Sprintf("must be at most %d characters", MaxDescriptionLength))
		case strings.ContainsRune(*n.Description, 0):
			c.Add("description", "must not contain the character U+0000")
		}
	}
	if n.EnabledEvents != nil {
		validateEnabledEvents(&c, n.EnabledEvents)
	}
	return c.Err()
}

// EndpointUpdate is a change to an endpoint: each field that is set.
type EndpointUpdate struct {
	// Status enables a disabled endpoint again, or disables an enabled one.
	Status        *string  `json:"status"`
	EnabledEvents []string `json:"enabled_events"`
}

// Validate checks the change.
func (u EndpointUpdate) Validate() error {
	var c validation.Collector
	if u.Status == nil && u.EnabledEvents == nil {
		c.Add("status", "set status or enabled_events: there is nothing else to change")
	}
	if u.Status != nil && *u.Status != StatusEnabled && *u.Status != StatusDisabled {
		c.Add("status", "must be enabled or disabled")
	}
	if u.EnabledEvents != nil {
		validateEnabledEvents(&c, u.EnabledEvents)
	}
	return c.Err()
}

const columns = `id, url, description, status, enabled_events, disabled_reason, failing_since, secret_version, previous_secret_expires_at, created_at`

func scan(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.ID, &e.URL, &e.Description, &e.Status, &e.EnabledEvents, &e.DisabledReason, &e.FailingSince,
		&e.secretVersion, &e.PreviousSecretExpiresAt, &e.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Endpoint{}, ErrNotFound
	}
	if err != nil {
		return Endpoint{}, fmt.Errorf("read webhook endpoint: %w", err)
	}
	return e, nil
}

// Create records a validated endpoint for principal in tx (now is tx's
// now()) and returns it with its first secret. It returns
// ErrTooManyEndpoints when the principal has MaxEndpoints already: a
// per-principal transaction lock orders concurrent creations, so two
// cannot both take the last place.
func Create(ctx context.Context, tx pgx.Tx, k Keyring, principal uuid.UUID, n NewEndpoint, now time.Time) (Endpoint, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('webhook_endpoints:' || $1::text, 0))`, principal); err != nil {
		return Endpoint{}, fmt.Errorf("lock webhook endpoints: %w", err)
	}
	e := Endpoint{ID: uuid.Must(uuid.NewV7()), URL: n.URL, Description: n.Description, Status: StatusEnabled,
		EnabledEvents: n.EnabledEvents, CreatedAt: now, secretVersion: 1}
	if e.EnabledEvents == nil {
		e.EnabledEvents = []string{AllEvents}
	}
	// A statement of its own after the lock: its snapshot sees every
	// endpoint committed before the lock was granted. The count and the
	// INSERT are two statements (one INSERT ... SELECT ... WHERE count < N
	// gave the row its principal as a parameter, which Citus plans through
	// the coordinator and row-level security then refuses: docs/scaling.md);
	// the lock keeps them one decision.
	var registered int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhook_endpoints WHERE principal_id = $1 AND status <> 'deleted'`, principal).Scan(&registered); err != nil {
		return Endpoint{}, fmt.Errorf("count webhook endpoints: %w", err)
	}
	if registered >= MaxEndpoints {
		return Endpoint{}, ErrTooManyEndpoints
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO webhook_endpoints (id, principal_id, url, description, status, enabled_events, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		e.ID, principal, e.URL, e.Description, e.Status, e.EnabledEvents, e.CreatedAt)
	if err != nil {
		return Endpoint{}, fmt.Errorf("create webhook endpoint: %w", err)
	}
	return e.WithSecret(k, e.secretVersion), nil
}

const getSQL = `SELECT ` + columns + ` FROM webhook_endpoints WHERE principal_id = $1 AND id = $2`

// Get returns principal's endpoint with id, deleted or not, without its
// secret.
func Get(ctx context.Context, db database.DBTX, principal, id uuid.UUID) (Endpoint, error) {
	return scan(db.QueryRow(ctx, getSQL, principal, id))
}

// List returns principal's endpoints that are not deleted (at most
// MaxEndpoints), oldest first.
func List(ctx context.Context, db database.DBTX, principal uuid.UUID) ([]Endpoint, error) {
	rows, err := db.Query(ctx, `
		SELECT `+columns+` FROM webhook_endpoints
		WHERE principal_id = $1 AND status <> 'deleted'
		ORDER BY created_at, id`, principal)
	if err != nil {
		return nil, fmt.Errorf("list webhook endpoints: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Endpoint, error) { return scan(row) })
}

// Delete marks the endpoint deleted: it gets no more deliveries, and its
// queued ones end unsent. Its delivery attempts stay listable until their
// events are swept. It returns ErrNotFound for an endpoint already deleted.
func Delete(ctx context.Context, tx pgx.Tx, principal, id uuid.UUID) (Endpoint, error) {
	return scan(tx.QueryRow(ctx, `
		UPDATE webhook_endpoints SET status = 'deleted'
		WHERE principal_id = $1 AND id = $2 AND status <> 'deleted'
		RETURNING `+columns, principal, id))
}

// RotateSecret gives the endpoint a new secret and returns the endpoint
// showing it. The previous secret keeps signing deliveries, beside the new
// one, for RotationOverlap; the one before that stops at once.
func RotateSecret(ctx context.Context, tx pgx.Tx, k Keyring, principal, id uuid.UUID) (Endpoint, error) {
	e, err := scan(tx.QueryRow(ctx, `
		UPDATE webhook_endpoints
		SET secret_version = secret_version + 1, previous_secret_expires_at = now() + $3::interval
		WHERE principal_id = $1 AND id = $2 AND status <> 'deleted'
		RETURNING `+columns, principal, id, RotationOverlap))
	if err != nil {
		return Endpoint{}, err
	}
	return e.WithSecret(k, e.secretVersion), nil
}

// Update changes the endpoint as u says and returns it. Enabling it clears
// its reason and its run of failures: the owner says the receiver is
// mended, and a new run is counted from the next failed attempt. It returns
// ErrNotFound for a deleted endpoint.
func Update(ctx context.Context, tx pgx.Tx, principal, id uuid.UUID, u EndpointUpdate) (Endpoint, error) {
	return scan(tx.QueryRow(ctx, `
		UPDATE webhook_endpoints SET
			enabled_events = coalesce($3, enabled_events),
			status = coalesce($4, status),
			disabled_reason = CASE WHEN $4 IS NULL OR $4 = status THEN disabled_reason
			                       WHEN $4 = 'disabled' THEN 'requested' END,
			failing_since = CASE WHEN $4 = 'enabled' AND status = 'disabled' THEN NULL ELSE failing_since END
		WHERE principal_id = $1 AND id = $2 AND status <> 'deleted'
		RETURNING `+columns, principal, id, u.EnabledEvents, u.Status))
}

// Redeliver queues the delivery of principal's event eventID to endpoint
// id again, whatever the endpoint's enabled_events say (it was asked for by
// name). It returns ErrNotFound, ErrDisabled, or events.ErrNotFound for an
// event that does not exist (or was swept after its retention).
func (f Fanout) Redeliver(ctx context.Context, tx pgx.Tx, principal, id, eventID uuid.UUID) error {
	if err := enabled(ctx, tx, principal, id); err != nil {
		return err
	}
	n, err := outbox.InsertEach(ctx, tx, deliveryKind, outbox.QueueWebhooks, len(f.Schedule), `
		SELECT e.principal_id, jsonb_build_object('event_id', e.id, 'endpoint_id', $6::uuid, 'principal_id', e.principal_id)
		FROM events e WHERE e.principal_id = $5 AND e.id = $7`, principal, id, eventID)
	if err != nil {
		return fmt.Errorf("redeliver event: %w", err)
	}
	if n == 0 {
		return events.ErrNotFound
	}
	return nil
}

// Recover queues again the delivery to endpoint id of every event of
// principal's made in [since, until) that its enabled_events take, oldest
// first, and returns how many. A window of more than MaxRecoverEvents events
// is refused with ErrTooManyEvents, and nothing is queued: recover it in
// parts.
func (f Fanout) Recover(ctx context.Context, tx pgx.Tx, principal, id uuid.UUID, since, until time.Time) (int64, error) {
	if err := enabled(ctx, tx, principal, id); err != nil {
		return 0, err
	}
	// The window, counted with a bound: one statement walks at most
	// MaxRecoverEvents + 1 events (the (principal_id, created_at) index).
	var n int64
	err := tx.QueryRow(ctx, `
		SELECT count(*) FROM (
			SELECT FROM events e JOIN webhook_endpoints w ON w.principal_id = e.principal_id
			WHERE e.principal_id = $1 AND w.principal_id = $1 AND w.id = $2
			  AND e.created_at >= $3 AND e.created_at < $4
			  AND ('*' = ANY (w.enabled_events) OR e.type = ANY (w.enabled_events))
			LIMIT $5) AS taken`, principal, id, since, until, MaxRecoverEvents+1).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count events to recover: %w", err)
	}
	if n > MaxRecoverEvents {
		return 0, ErrTooManyEvents
	}
	n, err = outbox.InsertEach(ctx, tx, deliveryKind, outbox.QueueWebhooks, len(f.Schedule), `
		SELECT e.principal_id, jsonb_build_object('event_id', e.id, 'endpoint_id', w.id, 'principal_id', e.principal_id)
		FROM events e JOIN webhook_endpoints w ON w.principal_id = e.principal_id
		WHERE e.principal_id = $5 AND w.principal_id = $5 AND w.id = $6
		  AND e.created_at >= $7 AND e.created_at < $8
		  AND ('*' = ANY (w.enabled_events) OR e.type = ANY (w.enabled_events))
		ORDER BY e.created_at, e.id`, principal, id, since, until)
	if err != nil {
		return 0, fmt.Errorf("recover events: %w", err)
	}
	return n, nil
}

// enabled checks that principal's endpoint id exists and is enabled.
func enabled(ctx context.Context, tx pgx.Tx, principal, id uuid.UUID) error {
	e, err := Get(ctx, tx, principal, id)
	switch {
	case err != nil:
		return err
	case e.Status == StatusDeleted:
		return ErrNotFound
	case e.Status != StatusEnabled:
		return ErrDisabled
	}
	return nil
}

// disableSQL stops deliveries to an endpoint whose receiver answered 410.
const disableSQL = `UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'receiver_gone' WHERE principal_id = $1 AND id = $2 AND status = 'enabled'`

// loadForDelivery is the statement that reads endpoint id for a delivery
// into *e; *found says whether it exists.
func loadForDelivery(principal, id uuid.UUID, e *Endpoint, found *bool) database.Statement {
	return database.Statement{SQL: getSQL, Args: []any{principal, id}, Row: func(row pgx.Row) error {
		var err error
		*e, err = scan(row)
		*found = err == nil
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}}
}

// Delivery is one attempt to deliver an event to an endpoint.
type Delivery struct {
	ID         uuid.UUID `json:"id"`
	EndpointID uuid.UUID `json:"endpoint_id"`
	EventID    uuid.UUID `json:"event_id"`
	Attempt    int       `json:"attempt"`
	// StatusCode is the receiver's answer; null when none came (a refused
	// connection, a timeout).
	StatusCode *int `json:"status_code"`
	// Error says why an attempt without an answer failed.
	Error      *string   `json:"error"`
	DurationMS int       `json:"duration_ms"`
	CreatedAt  time.Time `json:"created_at"`
}

// recordAttempt is the statement that records an attempt.
func recordAttempt(principal uuid.UUID, d Delivery) database.Statement {
	return database.Statement{SQL: `
		INSERT INTO webhook_deliveries (id, principal_id, endpoint_id, event_id, attempt, status_code, error, duration_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		Args: []any{d.ID, principal, d.EndpointID, d.EventID, d.Attempt, d.StatusCode, d.Error, d.DurationMS}}
}

// DeliveriesLimit is the most attempts one list response holds.
const DeliveriesLimit = 100

// ListDeliveries returns up to limit attempts to deliver to principal's
// endpoint endpointID, after the attempt with id after when it is not nil, and
// whether there are more, in the order they were recorded (final when an
// attempt becomes visible, as payments.List's). ErrNotFound when there is
// no such endpoint.
func ListDeliveries(ctx context.Context, db database.DBTX, principal, endpointID uuid.UUID, after *uuid.UUID, limit int) ([]Delivery, bool, error) {
	if _, err := Get(ctx, db, principal, endpointID); err != nil {
		return nil, false, err
	}
	rows, err := db.Query(ctx, `
		SELECT id, endpoint_id, event_id, attempt, status_code, error, duration_ms, created_at
		FROM webhook_deliveries
		WHERE principal_id = $1 AND endpoint_id = $2
		  AND xid < (SELECT list_horizon())
		  AND ($3::uuid IS NULL OR (xid, id) > (SELECT c.xid, c.id FROM webhook_deliveries c WHERE c.principal_id = $1 AND c.id = $3 AND c.endpoint_id = $2))
		ORDER BY xid, id LIMIT $4`, principal, endpointID, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list webhook deliveries: %w", err)
	}
	scan := func(row pgx.Row) (Delivery, error) {
		var d Delivery
		err := row.Scan(&d.ID, &d.EndpointID, &d.EventID, &d.Attempt, &d.StatusCode, &d.Error, &d.DurationMS, &d.CreatedAt)
		return d, err
	}
	return keyset.Page(rows, limit, scan, after, func(id uuid.UUID) (bool, error) {
		var exists bool
		err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM webhook_deliveries WHERE principal_id = $1 AND id = $2 AND endpoint_id = $3)`, principal, id, endpointID).Scan(&exists)
		return exists, err
	})
}
