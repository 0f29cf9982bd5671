package httpapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"

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

func (a *api) listEvents(w http.ResponseWriter, r *http.Request) {
	showPage(a, w, r, events.ListLimit, events.List)
}

func (a *api) getEvent(w http.ResponseWriter, r *http.Request) {
	showOne(a, w, r, events.Get)
}
