package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
