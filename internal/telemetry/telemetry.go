// Package telemetry builds the OpenTelemetry providers the service uses:
// traces exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT (or its traces
// variant) is set, and metrics exposed for Prometheus on a handler of their
// own. Providers are passed to the packages that use them; nothing here is a
// package-level global.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
)

// Telemetry holds the providers and what must be shut down with them.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// Propagator reads and writes W3C traceparent and baggage headers.
	Propagator propagation.TextMapPropagator
	// MetricsHandler serves /metrics in the Prometheus text format.
	MetricsHandler http.Handler
	shutdown       []func(context.Context) error
}

// Setup builds the providers. getenv is os.Getenv in production; the OTLP
// exporter itself also reads the standard OTEL_EXPORTER_OTLP_* variables,
// and the SDK reads OTEL_TRACES_SAMPLER and OTEL_RESOURCE_ATTRIBUTES.
func Setup(ctx context.Context, serviceName string, getenv func(string) string) (*Telemetry, error) {
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override the default name.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("telemetry resource: %w", err)
	}
	t := &Telemetry{Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}

	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter: %w", err)
		}
		topts = append(topts, sdktrace.WithBatcher(exp))
	} else {
		// With nowhere to send them, spans are not recorded: recording every
		// span cost about 17% of throughput on a 2-core machine
		// (docs/performance.md). Unrecorded spans still get ids, so logs keep
		// their trace_id and stored keys their traceparent.
		topts = append(topts, sdktrace.WithSampler(sdktrace.NeverSample()))
	}
	tp := sdktrace.NewTracerProvider(topts...)
	t.TracerProvider = tp
	t.shutdown = append(t.shutdown, tp.Shutdown)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res), sdkmetric.WithReader(exp))
	t.MeterProvider = mp
	t.shutdown = append(t.shutdown, mp.Shutdown)
	t.MetricsHandler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	return t, nil
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}
