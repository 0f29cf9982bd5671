//go:build !benchmark

package httpapi

import "github.com/go-chi/chi/v5"

// BenchmarkBypassAvailable reports whether this build can mount the
// benchmark bypass: only a binary built with -tags benchmark can (the load
// test builds one). A production build has no code that pays without a key.
const BenchmarkBypassAvailable = false

func (a *api) mountBenchmarkBypass(chi.Router) {
	panic("httpapi: Deps.BenchmarkBypass needs a binary built with -tags benchmark")
}

func (a *api) mountRedisPeer(chi.Router, string) {
	panic("httpapi: Deps.BenchmarkRedisPeer needs a binary built with -tags benchmark")
}
