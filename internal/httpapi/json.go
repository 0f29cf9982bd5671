package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// decodeJSON reads r's body (at most maxBytes) into dst, rejecting unknown
// fields, and returns the body's canonical form for fingerprinting. An empty
// body is read as {}: every field of every request here is optional or
// validated separately.
func decodeJSON(w http.ResponseWriter, r *http.Request, maxBytes int64, dst any) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, errPayloadTooLarge
	}
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	} else if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, errUnsupportedMediaType
	}
	canonical, err := idempotency.Canonicalize(body)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return nil, decodeError(err)
	}
	return canonical, nil
}

// decodeError turns a decoding error of well-formed JSON into field errors.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		field := typeErr.Field
		if field == "" {
			field = "(body)"
		}
		return &validation.Error{Fields: []validation.FieldError{{Field: field, Message: "must be of type " + jsonType(typeErr.Type.Kind().String())}}}
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return &validation.Error{Fields: []validation.FieldError{{Field: strings.Trim(name, `"`), Message: "is not a known field"}}}
	}
	return &validation.Error{Fields: []validation.FieldError{{Field: "(body)", Message: "does not match the expected shape"}}}
}

func jsonType(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "integer"
	case "map", "struct":
		return "object"
	case "slice", "array":
		return "array"
	case "ptr":
		return "the documented type"
	default:
		return kind
	}
}

// writeJSON renders v as the body of a fresh response.
func renderJSON(status int, v any) (idempotency.Response, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("render response: %w", err)
	}
	return idempotency.Response{Status: status, ContentType: "application/json", Body: b}, nil
}

// writeResponse sends a rendered response.
func writeResponse(w http.ResponseWriter, resp idempotency.Response) {
	w.Header().Set("Content-Type", resp.ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}
