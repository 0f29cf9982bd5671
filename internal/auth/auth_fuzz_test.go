package auth

import (
	"errors"
	"strings"
	"testing"
)

// Whatever ParseBearer accepts is a non-empty b64token that the header ends
// with, after "Bearer" and spaces; whatever it refuses is ErrUnauthenticated.
// And every b64token is accepted back. (Run longer with
// go test -fuzz FuzzParseBearer ./internal/auth; the committed seed corpus
// is in testdata/fuzz.)
func FuzzParseBearer(f *testing.F) {
	for _, seed := range []string{
		"Bearer sk_abc", "bearer sk_abc", "BEARER  sk_abc==", "Bearer", "Bearer ", "Bearer a b",
		"Basic dXNlcjpwYXNz", "Bearer\tsk_abc", "Bearer sk_\x00", "Bearer =", "Bearer sk_é", " Bearer sk_abc",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		token, err := ParseBearer(header)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("ParseBearer(%q): %v is not ErrUnauthenticated", header, err)
			}
		} else {
			if !isB64Token(token) || !strings.HasSuffix(header, " "+token) ||
				!strings.EqualFold(strings.TrimRight(strings.TrimSuffix(header, token), " "), "Bearer") {
				t.Fatalf("ParseBearer(%q) = %q", header, token)
			}
		}
		if isB64Token(header) {
			if got, err := ParseBearer("Bearer " + header); err != nil || got != header {
				t.Fatalf("the token %q came back as %q, %v", header, got, err)
			}
		}
	})
}
