BEGIN;
-- The W3C traceparent of the attempt that produced the response, so a
-- replay's span can link to the span that did the work. It identifies a span,
-- nothing more: no request data.
ALTER TABLE idempotency_keys ADD COLUMN trace_parent text CHECK (length(trace_parent) <= 64);
COMMIT;
