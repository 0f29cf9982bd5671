// Package webhooks pushes events (package events) to the endpoints a client
// registers, after the Standard Webhooks specification (standardwebhooks.com):
// at least once, signed, retried on a published schedule.
//
// The delivery rides the outbox: the transaction that records an event also
// inserts one delivery job per enabled endpoint (Fanout), so an event is
// delivered if and only if its change committed, and a crash only delays
// it. A job is repeated until the receiver answers 2xx (done), 410 (the
// endpoint is disabled), or the schedule ends; every attempt is recorded
// (webhook_deliveries) and listable. Because a delivery can be repeated
// (a lost 2xx, a crash after the POST), the receiver must apply each event
// once, by its webhook-id: the same pattern this service applies to its own
// requests, on the other side (docs/webhooks.md, client.WebhookHandler).
//
// An endpoint's signing secret is stored nowhere: Keyring derives it from
// the service's WEBHOOK_SIGNING_KEY, the endpoint's id and its secret
// version, so no database role can read it back, and an idempotent replay
// of the request that showed it re-derives it (idempotency.Outcome.Secret).
//
// URLs are checked against server-side request forgery twice (URLPolicy):
// when registered (the scheme, and every address the host resolves to), and
// when each delivery connects (the address actually dialled), so a name that
// resolves to a public address at registration and to a private one later
// is refused too.
package webhooks
