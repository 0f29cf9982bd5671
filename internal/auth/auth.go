// Package auth authenticates API keys and says what their principal may do.
//
// A principal is a tenant. API keys belong to one principal and carry scopes.
// Only the sha256 of a key's secret is stored; the secret is shown once, when
// the key is created.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// Scopes a key can hold.
const (
	ScopePaymentsRead  = "payments:read"
	ScopePaymentsWrite = "payments:write"
	ScopeRefundsRead   = "refunds:read"
	ScopeRefundsWrite  = "refunds:write"
	ScopeEventsRead    = "events:read"
	ScopeWebhooksWrite = "webhooks:write"
)

// KnownScopes lists every scope, in the order they are documented.
var KnownScopes = []string{ScopePaymentsRead, ScopePaymentsWrite, ScopeRefundsRead, ScopeRefundsWrite, ScopeEventsRead, ScopeWebhooksWrite}

// secretPrefix makes leaked secrets recognisable to secret scanners.
const secretPrefix = "sk_"

var (
	// ErrUnauthenticated means the secret is missing, unknown, malformed or
	// revoked. The cases are deliberately indistinguishable to the caller.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrForbidden means the key is valid but lacks the scope.
	ErrForbidden = errors.New("forbidden")
	// ErrKeyNotFound means no API key has the given id.
	ErrKeyNotFound = errors.New("api key not found")
	// ErrInvalidInput means a principal name or scope list is not acceptable.
	ErrInvalidInput = errors.New("invalid input")
)

// Principal is an authenticated caller: the tenant and the key it used.
type Principal struct {
	ID     uuid.UUID
	KeyID  uuid.UUID
	Scopes []string
}

// MissingScopeError is ErrForbidden for one scope: the key is valid but
// lacks Scope. Naming it tells the caller exactly which key to make.
type MissingScopeError struct{ Scope string }

func (e *MissingScopeError) Error() string { return "forbidden: missing scope " + e.Scope }

// Is makes a MissingScopeError match ErrForbidden.
func (e *MissingScopeError) Is(target error) bool { return target == ErrForbidden }

// ParseBearer returns the credentials of an Authorization header of the form
// "Bearer <token>" (RFC 6750 section 2.1: the scheme in any case, one or more
// spaces, a b64token). Anything else is ErrUnauthenticated, so an odd header
// never reaches the database.
func ParseBearer(header string) (string, error) {
	scheme, rest, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", ErrUnauthenticated
	}
	token := strings.TrimLeft(rest, " ")
	if !isB64Token(token) {
		return "", ErrUnauthenticated
	}
	return token, nil
}

// isB64Token reports whether s is RFC 6750's b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isB64Token(s string) bool {
	body := strings.TrimRight(s, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == '+', c == '/':
		default:
			return false
		}
	}
	return true
}

// Credentials are a request's bearer secret, as the database checks it: its
// sha256. The secret itself goes no further than ParseCredentials.
type Credentials struct {
	hash  [sha256.Size]byte
	known *KeyPrincipals // nil: the principal is learnt by authenticating
}

// Principal returns the principal of the credentials' key when it is known
// before authenticating (KeyPrincipals), to name in the statements that
// travel with the authentication. It grants nothing: the authentication
// still decides.
func (c Credentials) Principal() (uuid.UUID, bool) {
	if c.known == nil {
		return uuid.Nil, false
	}
	return c.known.lookup(c.hash)
}

// ParseCredentials reads an Authorization header ("Bearer sk_...").
// Anything that cannot be a key's secret is ErrUnauthenticated here, so an
// odd header never reaches the database.
func ParseCredentials(header string) (Credentials, error) {
	secret, err := ParseBearer(header)
	if err != nil {
		return Credentials{}, err
	}
	if !strings.HasPrefix(secret, secretPrefix) || len(secret) > 128 {
		return Credentials{}, ErrUnauthenticated
	}
	return Credentials{hash: sha256.Sum256([]byte(secret))}, nil
}

// authenticateSQL authenticates and sets the transaction's tenant in one
// statement: authenticate_request (migration 000012) finds the live key with
// this hash, checks scope, and sets app.principal_id to the key's principal.
// It runs on every request, replays included, so a revoked key stops
// working at once. The service role cannot read api_keys itself.
const authenticateSQL = `SELECT key_id, principal_id, scopes FROM authenticate_request($1, $2)`

// Authentication is the statement that authenticates c for scope and sets
// the tenant, storing the caller in *p when it runs. It must be the first
// statement sent in a transaction begun without a tenant (database.InTx):
// if it fails, nothing sent after it runs.
func (c Credentials) Authentication(scope string, p *Principal) database.Statement {
	return database.Statement{SQL: authenticateSQL, Args: []any{c.hash[:], scope}, Row: func(row pgx.Row) error {
		return c.scan(row, scope, p)
	}}
}

// Authenticate authenticates c for scope as one statement in tx, and sets
// tx's tenant: for a transaction with nothing to batch with it.
func (c Credentials) Authenticate(ctx context.Context, tx pgx.Tx, scope string) (Principal, error) {
	var p Principal
	err := c.scan(tx.QueryRow(ctx, authenticateSQL, c.hash[:], scope), scope, &p)
	return p, err
}

// scan reads authenticate_request's answer, turning its refusals into
// ErrUnauthenticated and MissingScopeError, and remembers the key's
// principal when it was authenticated.
func (c Credentials) scan(row pgx.Row, scope string, p *Principal) error {
	err := row.Scan(&p.KeyID, &p.ID, &p.Scopes)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		if c.known != nil {
			c.known.remember(c.hash, p.ID)
		}
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "PA401":
		return ErrUnauthenticated
	case errors.As(err, &pgErr) && pgErr.Code == "PA403":
		return &MissingScopeError{Scope: scope}
	}
	return fmt.Errorf("authenticate: %w", err)
}

// NewKey is a freshly created API key. Secret is never stored or shown again.
type NewKey struct {
	ID            uuid.UUID `json:"id"`
	PrincipalID   uuid.UUID `json:"principal_id"`
	PrincipalName string    `json:"principal"`
	Scopes        []string  `json:"scopes"`
	Secret        string    `json:"secret"`
	CreatedAt     time.Time `json:"created_at"`
}

// CreateKey creates a key for the principal called name, creating the
// principal first if it does not exist. It runs as the owner role: the
// service role cannot write keys.
func CreateKey(ctx context.Context, tx pgx.Tx, name string, scopes []string) (NewKey, error) {
	if name == "" || len(name) > 200 {
		return NewKey{}, fmt.Errorf("%w: principal name must be 1-200 characters", ErrInvalidInput)
	}
	if len(scopes) == 0 {
		return NewKey{}, fmt.Errorf("%w: at least one scope is required (%s)", ErrInvalidInput, strings.Join(KnownScopes, ", "))
	}
	for _, s := range scopes {
		if !slices.Contains(KnownScopes, s) {
			return NewKey{}, fmt.Errorf("%w: unknown scope %q (known: %s)", ErrInvalidInput, s, strings.Join(KnownScopes, ", "))
		}
	}
	k := NewKey{ID: uuid.Must(uuid.NewV7()), PrincipalName: name, Scopes: slices.Compact(slices.Sorted(slices.Values(scopes)))}
	// DO UPDATE (a no-op write) rather than DO NOTHING so RETURNING yields the
	// existing principal's id too.
	err := tx.QueryRow(ctx, `
		INSERT INTO principals (id, name) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
		RETURNING id`, uuid.Must(uuid.NewV7()), name).Scan(&k.PrincipalID)
	if err != nil {
		return NewKey{}, fmt.Errorf("upsert principal: %w", err)
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails
	k.Secret = secretPrefix + base64.RawURLEncoding.EncodeToString(raw)
	hash := sha256.Sum256([]byte(k.Secret))
	err = tx.QueryRow(ctx, `
		INSERT INTO api_keys (id, principal_id, secret_hash, scopes) VALUES ($1, $2, $3, $4)
		RETURNING created_at`, k.ID, k.PrincipalID, hash[:], k.Scopes).Scan(&k.CreatedAt)
	if err != nil {
		return NewKey{}, fmt.Errorf("insert api key: %w", err)
	}
	return k, nil
}

// KeyInfo is an API key as an operator sees it: never its secret, which is
// not stored, nor its hash.
type KeyInfo struct {
	ID            uuid.UUID  `json:"id"`
	PrincipalID   uuid.UUID  `json:"principal_id"`
	PrincipalName string     `json:"principal"`
	Scopes        []string   `json:"scopes"`
	CreatedAt     time.Time  `json:"created_at"`
	RevokedAt     *time.Time `json:"revoked_at"`
}

// ListKeys returns every API key, or those of the principal called name
// when it is not empty, oldest first. It runs as the owner role.
func ListKeys(ctx context.Context, db database.DBTX, name string) ([]KeyInfo, error) {
	rows, err := db.Query(ctx, `
		SELECT k.id, k.principal_id, p.name, k.scopes, k.created_at, k.revoked_at
		FROM api_keys k JOIN principals p ON p.id = k.principal_id
		WHERE $1 = '' OR p.name = $1
		ORDER BY k.created_at, k.id`, name)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyInfo, error) {
		var k KeyInfo
		err := r.Scan(&k.ID, &k.PrincipalID, &k.PrincipalName, &k.Scopes, &k.CreatedAt, &k.RevokedAt)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// RevokeKey revokes the key with the given id. Revoking twice is not an error.
func RevokeKey(ctx context.Context, db database.DBTX, id uuid.UUID) error {
	// Not SET revoked_at = coalesce(revoked_at, now()): Citus refuses a
	// function that is not IMMUTABLE inside COALESCE or CASE
	// (docs/scaling.md). The first revocation's time stands.
	tag, err := db.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`, id)
	if err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT FROM api_keys WHERE id = $1)`, id).Scan(&exists); err != nil {
		return fmt.Errorf("revoke api key: %w", err)
	}
	if !exists {
		return ErrKeyNotFound
	}
	return nil
}

type credentialsKey struct{}

// WithCredentials returns a context carrying c, for the transaction that
// will authenticate them.
func WithCredentials(ctx context.Context, c Credentials) context.Context {
	return context.WithValue(ctx, credentialsKey{}, c)
}

// CredentialsFrom returns the request's credentials, and false when it
// carried none.
func CredentialsFrom(ctx context.Context) (Credentials, bool) {
	c, ok := ctx.Value(credentialsKey{}).(Credentials)
	return c, ok
}
