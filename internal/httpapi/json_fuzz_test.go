package httpapi

import (
	"bytes"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/payments-reference/idempotent-payments/internal/payments"
)

// The fingerprint is taken over the canonical body, so whatever decodeJSON
// accepts must decode to the same request as its canonical form does: then
// one fingerprint always means one request. (Run longer with
// go test -fuzz FuzzDecodeJSON ./internal/httpapi; the committed seed corpus
// is in testdata/fuzz.)
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"amount": 1000, "currency": "usd"}`,
		`{"amount":1,"Amount":1000,"currency":"usd"}`,
		`{"AMOUNT":7,"currency":"usd"}`,
		`{"amount":7,"currency":"usd","metadata":{"a":"1","a":"2"}}`,
		`{"amount":7,"currency":"usd","description":"caf\u00e9 \ud83d\ude00","metadata":{"k":"v"}}`,
		`{"amount":1e3,"currency":"usd"}`,
		`[1,{"a":[{"b":1}]}]`,
		``,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		decode := func(b string) (payments.NewPayment, []byte, error) {
			var p payments.NewPayment
			r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(b))
			r.Header.Set("Content-Type", "application/json")
			canonical, err := decodeJSON(httptest.NewRecorder(), r, 1<<20, &p)
			return p, canonical, err
		}
		p, canonical, err := decode(body)
		if err != nil {
			return
		}
		again, canonicalAgain, err := decode(string(canonical))
		if err != nil {
			t.Fatalf("accepted %q but refused its canonical form %q: %v", body, canonical, err)
		}
		if !reflect.DeepEqual(p, again) {
			t.Fatalf("%q and its canonical form %q decode differently: %+v vs %+v", body, canonical, p, again)
		}
		if !bytes.Equal(canonical, canonicalAgain) {
			t.Fatalf("canonical form is not stable: %q then %q", canonical, canonicalAgain)
		}
	})
}
