package httpapi

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/auth"
	"github.com/payments-reference/idempotent-payments/internal/events"
)

// eventRoutes serves /v1/events.
func (a *api) eventRoutes() chi.Router {
	r := chi.NewRouter()
	r.With(requireScope(auth.ScopeEventsRead)).Get("/", a.listEvents)
	r.With(requireScope(auth.ScopeEventsRead)).Get("/{id}", a.getEvent)
	return r
}

// eventList is the body of GET /v1/events.
type eventList struct {
	Data    []events.Event `json:"data"`
	HasMore bool           `json:"has_more"`
}

func (a *api) listEvents(w http.ResponseWriter, r *http.Request) {
	pg, err := parsePage(r, events.ListLimit)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var list eventList
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		list.Data, list.HasMore, err = events.List(ctx, tx, principal, pg.after, pg.limit)
		return err
	})
	a.respond(w, r, list, err)
}

func (a *api) getEvent(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var e events.Event
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		e, err = events.Get(ctx, tx, principal, id)
		return err
	})
	a.respond(w, r, e, err)
}
