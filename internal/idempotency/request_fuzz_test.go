package idempotency_test

import (
	"errors"
	"testing"

	"golang.org/x/net/http/httpguts"

	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

// A key ValidateKey accepts is 1-255 printable ASCII characters, so it can be
// stored as text, sent back in a header and logged without escaping; any
// other value is refused as missing or invalid, never anything else. (Run
// longer with go test -fuzz FuzzValidateKey ./internal/idempotency; the
// committed seed corpus is in testdata/fuzz.)
func FuzzValidateKey(f *testing.F) {
	for _, seed := range []string{
		"", "k", "order-1234", " ", "~", "\x7f", "\x00", "key\r\nX-Injected: 1", "clé", "\xff",
		string(make([]byte, idempotency.MaxKeyLength)), string(make([]byte, idempotency.MaxKeyLength+1)),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := idempotency.ValidateKey(key)
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
		case key == "":
			if !errors.Is(err, idempotency.ErrKeyMissing) {
				t.Fatalf("empty key: %v", err)
			}
		case !errors.Is(err, idempotency.ErrKeyInvalid):
			t.Fatalf("ValidateKey(%q): %v is not ErrKeyInvalid", key, err)
		}
	})
}
