// Package keyset reads one page of a list that is paged by a cursor (the
// last item's id) rather than by an offset: the list packages' queries ask
// for one row more than the page, in their final order (xid, id), and Page
// turns the answer into the page and whether there are more.
package keyset

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/payments-reference/idempotent-payments/internal/validation"
)

// Page reads rows, the answer to a query with LIMIT limit+1, as a page of at
// most limit items and whether more follow. When a page after the cursor
// after comes back empty, exists says whether after is an item of the list:
// an unknown cursor is refused (starting_after, validation.NotAListItem)
// rather than answered with an empty page that reads as the end of the list.
func Page[T any](rows pgx.Rows, limit int, scan func(pgx.Row) (T, error), after *uuid.UUID, exists func(uuid.UUID) (bool, error)) ([]T, bool, error) {
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (T, error) { return scan(row) })
	if err != nil {
		return nil, false, err
	}
	if len(list) == 0 && after != nil {
		ok, err := exists(*after)
		if err != nil {
			return nil, false, err
		}
		if !ok {
			return nil, false, validation.Invalid("starting_after", validation.NotAListItem)
		}
	}
	if len(list) > limit {
		return list[:limit], true, nil
	}
	return list, false, nil
}
