package httpapi

import (
	"context"
	"log/slog"
)

// requestLogHandler adds the request id and the trace id to every record
// logged with a request's context, whoever logs it: the access line, a 500's
// error line, a panic, a readiness warning. An operator given the
// X-Request-Id a client saw (or the request_id in its problem body) finds
// every line of that request, and its trace, with one search.
type requestLogHandler struct{ slog.Handler }

// withRequestIDs wraps h so that records carry request_id and trace_id.
func withRequestIDs(h slog.Handler) slog.Handler { return requestLogHandler{h} }

func (h requestLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := requestIDFrom(ctx); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	if id := traceID(ctx); id != "" {
		r.AddAttrs(slog.String("trace_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestLogHandler{h.Handler.WithAttrs(attrs)}
}

func (h requestLogHandler) WithGroup(name string) slog.Handler {
	return requestLogHandler{h.Handler.WithGroup(name)}
}
