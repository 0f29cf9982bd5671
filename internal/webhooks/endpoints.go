package webhooks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/keyset"
	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// Limits on endpoints.
const (
	// MaxEndpoints is the most endpoints, enabled or disabled, one
	// principal may have: each event is one delivery job per endpoint.
	MaxEndpoints = 16
	// MaxDescriptionLength bounds an endpoint's description.
	MaxDescriptionLength = 1000
)

// An endpoint's statuses. A disabled endpoint (its receiver answered 410
// Gone) and a deleted one get no deliveries.
const (
	StatusEnabled  = "enabled"
	StatusDisabled = "disabled"
	StatusDeleted  = "deleted"
)

var (
	// ErrNotFound means no endpoint with that id is visible to the
	// principal (or it was deleted).
	ErrNotFound = errors.New("webhook endpoint not found")
	// ErrTooManyEndpoints means the principal has MaxEndpoints already.
	// Nothing was recorded.
	ErrTooManyEndpoints = fmt.Errorf("at most %d webhook endpoints per account", MaxEndpoints)
)

// Endpoint is a registered webhook endpoint as clients see it.
type Endpoint struct {
	ID          uuid.UUID `json:"id"`
	URL         string    `json:"url"`
	Description *string   `json:"description"`
	Status      string    `json:"status"`
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
	return c.Err()
}

const columns = `id, url, description, status, secret_version, previous_secret_expires_at, created_at`

func scan(row pgx.Row) (Endpoint, error) {
	var e Endpoint
	err := row.Scan(&e.ID, &e.URL, &e.Description, &e.Status, &e.secretVersion, &e.PreviousSecretExpiresAt, &e.CreatedAt)
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
	e := Endpoint{ID: uuid.Must(uuid.NewV7()), URL: n.URL, Description: n.Description, Status: StatusEnabled, CreatedAt: now, secretVersion: 1}
	// A statement of its own after the lock: its snapshot sees every
	// endpoint committed before the lock was granted.
	tag, err := tx.Exec(ctx, `
		INSERT INTO webhook_endpoints (id, principal_id, url, description, status, created_at)
		SELECT $1, $2, $3, $4, $5, $6
		WHERE (SELECT count(*) FROM webhook_endpoints WHERE principal_id = $2 AND status <> 'deleted') < $7`,
		e.ID, principal, e.URL, e.Description, e.Status, e.CreatedAt, MaxEndpoints)
	if err != nil {
		return Endpoint{}, fmt.Errorf("create webhook endpoint: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Endpoint{}, ErrTooManyEndpoints
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

// disableSQL stops deliveries to an endpoint whose receiver answered 410.
const disableSQL = `UPDATE webhook_endpoints SET status = 'disabled' WHERE principal_id = $1 AND id = $2 AND status = 'enabled'`

// queueGetForDelivery reads endpoint id for a delivery into *e; *found says
// whether it exists.
func queueGetForDelivery(b *pgx.Batch, principal, id uuid.UUID, e *Endpoint, found *bool) {
	b.Queue(getSQL, principal, id).QueryRow(func(row pgx.Row) error {
		var err error
		*e, err = scan(row)
		*found = err == nil
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	})
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

// queueRecord records an attempt on b.
func queueRecord(b *pgx.Batch, principal uuid.UUID, d Delivery) {
	b.Queue(`
		INSERT INTO webhook_deliveries (id, principal_id, endpoint_id, event_id, attempt, status_code, error, duration_ms)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		d.ID, principal, d.EndpointID, d.EventID, d.Attempt, d.StatusCode, d.Error, d.DurationMS).Exec(func(pgconn.CommandTag) error { return nil })
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
