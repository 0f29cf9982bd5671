// Package idempotentpayments holds the API's contract, openapi.yaml, at the
// repository root where clients look for it, embedded so that the binary can
// serve it and the tests can check every response against it.
package idempotentpayments

import _ "embed"

// OpenAPI is openapi.yaml, byte for byte.
//
//go:embed openapi.yaml
var OpenAPI []byte
