package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/validation"
	"github.com/payments-reference/idempotent-payments/internal/webhooks"
)

// webhookRoutes serves /v1/webhook_endpoints. Every change is an idempotent
// request, like a payment: a client that lost the answer to a creation
// retries with the same key and gets the same endpoint, not a second one.
func (a *api) webhookRoutes() chi.Router {
	r := chi.NewRouter()
	r.Use(requireScope(auth.ScopeWebhooksWrite))
	r.Post("/", a.createEndpoint)
	r.Get("/", a.listEndpoints)
	r.Get("/{id}", a.getEndpoint)
	r.Delete("/{id}", a.deleteEndpoint)
	r.Patch("/{id}", a.updateEndpoint)
	r.Post("/{id}/rotate_secret", a.rotateSecret)
	r.Post("/{id}/resend", a.resendEvent)
	r.Post("/{id}/recover", a.recoverEvents)
	r.Get("/{id}/deliveries", a.listDeliveries)
	return r
}

// noBody is the body of a request that takes none (a rotation, a
// deletion): empty, or {}.
type noBody struct{}

func (noBody) Validate() error { return nil }

func (a *api) createEndpoint(w http.ResponseWriter, r *http.Request) {
	var in webhooks.NewEndpoint
	req, err := a.parseIdempotent(w, r, &in)
	if err == nil {
		// The caller is authenticated before the URL's host is looked up:
		// a lookup is work that an anonymous request could otherwise make
		// the service do for a name of its choosing (one that never
		// answers holds the request for the lookup's 5 s). It costs a
		// creation one more round trip. The host's addresses are checked
		// before the claim, like every other validation: a refused URL
		// consumes no key.
		err = a.read(r, func(context.Context, pgx.Tx, uuid.UUID) error { return nil })
		if err == nil {
			err = a.urls.Check(r.Context(), in.URL)
		}
	}
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			e, err := webhooks.Create(ctx, w.Tx, a.keyring, w.Principal, in, w.Now)
			if errors.Is(err, webhooks.ErrTooManyEndpoints) {
				return storedProblem(r, ptTooManyEndpoints, fmt.Sprintf("This account has %d webhook endpoints, the most it may have. Delete one first.", webhooks.MaxEndpoints)), nil
			}
			if err != nil {
				return idempotency.Outcome{}, err
			}
			return a.secretOutcome(http.StatusCreated, e)
		},
		Rederive: a.rederiveSecret,
	})
}

func (a *api) rotateSecret(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	req, err := a.parseIdempotent(w, r, &noBody{})
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			e, err := webhooks.RotateSecret(ctx, w.Tx, a.keyring, w.Principal, id)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			return a.secretOutcome(http.StatusOK, e)
		},
		Rederive:    a.rederiveSecret,
		Reauthorize: endpointVisible(id),
	})
}

// secretOutcome renders an endpoint showing its secret. The idempotency
// store keeps only which secret it was (Outcome.Secret), never the secret.
func (a *api) secretOutcome(status int, e webhooks.Endpoint) (idempotency.Outcome, error) {
	resp, err := renderJSON(status, e)
	return idempotency.Outcome{Response: resp, ResourceRef: e.SecretRef(), Secret: true}, err
}

// rederiveSecret renders, for a replay, the endpoint as it is now with the
// secret the original response showed (webhooks.Endpoint.SecretRef).
func (a *api) rederiveSecret(ctx context.Context, tx pgx.Tx, principal uuid.UUID, ref string) ([]byte, error) {
	id, version, err := webhooks.ParseSecretRef(ref)
	if err != nil {
		return nil, err
	}
	e, err := webhooks.Get(ctx, tx, principal, id)
	if err != nil {
		return nil, err
	}
	return renderBody(e.WithSecret(a.keyring, version))
}

// endpointVisible lets a replay through only while the endpoint is still
// the caller's (row-level security hides it otherwise).
func endpointVisible(id uuid.UUID) func(context.Context, pgx.Tx, uuid.UUID) error {
	return func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) error {
		_, err := webhooks.Get(ctx, tx, principal, id)
		return err
	}
}

func (a *api) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	req, err := a.parseIdempotent(w, r, &noBody{})
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			e, err := webhooks.Delete(ctx, w.Tx, w.Principal, id)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusOK, e)
			return idempotency.Outcome{Response: resp, ResourceRef: e.ID.String()}, err
		},
		Rederive:    rederive(webhooks.Get),
		Reauthorize: endpointVisible(id),
	})
}

func (a *api) listEndpoints(w http.ResponseWriter, r *http.Request) {
	// Every endpoint (there are at most webhooks.MaxEndpoints), so has_more
	// is always false.
	var list listBody[webhooks.Endpoint]
	err := a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		list.Data, err = webhooks.List(ctx, tx, principal)
		return err
	})
	a.respond(w, r, list, err)
}

func (a *api) getEndpoint(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var e webhooks.Endpoint
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		e, err = webhooks.Get(ctx, tx, principal, id)
		if err == nil && e.Status == webhooks.StatusDeleted {
			err = webhooks.ErrNotFound
		}
		return err
	})
	a.respond(w, r, e, err)
}

func (a *api) listDeliveries(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	pg, err := parsePage(r, webhooks.DeliveriesLimit)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var list listBody[webhooks.Delivery]
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		list.Data, list.HasMore, err = webhooks.ListDeliveries(ctx, tx, principal, id, pg.after, pg.limit)
		return err
	})
	a.respond(w, r, list, err)
}

// updateEndpoint enables or disables an endpoint, or changes the events it
// takes.
func (a *api) updateEndpoint(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var in webhooks.EndpointUpdate
	req, err := a.parseIdempotent(w, r, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			e, err := webhooks.Update(ctx, w.Tx, w.Principal, id, in)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			resp, err := renderJSON(http.StatusOK, e)
			return idempotency.Outcome{Response: resp, ResourceRef: e.ID.String()}, err
		},
		Rederive:    rederive(webhooks.Get),
		Reauthorize: endpointVisible(id),
	})
}

// redelivery is the body of a resend's or a recover's answer: how many
// deliveries were queued. Each is listed, once attempted, under the
// endpoint's deliveries.
type redelivery struct {
	EndpointID uuid.UUID `json:"endpoint_id"`
	Queued     int64     `json:"queued"`
}

func (r redelivery) outcome() (idempotency.Outcome, error) {
	resp, err := renderJSON(http.StatusAccepted, r)
	return idempotency.Outcome{Response: resp}, err
}

// resendRequest names the event to deliver again.
type resendRequest struct {
	EventID uuid.UUID `json:"event_id"`
}

func (r resendRequest) Validate() error {
	var c validation.Collector
	if r.EventID == uuid.Nil {
		c.Add("event_id", "is required")
	}
	return c.Err()
}

// resendEvent delivers one event to an endpoint again.
func (a *api) resendEvent(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var in resendRequest
	req, err := a.parseIdempotent(w, r, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			if err := a.webhooks.Redeliver(ctx, w.Tx, w.Principal, id, in.EventID); err != nil {
				return idempotency.Outcome{}, err
			}
			return redelivery{EndpointID: id, Queued: 1}.outcome()
		},
		Reauthorize: endpointVisible(id),
	})
}

// recoverRequest is the window of events to deliver again: since, until
// (now when absent).
type recoverRequest struct {
	Since *time.Time `json:"since"`
	Until *time.Time `json:"until"`
}

func (r recoverRequest) Validate() error {
	var c validation.Collector
	if r.Since == nil {
		c.Add("since", "is required")
	}
	if r.Since != nil && r.Until != nil && !r.Until.After(*r.Since) {
		c.Add("until", "must be after since")
	}
	return c.Err()
}

// recoverEvents delivers again every event of a window that the endpoint
// takes: what a receiver that was down missed.
func (a *api) recoverEvents(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var in recoverRequest
	req, err := a.parseIdempotent(w, r, &in)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	a.runIdempotent(w, r, req, idempotency.Operation{
		Execute: func(ctx context.Context, w idempotency.Work) (idempotency.Outcome, error) {
			until := w.Now
			if in.Until != nil {
				until = *in.Until
			}
			n, err := a.webhooks.Recover(ctx, w.Tx, w.Principal, id, *in.Since, until)
			if err != nil {
				return idempotency.Outcome{}, err
			}
			return redelivery{EndpointID: id, Queued: n}.outcome()
		},
		Reauthorize: endpointVisible(id),
	})
}
