package webhooks

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"
)

func testKeyring(t *testing.T) Keyring {
	t.Helper()
	k, err := NewKeyring([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	return k
}

// headers are what a delivery sends.
func headers(id string, at time.Time, sig string) http.Header {
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	h.Set("webhook-signature", sig)
	return h
}

// A delivery's signature verifies with the specification's own verifier,
// and fails when a byte of the body, the id or the timestamp changes; an
// old timestamp is refused even when the signature matches.
func TestSignatureVerifiesWithTheLibraryAndOnlyForWhatWasSigned(t *testing.T) {
	t.Parallel()
	k := testKeyring(t)
	e := Endpoint{ID: uuid.New(), secretVersion: 1}
	wh, err := standardwebhooks.NewWebhook(k.Secret(e.ID, 1))
	require.NoError(t, err)
	id, at, body := uuid.NewString(), time.Now(), []byte(`{"id":"x","type":"payment.succeeded"}`)
	sig, err := k.Sign(e, id, at, body)
	require.NoError(t, err)
	require.NoError(t, wh.Verify(body, headers(id, at, sig)))

	tampered := append([]byte(nil), body...)
	tampered[2] ^= 1
	require.ErrorIs(t, wh.Verify(tampered, headers(id, at, sig)), standardwebhooks.ErrNoMatchingSignature, "a byte of the body")
	require.ErrorIs(t, wh.Verify(body, headers(uuid.NewString(), at, sig)), standardwebhooks.ErrNoMatchingSignature, "the id")
	require.ErrorIs(t, wh.Verify(body, headers(id, at.Add(time.Second), sig)), standardwebhooks.ErrNoMatchingSignature, "the timestamp")

	old := at.Add(-6 * time.Minute)
	oldSig, err := k.Sign(e, id, old, body)
	require.NoError(t, err)
	require.ErrorIs(t, wh.Verify(body, headers(id, old, oldSig)), standardwebhooks.ErrMessageTooOld)
	require.NoError(t, wh.VerifyIgnoringTimestamp(body, headers(id, old, oldSig)), "only its age is wrong")
}

// Each endpoint and version has its own secret, the same every time it is
// derived; during a rotation's overlap both versions sign, after it one.
func TestSecretsAndRotation(t *testing.T) {
	t.Parallel()
	k := testKeyring(t)
	a, b := uuid.New(), uuid.New()
	require.Equal(t, k.Secret(a, 1), k.Secret(a, 1))
	require.NotEqual(t, k.Secret(a, 1), k.Secret(a, 2))
	require.NotEqual(t, k.Secret(a, 1), k.Secret(b, 1))
	other, err := NewKeyring([]byte("another key of thirty-two bytes!"))
	require.NoError(t, err)
	require.NotEqual(t, k.Secret(a, 1), other.Secret(a, 1), "the service's key is part of every secret")

	now := time.Now()
	until := now.Add(RotationOverlap)
	e := Endpoint{ID: a, secretVersion: 2, PreviousSecretExpiresAt: &until}
	sig, err := k.Sign(e, "msg", now, []byte("{}"))
	require.NoError(t, err)
	for v := 1; v <= 2; v++ {
		wh, err := standardwebhooks.NewWebhook(k.Secret(a, v))
		require.NoError(t, err)
		require.NoError(t, wh.Verify([]byte("{}"), headers("msg", now, sig)), "version %d", v)
	}
	late := until.Add(time.Second)
	sig, err = k.Sign(e, "msg", late, []byte("{}"))
	require.NoError(t, err)
	require.Len(t, strings.Fields(sig), 1, "after the overlap only the new secret signs")

	_, err = NewKeyring([]byte("short"))
	require.Error(t, err)
}

// The address policy refuses every form that reaches a non-public address,
// including those that embed an IPv4 address in IPv6 (which a hand-written
// list once let through: IPv4-compatible, SIIT, 6to4, NAT64's local prefix,
// Teredo) and the deprecated site-local range.
func TestPublic(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"93.184.215.14": true, "2606:2800:220:1:248:1893:25c8:1946": true, "8.8.8.8": true,
		"127.0.0.1": false, "::1": false, "::ffff:127.0.0.1": false, "10.0.0.1": false, "172.31.255.255": false,
		"192.168.0.1": false, "169.254.169.254": false, "fe80::1": false, "fd00::1": false, "0.0.0.0": false,
		"::": false, "100.64.0.1": false, "224.0.0.1": false, "ff02::1": false, "192.0.2.1": false, "240.0.0.1": false,
		"64:ff9b::7f00:1":                      false,
		"::127.0.0.1":                          false, // IPv4-compatible
		"::ffff:0:7f00:1":                      false, // SIIT
		"2002:7f00:1::":                        false, // 6to4 of 127.0.0.1
		"fec0::1":                              false, // site-local
		"64:ff9b:1::a00:1":                     false, // NAT64, local-use prefix
		"2001::1":                              false, // Teredo
		"2001:0:4136:e378:8000:63bf:3fff:fdd2": false, // Teredo, RFC 4380's example
		"2001:db8::1":                          false, // documentation
		"198.18.0.1":                           false, // benchmarking
	} {
		require.Equal(t, want, Public(netip.MustParseAddr(addr)), addr)
	}
}

// A receiver that answers with more headers than MaxResponseHeaderBytes
// fails the attempt instead of filling the process's memory.
func TestClientBoundsResponseHeaders(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for i := range 64 {
			w.Header().Set("X-Filler-"+strconv.Itoa(i), strings.Repeat("x", 1000))
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	_, err := URLPolicy{AllowPrivate: true}.Client(5*time.Second, 1).Post(srv.URL, "application/json", nil)
	require.ErrorContains(t, err, "header")
}

// A URL that passed its check can point elsewhere later (its name now
// resolves to loopback: DNS rebinding). The delivery client refuses the
// connection itself, whatever the name resolved to.
func TestClientRefusesNonPublicAddressesAtConnect(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	t.Cleanup(srv.Close)

	_, err := URLPolicy{}.Client(time.Second, 1).Post(srv.URL, "application/json", nil)
	require.ErrorIs(t, err, errPrivateAddress)

	resp, err := URLPolicy{AllowPrivate: true}.Client(time.Second, 1).Post(srv.URL, "application/json", nil)
	require.NoError(t, err, "development allows it")
	require.NoError(t, resp.Body.Close())
}

// The delivery client follows no redirect: a 3xx is the attempt's answer,
// not a way to a URL nobody checked.
func TestClientFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	var reached bool
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }))
	t.Cleanup(target.Close)
	srv := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusTemporaryRedirect))
	t.Cleanup(srv.Close)
	resp, err := URLPolicy{AllowPrivate: true}.Client(time.Second, 1).Post(srv.URL, "application/json", nil)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
	require.False(t, reached)
}

func TestCheckNeedsNoNetworkForAddresses(t *testing.T) {
	t.Parallel()
	p := URLPolicy{Resolve: func(context.Context, string) ([]netip.Addr, error) { return nil, errors.New("no lookups here") }}
	require.NoError(t, p.Check(context.Background(), "https://93.184.215.14/hook"))
	require.Error(t, p.Check(context.Background(), "https://[::1]:8443/hook"))
}
