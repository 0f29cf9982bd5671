// Package payments owns the payments table: validating a new payment,
// inserting it, and reading it back.
//
// A payment here succeeds the moment it is recorded; there is no card network
// behind it. The interesting part of this project is what protects the write,
// not the write itself.
package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// Limits on what a client may send.
const (
	MaxDescriptionLength = 1000
	MaxMetadataKeys      = 20
	MaxMetadataKeyLength = 40
	MaxMetadataValue     = 500
)

// StatusSucceeded is the status of every recorded payment.
const StatusSucceeded = "succeeded"

// ErrNotFound means no payment with that id is visible to the principal.
var ErrNotFound = errors.New("payment not found")

// FieldError is one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// ValidationError lists every invalid field of a request.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		msgs[i] = f.Field + ": " + f.Message
	}
	return "invalid payment: " + strings.Join(msgs, "; ")
}

// Payment is a recorded payment as clients see it.
type Payment struct {
	ID          uuid.UUID         `json:"id"`
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Status      string            `json:"status"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
	CreatedAt   time.Time         `json:"created_at"`
}

// NewPayment is a request to create a payment. Amount is in minor units
// (cents for usd); Currency is an ISO 4217 code in either case.
type NewPayment struct {
	Amount      *int64            `json:"amount"`
	Currency    string            `json:"currency"`
	Description *string           `json:"description"`
	Metadata    map[string]string `json:"metadata"`
}

// Validate checks every field and reports all problems at once.
func (n NewPayment) Validate() error {
	var fe []FieldError
	switch {
	case n.Amount == nil:
		fe = append(fe, FieldError{"amount", "is required"})
	case *n.Amount <= 0:
		fe = append(fe, FieldError{"amount", "must be a positive integer number of minor units"})
	}
	if n.Currency == "" {
		fe = append(fe, FieldError{"currency", "is required"})
	} else if !IsCurrency(n.Currency) {
		fe = append(fe, FieldError{"currency", "must be a three-letter ISO 4217 currency code"})
	}
	if n.Description != nil && utf8.RuneCountInString(*n.Description) > MaxDescriptionLength {
		fe = append(fe, FieldError{"description", fmt.Sprintf("must be at most %d characters", MaxDescriptionLength)})
	}
	if len(n.Metadata) > MaxMetadataKeys {
		fe = append(fe, FieldError{"metadata", fmt.Sprintf("must have at most %d keys", MaxMetadataKeys)})
	}
	for k, v := range n.Metadata {
		if k == "" || utf8.RuneCountInString(k) > MaxMetadataKeyLength {
			fe = append(fe, FieldError{"metadata", fmt.Sprintf("keys must be 1-%d characters", MaxMetadataKeyLength)})
			break
		}
		if utf8.RuneCountInString(v) > MaxMetadataValue {
			fe = append(fe, FieldError{"metadata." + k, fmt.Sprintf("must be at most %d characters", MaxMetadataValue)})
		}
	}
	if len(fe) > 0 {
		return &ValidationError{Fields: fe}
	}
	return nil
}

// Create records a validated payment for principal in tx.
func Create(ctx context.Context, tx pgx.Tx, principal uuid.UUID, n NewPayment) (Payment, error) {
	p := Payment{
		ID:          uuid.Must(uuid.NewV7()), // time-ordered: new rows land at the right edge of the primary key index
		Amount:      *n.Amount,
		Currency:    strings.ToLower(n.Currency),
		Status:      StatusSucceeded,
		Description: n.Description,
		Metadata:    n.Metadata,
	}
	if p.Metadata == nil {
		p.Metadata = map[string]string{}
	}
	err := tx.QueryRow(ctx, `
		INSERT INTO payments (id, principal_id, amount, currency, status, description, metadata, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now())
		RETURNING created_at`,
		p.ID, principal, p.Amount, p.Currency, p.Status, p.Description, p.Metadata).Scan(&p.CreatedAt)
	if err != nil {
		return Payment{}, fmt.Errorf("insert payment: %w", database.Classify(err))
	}
	return p, nil
}

// Get returns the payment with id. Row-level security hides other principals'
// payments, which therefore look exactly like missing ones.
func Get(ctx context.Context, db database.DBTX, id uuid.UUID) (Payment, error) {
	var p Payment
	err := db.QueryRow(ctx, `
		SELECT id, amount, currency, status, description, metadata, created_at
		FROM payments WHERE id = $1`, id).
		Scan(&p.ID, &p.Amount, &p.Currency, &p.Status, &p.Description, &p.Metadata, &p.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("get payment: %w", database.Classify(err))
	}
	return p, nil
}
