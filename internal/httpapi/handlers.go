package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/internal/idempotency"
	"github.com/payments-reference/idempotent-payments/internal/payments"
	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// This file is what every resource's handlers share: reading a path id and
// a page, a read-only tenant transaction, writing its answer, the GET of one
// resource or of a page of them (showOne, showPage), and the parts of an
// idempotent write that are not the protocol (idempotent.go).

// origin names the request that executes, for the events of what it creates.
func origin(w idempotency.Work) payments.Origin {
	return payments.Origin{RequestID: w.RequestID, IdempotencyKey: w.Key}
}

// page is a list request's window: at most limit items, after the one
// whose id is after (nil: from the first).
type page struct {
	after *uuid.UUID
	limit int
}

// parsePage reads ?limit= (1 to most, default most) and ?starting_after=
// (the id of the last item of the previous page).
func parsePage(r *http.Request, most int) (page, error) {
	pg := page{limit: most}
	var c validation.Collector
	q := r.URL.Query()
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > most {
			c.Add("limit", fmt.Sprintf("must be an integer from 1 to %d", most))
		}
		pg.limit = n
	}
	if v := q.Get("starting_after"); v != "" {
		id, err := uuid.Parse(v)
		if err != nil {
			c.Add("starting_after", validation.NotAListItem)
		}
		pg.after = &id
	}
	return pg, c.Err()
}

// pathID reads the {id} path parameter. Anything that is not a UUID cannot
// name a resource, so it is answered like a missing one.
func pathID(r *http.Request) (uuid.UUID, error) {
	id, err := uuid.Parse(chi.URLParam(r, "id"))
	if err != nil {
		return uuid.UUID{}, errNotFound
	}
	return id, nil
}

// getter reads one resource of principal's by its id; every resource's Get
// has this shape.
type getter[T any] func(ctx context.Context, db database.DBTX, principal, id uuid.UUID) (T, error)

// lister reads a page of principal's resources after the one whose id is
// after, and whether more follow; every top-level List has this shape.
type lister[T any] func(ctx context.Context, db database.DBTX, principal uuid.UUID, after *uuid.UUID, limit int) ([]T, bool, error)

// listBody is the body of a list: a page, and whether more follow.
type listBody[T any] struct {
	Data    []T  `json:"data"`
	HasMore bool `json:"has_more"`
}

// showOne answers GET of the resource the path's {id} names, read with get
// in a read-only tenant transaction: another tenant's id is a 404, as a
// missing one is.
func showOne[T any](a *api, w http.ResponseWriter, r *http.Request, get getter[T]) {
	id, err := pathID(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var v T
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		v, err = get(ctx, tx, principal, id)
		return err
	})
	a.respond(w, r, v, err)
}

// showPage answers GET of a collection: the page that ?limit= (at most
// most) and ?starting_after= ask for, read with list in a read-only tenant
// transaction.
func showPage[T any](a *api, w http.ResponseWriter, r *http.Request, most int, list lister[T]) {
	pg, err := parsePage(r, most)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	var body listBody[T]
	err = a.read(r, func(ctx context.Context, tx pgx.Tx, principal uuid.UUID) (err error) {
		body.Data, body.HasMore, err = list(ctx, tx, principal, pg.after, pg.limit)
		return err
	})
	a.respond(w, r, body, err)
}

// rederive renders again the body of a stored response from the resource
// it showed, read with get, for replays whose body was too large to store.
// The replay keeps the stored status (201 for a creation, 200 for a change).
func rederive[T any](get getter[T]) func(context.Context, pgx.Tx, uuid.UUID, string) ([]byte, error) {
	return func(ctx context.Context, tx pgx.Tx, principal uuid.UUID, ref string) ([]byte, error) {
		id, err := uuid.Parse(ref)
		if err != nil {
			return nil, fmt.Errorf("stored resource reference %q: %w", ref, err)
		}
		v, err := get(ctx, tx, principal, id)
		if err != nil {
			return nil, err
		}
		return renderBody(v)
	}
}

// read runs fn in a read-only transaction that authenticates the caller
// first and then sees only the caller's rows. fn gets the caller's
// principal, to name in its statements (docs/scaling.md).
func (a *api) read(r *http.Request, fn func(context.Context, pgx.Tx, uuid.UUID) error) error {
	creds, scope, err := caller(r)
	if err != nil {
		return err
	}
	return database.InTx(r.Context(), a.pool, database.TxOptions{ReadOnly: true}, func(tx pgx.Tx) error {
		p, err := creds.Authenticate(r.Context(), tx, scope)
		if err != nil {
			return err
		}
		return fn(r.Context(), tx, p.ID)
	})
}

// respond writes v as a 200 JSON body, or the problem err maps to.
func (a *api) respond(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	resp, err := renderJSON(http.StatusOK, v)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeResponse(w, resp)
}

// storedProblem is a business rejection that happened after execution began:
// an outcome of the request, stored as failed and replayed byte for byte.
func storedProblem(r *http.Request, t problemType, detail string) idempotency.Outcome {
	return idempotency.Outcome{
		Response: idempotency.Response{Status: t.status, ContentType: ContentTypeProblem, Body: newProblem(t, detail).render(r)},
		Failed:   true,
	}
}
