package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"code.dny.dev/ssrf"

	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// MaxURLLength bounds an endpoint's URL.
const MaxURLLength = 2048

// URLPolicy decides where the service may send webhooks. A webhook URL is
// chosen by the client, and the service POSTs to it from inside its own
// network: without these rules it could be pointed at the cloud's metadata
// service (169.254.169.254), the database, or an admin port on loopback
// (server-side request forgery).
type URLPolicy struct {
	// AllowPrivate, for development only (WEBHOOK_ALLOW_PRIVATE_URLS),
	// allows http and loopback, private and link-local addresses: a
	// receiver on the developer's own machine.
	AllowPrivate bool
	// Resolve looks a host name up; nil means the system's resolver. A
	// test replaces it to make a name resolve where it likes.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// errPrivateAddress is what the dialer refuses: the check at connect time.
// It names no address: the error is recorded where the tenant reads it.
var errPrivateAddress = errors.New("refusing to connect to a non-public address")

// guard is the address policy, from a maintained library rather than a list
// of our own: code.dny.dev/ssrf denies every IPv4 prefix of IANA's
// special-purpose address registry and every IPv6 address outside global
// unicast (2000::/3) or in that registry's prefixes within it, so the forms
// that embed an IPv4 address in IPv6 (mapped, compatible, SIIT, NAT64, 6to4,
// Teredo) and the deprecated site-local range are refused with the rest.
// Any port: receivers listen where they like.
var guard = ssrf.New(ssrf.WithAnyPort())

// Check validates a URL a client registers: absolute https (http only with
// AllowPrivate), no user information, a host that resolves, and, unless
// AllowPrivate, only to public unicast addresses. It returns a
// *validation.Error for the field "url". Resolving the host is a DNS lookup
// that an attacker's name can make slow: call it only for an authenticated
// caller.
func (p URLPolicy) Check(ctx context.Context, raw string) error {
	bad := func(msg string) error { return validation.Invalid("url", msg) }
	if raw == "" {
		return bad("is required")
	}
	if len(raw) > MaxURLLength {
		return bad(fmt.Sprintf("must be at most %d characters", MaxURLLength))
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return bad("must be an absolute URL, like https://example.com/webhooks")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.AllowPrivate:
	default:
		return bad("must use https")
	}
	if u.User != nil {
		return bad("must not contain user information")
	}
	if u.Fragment != "" {
		return bad("must not contain a fragment")
	}
	if p.AllowPrivate {
		return nil
	}
	host := u.Hostname()
	addrs, err := p.resolve(ctx, host)
	if err != nil || len(addrs) == 0 {
		return bad(fmt.Sprintf("host %q does not resolve", host))
	}
	for _, a := range addrs {
		if !Public(a) {
			// Which address it resolved to stays unsaid: it would map the
			// service's own network for whoever owns the name.
			return bad(fmt.Sprintf("host %q is not allowed: webhooks are sent only to public addresses", host))
		}
	}
	return nil
}

func (p URLPolicy) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if p.Resolve != nil {
		return p.Resolve(ctx, host)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// Public reports whether the service may send webhooks to a: a public
// unicast address, by guard's policy.
func Public(a netip.Addr) bool { return guard.SafeAddr(a) == nil }

// MaxResponseHeaderBytes bounds a receiver's response headers: with Go's
// default (10 MB) for every worker, receivers answering with huge headers
// could fill the process's memory. A longer answer fails the attempt.
const MaxResponseHeaderBytes = 32 << 10

// Client returns the HTTP client deliveries use: each attempt bounded by
// timeout; no proxy from the environment; redirects not followed (a 3xx is
// a failed attempt: following one would reach a URL nobody checked); and,
// unless AllowPrivate, a dialer that refuses a non-public address at
// connect time, whatever the name resolved to when it was registered.
func (p URLPolicy) Client(timeout time.Duration, maxConnsPerHost int) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !p.AllowPrivate {
		dialer.Control = func(network, address string, c syscall.RawConn) error {
			if guard.Safe(network, address, c) != nil {
				return errPrivateAddress
			}
			return nil
		}
	}
	transport := &http.Transport{
		DialContext:            dialer.DialContext,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: MaxResponseHeaderBytes,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    max(2, maxConnsPerHost),
		IdleConnTimeout:        90 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	return &http.Client{
		Timeout:       timeout,
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
