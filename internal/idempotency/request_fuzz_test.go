package idempotency_test

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// A key ParseKey accepts is 1-255 printable ASCII characters, so it can be
// stored as text, sent back in a header and logged without escaping; any
// other value is refused as missing or invalid, never anything else. A bare
// value is the key as sent; a quoted one is an sf-string whose content is the
// key, so quoting the key again gives the same key. (Run longer with
// go test -fuzz FuzzParseKey ./internal/idempotency; the committed seed corpus
// is in testdata/fuzz.)
func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{
		"", "k", "order-1234", " ", "~", "\x7f", "\x00", "key\r\nX-Injected: 1", "clé", "\xff",
		string(make([]byte, idempotency.MaxKeyLength)), string(make([]byte, idempotency.MaxKeyLength+1)),
		`"abc"`, `""`, `"`, `"a\"b"`, `"a\\b"`, `"a\b"`, `"a"b"`, `"abc`, `"` + strings.Repeat("k", idempotency.MaxKeyLength) + `"`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := idempotency.ParseKey(header)
		switch {
		case err == nil:
			if len(key) == 0 || len(key) > idempotency.MaxKeyLength {
				t.Fatalf("accepted a key of %d bytes", len(key))
			}
			for i := 0; i < len(key); i++ {
				if key[i] < 0x20 || key[i] > 0x7e {
					t.Fatalf("accepted %q with byte %#x", key, key[i])
				}
			}
			if !httpguts.ValidHeaderFieldValue(key) {
				t.Fatalf("accepted %q, which is not a valid header value", key)
			}
			if !strings.HasPrefix(header, `"`) && key != header {
				t.Fatalf("a bare value %q became the key %q", header, key)
			}
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
			if again, err := idempotency.ParseKey(quoted); err != nil || again != key {
				t.Fatalf("%q quoted as %q parses to %q, %v", key, quoted, again, err)
			}
		case header == "":
			if !errors.Is(err, idempotency.ErrKeyMissing) {
				t.Fatalf("empty key: %v", err)
			}
		case !errors.Is(err, idempotency.ErrKeyInvalid):
			t.Fatalf("ParseKey(%q): %v is not ErrKeyInvalid", header, err)
		}
	})
}
