package database

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// encodeUUIDsAsBytes makes pgx send a uuid.UUID argument as the 16 bytes it
// is. uuid.UUID implements driver.Valuer, which pgx otherwise goes through:
// the value's 36-character string, parsed back, 19 more allocations per
// argument (measured). Every statement on a tenant table names a principal
// and most an id too (docs/scaling.md), so that was a tenth of a request's
// allocations.
func encodeUUIDsAsBytes(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUID}, m.TryWrapEncodePlanFuncs...)
}

func tryWrapUUID(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := value.(uuid.UUID); ok {
		return &uuidAsBytes{}, [16]byte(u), true
	}
	return nil, nil, false
}

// uuidAsBytes hands the next plan, pgtype's encoding of a [16]byte, the
// uuid.UUID's bytes.
type uuidAsBytes struct{ next pgtype.EncodePlan }

func (p *uuidAsBytes) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *uuidAsBytes) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode([16]byte(value.(uuid.UUID)), buf)
}
