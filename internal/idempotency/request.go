package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
)

// MaxKeyLength is the longest accepted Idempotency-Key.
const MaxKeyLength = 255

var (
	// ErrKeyMissing means the request has no Idempotency-Key.
	ErrKeyMissing = errors.New("idempotency key missing")
	// ErrKeyInvalid means the key is longer than MaxKeyLength or has a
	// character outside printable ASCII.
	ErrKeyInvalid = errors.New("idempotency key invalid")
	// ErrBodyNotJSON means the body is not exactly one JSON value.
	ErrBodyNotJSON = errors.New("request body is not valid JSON")
)

// ParseKey reads an Idempotency-Key header's value and validates the key.
// draft-ietf-httpapi-idempotency-key-header (section 2.1) defines the value as
// a Structured Field string, "8e03...", while Stripe's clients send a bare
// token; both are accepted and mean the same key: a value that begins with a
// double quote is parsed as an sf-string (RFC 8941, 3.3.3) and unquoted, and
// any other value is the key as sent. So "abc" and abc are one key.
func ParseKey(header string) (string, error) {
	key := header
	if strings.HasPrefix(header, `"`) {
		var ok bool
		if key, ok = unquoteSFString(header); !ok {
			return "", fmt.Errorf("%w: a quoted key must be a Structured Field string: printable ASCII between double quotes, with \\\\ and \\\" as the only escapes", ErrKeyInvalid)
		}
		if key == "" {
			return "", fmt.Errorf("%w: the quoted key is empty", ErrKeyInvalid)
		}
	}
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// unquoteSFString parses s as one RFC 8941 sf-string and returns its content.
func unquoteSFString(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s)-1 || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			b.WriteByte(s[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// ValidateKey checks an Idempotency-Key header value: 1-255 printable ASCII
// characters. Keys are compared byte for byte; they are case-sensitive.
func ValidateKey(key string) error {
	if key == "" {
		return ErrKeyMissing
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("%w: longer than %d characters", ErrKeyInvalid, MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("%w: only printable ASCII characters are allowed", ErrKeyInvalid)
		}
	}
	return nil
}

// Canonicalize returns body in a canonical JSON form: object keys sorted, no
// insignificant whitespace, strings re-escaped one way. Two bodies that decode
// to the same JSON value get the same bytes, so reordering keys or
// reformatting a retry does not make it look like a different request.
// Numbers keep their literal text (1000 and 1e3 stay different): decoding them
// to float64 would merge distinct large integers.
func Canonicalize(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBodyNotJSON, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: more than one JSON value", ErrBodyNotJSON)
	}
	// encoding/json sorts map keys and writes json.Number verbatim.
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonicalize: %w", err)
	}
	return out, nil
}

// Fingerprint identifies what a request asks for: sha256 over the method, the
// concrete path and the canonical body. Only this hash is stored, never the
// body, so the key table holds no request data.
func Fingerprint(method, path string, canonicalBody []byte) []byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canonicalBody)
	return h.Sum(nil)
}

// IntentKey names a client's intent by what survives a lost commit: the
// principal, the scope (the route and the client's Idempotency-Key) and the
// request's fingerprint. A payment row, and its id, can vanish with its
// commit (a lossy failover); the client's retry, with the same key and the
// same request, names the same intent, so a processor call keyed by it is
// answered with the first charge instead of making a second. Within the
// retry window a different request under the key is refused (422) before
// anything runs; after it, a different request is a different intent and
// key, while the same request again is taken for the same intent: the
// processor, within its own key window, answers with the first charge
// (docs/external-effects.md, "The processor's key"). A fork that changes
// the fingerprint changes every key: keep Fingerprint as it is for requests
// already made.
func IntentKey(principal uuid.UUID, s Scope, fingerprint []byte) string {
	h := sha256.New()
	h.Write(principal[:])
	for _, part := range []string{s.Endpoint, s.Key} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	h.Write(fingerprint)
	return "intent_" + hex.EncodeToString(h.Sum(nil))
}

// caller is the principal a claim names and, once the claim's round trip
// has run, the one the authentication found.
type caller struct {
	named         uuid.UUID
	authenticated *uuid.UUID
}

// check fails when the authentication found another principal than the
// claim named. It cannot happen (a key's principal never changes), and
// row-level security would have refused the claim's row.
func (c caller) check() error {
	if *c.authenticated != c.named {
		return fmt.Errorf("claim key: named principal %s, authenticated %s", c.named, *c.authenticated)
	}
	return nil
}

// authenticate returns the statements the claim's round trip begins with,
// the caller's authentication (which sets the transaction's tenant), and
// the principal the claim names. That principal is known before the
// authentication answers once this process has seen the caller's key
// (Request.Principal); the first time, the authentication runs in a round
// trip of its own, and the claim's begins with nothing more.
func authenticate(ctx context.Context, tx pgx.Tx, req Request) ([]database.Statement, caller, error) {
	first, authenticated := req.Authenticate()
	c := caller{named: req.Principal, authenticated: authenticated}
	if c.named != uuid.Nil {
		return []database.Statement{first}, c, nil
	}
	if err := database.Send(ctx, tx, first); err != nil {
		return nil, c, fmt.Errorf("authenticate: %w", err)
	}
	c.named = *c.authenticated
	return nil, c, nil
}
