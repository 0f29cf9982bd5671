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
var errPrivateAddress = errors.New("refusing to connect to a loopback, private or link-local address")

// Check validates a URL a client registers: absolute https (http only with
// AllowPrivate), no user information, a host that resolves, and, unless
// AllowPrivate, only to public unicast addresses. It returns a
// *validation.Error for the field "url".
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
			return bad(fmt.Sprintf("host %q resolves to %s, a loopback, private, link-local or otherwise non-public address", host, a))
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

// nonPublic are the ranges Public refuses beyond what netip classifies:
// "this network", shared address space (carrier-grade NAT), the IETF
// protocol assignments, benchmarking, the reserved block, and the IPv6
// translation, discard and documentation prefixes.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("100::/64"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// Public reports whether a is a public unicast address: not loopback,
// private (RFC 1918, unique local), link-local (the cloud metadata
// service's 169.254.169.254 among them), unspecified, multicast, or one of
// the special-purpose ranges. An IPv4 address in IPv6 form is judged as
// IPv4.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsInterfaceLocalMulticast() || a.IsMulticast() || a.IsUnspecified() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// Client returns the HTTP client deliveries use: each attempt bounded by
// timeout; no proxy from the environment; redirects not followed (a 3xx is
// a failed attempt: following one would reach a URL nobody checked); and,
// unless AllowPrivate, a dialer that refuses a non-public address at
// connect time, whatever the name resolved to when it was registered.
func (p URLPolicy) Client(timeout time.Duration, maxConnsPerHost int) *http.Client {
	dialer := &net.Dialer{Timeout: timeout}
	if !p.AllowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !Public(ap.Addr()) {
				return fmt.Errorf("%w: %s", errPrivateAddress, address)
			}
			return nil
		}
	}
	transport := &http.Transport{
		DialContext:           dialer.DialContext,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   max(2, maxConnsPerHost),
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Timeout:       timeout,
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
