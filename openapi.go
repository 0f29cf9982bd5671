// Package idempotentpayments holds the API's contract, openapi.yaml, at the
// repository root where clients look for it, embedded so that the binary can
// serve it and the tests can check every response against it.
package idempotentpayments

import (
	_ "embed"
	"errors"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// OpenAPI is openapi.yaml, byte for byte.
//
//go:embed openapi.yaml
var OpenAPI []byte

// PublishedWindow is the retry window openapi.yaml promises clients
// (x-idempotency.window-seconds). The service refuses to run with a shorter
// one: a key forgotten early turns a client's retry into a second payment.
func PublishedWindow() (time.Duration, error) {
	var spec struct {
		Idempotency struct {
			WindowSeconds int64 `yaml:"window-seconds"`
		} `yaml:"x-idempotency"`
	}
	if err := yaml.Unmarshal(OpenAPI, &spec); err != nil {
		return 0, fmt.Errorf("read openapi.yaml: %w", err)
	}
	if spec.Idempotency.WindowSeconds <= 0 {
		return 0, errors.New("openapi.yaml: x-idempotency.window-seconds is missing")
	}
	return time.Duration(spec.Idempotency.WindowSeconds) * time.Second, nil
}
