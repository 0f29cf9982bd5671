package httpapi

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/httprate"

	"github.com/payments-reference/idempotent-payments/internal/auth"
)

// errRateLimited is a request over its caller's rate limit.
var errRateLimited = errors.New("rate limit exceeded")

// RateLimits bound how many requests a caller may make a second, in this
// process (an in-memory counter per key: N instances admit up to N times
// as many; docs/observability.md says how to share one). Zero turns a
// limit off.
type RateLimits struct {
	// PerPrincipal bounds the requests of a principal whose key this
	// process has authenticated before (auth.KeyPrincipals), all its keys
	// together: reads and writes, replays included.
	PerPrincipal int
	// PerClient bounds, per client address (an IPv6 client's /64), every
	// other request under /v1: no key, a malformed one, or a key not yet
	// known here. Each well-formed key costs a database round trip to
	// check, so an unknown caller may not make the service do that at will.
	PerClient int
}

// limiter applies RateLimits: one httprate window counter per kind of key.
type limiter struct {
	principal, client *httprate.RateLimiter
	limits            RateLimits
}

// rateWindow is the window the limits count in.
const rateWindow = time.Second

func newLimiter(l RateLimits) *limiter {
	// httprate sets only Retry-After (the window); the draft IETF
	// RateLimit headers are written below, from its counter.
	headers := httprate.WithResponseHeaders(httprate.ResponseHeaders{RetryAfter: "Retry-After"})
	lim := &limiter{limits: l}
	if l.PerPrincipal > 0 {
		lim.principal = httprate.NewRateLimiter(l.PerPrincipal, rateWindow, headers)
	}
	if l.PerClient > 0 {
		lim.client = httprate.NewRateLimiter(l.PerClient, rateWindow, headers)
	}
	return lim
}

// allow counts r against its caller's limit, and reports whether it may go
// on. creds are the request's credentials when they parsed. It writes the
// draft RateLimit-Policy and RateLimit headers (draft-ietf-httpapi-
// ratelimit-headers) on every limited response, and Retry-After on a 429.
func (l *limiter) allow(w http.ResponseWriter, r *http.Request, creds auth.Credentials, parsed bool) bool {
	rl, policy, quota, key := l.client, "client", l.limits.PerClient, "client:"+clientAddr(r)
	if parsed {
		if p, known := creds.Principal(); known {
			rl, policy, quota, key = l.principal, "principal", l.limits.PerPrincipal, "principal:"+p.String()
		}
	}
	if rl == nil {
		return true
	}
	over := rl.OnLimit(w, r, key)
	remaining := 0
	if _, rate, err := rl.Status(key); err == nil {
		remaining = max(0, quota-int(math.Round(rate)))
	}
	secs := strconv.Itoa(int(rateWindow.Seconds()))
	w.Header().Set("RateLimit-Policy", fmt.Sprintf(`"%s";q=%d;w=%s`, policy, quota, secs))
	w.Header().Set("RateLimit", fmt.Sprintf(`"%s";r=%d;t=%s`, policy, remaining, secs))
	return !over
}

// clientAddr is the request's client address as a rate-limit key: the
// connection's peer, with an IPv6 client's /64 (what one host commonly
// holds). Behind a proxy every client shares the proxy's address: a fork
// there resolves the client from a header its proxy sets (chi's
// middleware.ClientIPFrom*), and never from one a client can set itself.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return httprate.CanonicalizeIP(host)
}
