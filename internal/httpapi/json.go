package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"reflect"
	"strings"

	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
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
		// Failing to read the body is the client's doing: it was too slow
		// for the server's ReadTimeout, or it went away mid-body. Either way
		// nothing was claimed, and it is no server fault to log as one.
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("read body: %w: %w", errBodyTimeout, err)
		}
		return nil, fmt.Errorf("read body: %w: %w", idempotency.ErrBodyNotJSON, err)
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
	if err := exactMembers(body, dst); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return nil, decodeError(err)
	}
	return canonical, nil
}

// exactMembers refuses what encoding/json would quietly accept: a member
// name twice in one object (the last wins), a top-level name that matches a
// field only when case is ignored ("Amount" for "amount"), and null where the
// contract does not allow it (encoding/json reads null as "leave the field
// as it is", so {"amount": null} would be an absent amount: a refund of
// everything that remains). The fingerprint is taken over the body's
// canonical form, which keeps every name and null as sent, so any of these
// would let the fingerprint and what executes disagree: one key could replay
// a different intent, or refuse the same one. body is valid JSON here.
//
// null is allowed for a top-level field of type *string alone (the optional
// texts: a description, a refund's reason), where it means absent, as
// openapi.yaml's `nullable` says; TestRequestBodiesAgainstTheSpec holds the
// two to each other.
func exactMembers(body []byte, dst any) error {
	known := map[string]bool{}
	nullable := map[string]bool{}
	if t := reflect.TypeOf(dst); t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		for f := range t.Elem().Fields() {
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
				known[name] = true
				nullable[name] = f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.String
			}
		}
	}
	type frame struct {
		names      map[string]bool // nil for an array
		expectName bool
		path       string // where this object or array is: "" for the body, "metadata"
		member     string // the member whose value comes next
	}
	var stack []*frame
	// where names the value that comes next, for an error about it.
	where := func() string {
		f := stack[len(stack)-1]
		if f.names == nil {
			return f.path + "[]"
		}
		if f.path == "" {
			return f.member
		}
		return f.path + "." + f.member
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %w", idempotency.ErrBodyNotJSON, err)
		}
		if len(stack) == 0 && tok != json.Delim('{') {
			return fieldError("(body)", "must be a JSON object")
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			path := ""
			if len(stack) > 0 {
				path = where()
			}
			f := &frame{path: path}
			if tok == json.Delim('{') {
				f.names, f.expectName = map[string]bool{}, true
			}
			stack = append(stack, f)
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		case nil:
			if top := len(stack) - 1; top > 0 || !nullable[stack[0].member] {
				return fieldError(where(), "must not be null")
			}
		default:
			if top := len(stack) - 1; top >= 0 && stack[top].expectName {
				name := tok.(string)
				if stack[top].names[name] {
					return fieldError(name, "appears more than once")
				}
				stack[top].names[name] = true
				if top == 0 && len(known) > 0 && !known[name] {
					return fieldError(name, "is not a known field (names are case-sensitive)")
				}
				stack[top].expectName = false
				stack[top].member = name
				continue
			}
		}
		// A value ended: in an object, a name comes next.
		if top := len(stack) - 1; top >= 0 && stack[top].names != nil {
			stack[top].expectName = true
		}
	}
}

func fieldError(field, message string) error {
	return &validation.Error{Fields: []validation.FieldError{{Field: field, Message: message}}}
}

// decodeError turns a decoding error of well-formed JSON into field errors.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		field := typeErr.Field
		if field == "" {
			field = "(body)"
		}
		kind := typeErr.Type.Kind().String()
		if strings.HasPrefix(typeErr.Value, "number") && jsonType(kind) == "integer" {
			// A number, but not an int64: a fraction, or beyond 2^63. Every
			// integer of a request body is an amount.
			return &validation.Error{Fields: []validation.FieldError{{Field: field, Message: fmt.Sprintf("must be a whole number of minor units from 1 to %d", payments.MaxAmount)}}}
		}
		return &validation.Error{Fields: []validation.FieldError{{Field: field, Message: "must be of type " + jsonType(kind)}}}
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

// renderJSON renders v as the body of a fresh response.
func renderJSON(status int, v any) (idempotency.Response, error) {
	b, err := renderBody(v)
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{Status: status, ContentType: "application/json", Body: b}, nil
}

// renderBody is a response's JSON body.
func renderBody(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("render response: %w", err)
	}
	return b, nil
}

// writeResponse sends a rendered response.
func writeResponse(w http.ResponseWriter, resp idempotency.Response) {
	w.Header().Set("Content-Type", resp.ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}
