package auth

import (
	"crypto/sha256"
	"sync"

	"github.com/google/uuid"
)

// KeyPrincipals remembers which principal each API key belongs to, for the
// keys this process has seen authenticated. A request's first round trip
// authenticates the caller and claims its idempotency key together, so the
// claim must name its principal before the answer comes: with the tables
// sharded by principal (docs/scaling.md), that value is what routes the
// claim to its shard. It is never what grants access: the database still
// authenticates every request, and row-level security still takes the
// tenant from that authentication, so a wrong value would find nothing and
// insert nothing. None can be wrong anyway: a key's principal never changes
// (api_keys.principal_id is written once), and only an authentication that
// succeeded is remembered. A key seen for the first time costs its request
// one more round trip (idempotency.Executor).
//
// It holds at most max keys, as their sha256 (never a secret): when full,
// it forgets them all and learns again, one round trip per key.
type KeyPrincipals struct {
	mu  sync.Mutex
	m   map[[sha256.Size]byte]uuid.UUID
	max int
}

// NewKeyPrincipals returns an empty KeyPrincipals that holds at most max keys.
func NewKeyPrincipals(max int) *KeyPrincipals {
	return &KeyPrincipals{m: make(map[[sha256.Size]byte]uuid.UUID), max: max}
}

// Parse is ParseCredentials for credentials that know their key's principal
// when this process authenticated the key before, and remember it once they
// authenticate.
func (k *KeyPrincipals) Parse(header string) (Credentials, error) {
	c, err := ParseCredentials(header)
	if err != nil {
		return Credentials{}, err
	}
	c.known = k
	return c, nil
}

func (k *KeyPrincipals) lookup(hash [sha256.Size]byte) (uuid.UUID, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.m[hash]
	return p, ok
}

func (k *KeyPrincipals) remember(hash [sha256.Size]byte, principal uuid.UUID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.m[hash]; !ok && len(k.m) >= k.max {
		clear(k.m)
	}
	k.m[hash] = principal
}
