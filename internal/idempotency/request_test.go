package idempotency_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/idempotency"
)

func TestCanonicalizeIgnoresKeyOrderAndWhitespace(t *testing.T) {
	t.Parallel()
	a, err := idempotency.Canonicalize([]byte(`{"b": [1, {"y": 2, "x": "\u00e9"}], "a": null}`))
	require.NoError(t, err)
	b, err := idempotency.Canonicalize([]byte("{\n\"a\":null,\t\"b\":[1,{\"x\":\"é\",\"y\":2}]}\n"))
	require.NoError(t, err)
	require.Equal(t, string(a), string(b))
	require.Equal(t, `{"a":null,"b":[1,{"x":"é","y":2}]}`, string(a))
}

func TestCanonicalizeKeepsDifferentValuesApart(t *testing.T) {
	t.Parallel()
	for _, pair := range [][2]string{
		{`{"amount": 1000}`, `{"amount": 1001}`},
		{`{"amount": 9007199254740993}`, `{"amount": 9007199254740992}`}, // equal as float64
		{`{"a": "1"}`, `{"a": 1}`},
		{`{"a": []}`, `{"a": {}}`},
		{`{"a": null}`, `{}`},
	} {
		a, err := idempotency.Canonicalize([]byte(pair[0]))
		require.NoError(t, err)
		b, err := idempotency.Canonicalize([]byte(pair[1]))
		require.NoError(t, err)
		require.NotEqual(t, string(a), string(b), "%s vs %s", pair[0], pair[1])
	}
}

func TestCanonicalizeRejectsNonJSON(t *testing.T) {
	t.Parallel()
	for _, body := range []string{``, `{`, `{"a":1} {"b":2}`, `{"a":1}x`, `nul`} {
		_, err := idempotency.Canonicalize([]byte(body))
		require.ErrorIs(t, err, idempotency.ErrBodyNotJSON, "body %q", body)
	}
}

func TestFingerprintCoversMethodPathAndBody(t *testing.T) {
	t.Parallel()
	base := idempotency.Fingerprint("POST", "/v1/payments/a/refunds", []byte(`{}`))
	require.Len(t, base, 32)
	require.Equal(t, base, idempotency.Fingerprint("POST", "/v1/payments/a/refunds", []byte(`{}`)))
	require.NotEqual(t, base, idempotency.Fingerprint("POST", "/v1/payments/b/refunds", []byte(`{}`)))
	require.NotEqual(t, base, idempotency.Fingerprint("PUT", "/v1/payments/a/refunds", []byte(`{}`)))
	require.NotEqual(t, base, idempotency.Fingerprint("POST", "/v1/payments/a/refunds", []byte(`{"amount":1}`)))
	// The separator keeps path and body from sliding into each other.
	require.NotEqual(t,
		idempotency.Fingerprint("POST", "/a", []byte(`b{}`)),
		idempotency.Fingerprint("POST", "/ab", []byte(`{}`)))
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, idempotency.ValidateKey(""), idempotency.ErrKeyMissing)
	require.NoError(t, idempotency.ValidateKey("a"))
	require.NoError(t, idempotency.ValidateKey("order 42/retry:1 ~!"))
	require.NoError(t, idempotency.ValidateKey(strings.Repeat("k", 255)))
	require.ErrorIs(t, idempotency.ValidateKey(strings.Repeat("k", 256)), idempotency.ErrKeyInvalid)
	require.ErrorIs(t, idempotency.ValidateKey("tab\there"), idempotency.ErrKeyInvalid)
	require.ErrorIs(t, idempotency.ValidateKey("del\x7f"), idempotency.ErrKeyInvalid)
	require.ErrorIs(t, idempotency.ValidateKey("clé"), idempotency.ErrKeyInvalid)
}

// FuzzCanonicalize checks, for any input, that canonicalizing never panics,
// is idempotent, and yields JSON that decodes to the same value.
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []string{
		`{"amount": 1000, "currency": "usd"}`,
		`{"b":[1,{"y":2,"x":"\u00e9"}],"a":null}`,
		`[1e3, -0, 0.1, 1E-7]`,
		`"\ud800"`,
		`{"a":{"a":{"a":[]}}}`,
		`{"<>&": "\u2028"}`,
		"\xff",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := idempotency.Canonicalize(body)
		if err != nil {
			return
		}
		again, err := idempotency.Canonicalize(c)
		require.NoError(t, err)
		require.Equal(t, string(c), string(again))
		if !json.Valid(body) {
			return
		}
		var want, got any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&want))
		dec = json.NewDecoder(bytes.NewReader(c))
		dec.UseNumber()
		require.NoError(t, dec.Decode(&got))
		require.Equal(t, want, got)
	})
}

// The header is parsed as draft-ietf-httpapi-idempotency-key-header defines
// it (an sf-string) and as Stripe's clients send it (a bare token): the two
// forms of one key are one key.
func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ header, key string }{
		{`abc`, "abc"},
		{`"abc"`, "abc"},
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{`"a \"quoted\" key"`, `a "quoted" key`},
		{`"back\\slash"`, `back\slash`},
		{`ab"c`, `ab"c`}, // not quoted: taken as sent
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255)},
	} {
		key, err := idempotency.ParseKey(tc.header)
		require.NoError(t, err, tc.header)
		require.Equal(t, tc.key, key, tc.header)
	}
	for _, bad := range []string{`"`, `""`, `"abc`, `"a"b"`, `"a\b"`, `"tab\there"`, `"clé"`, `"` + strings.Repeat("k", 256) + `"`} {
		_, err := idempotency.ParseKey(bad)
		require.ErrorIs(t, err, idempotency.ErrKeyInvalid, bad)
	}
	_, err := idempotency.ParseKey("")
	require.ErrorIs(t, err, idempotency.ErrKeyMissing)
}
