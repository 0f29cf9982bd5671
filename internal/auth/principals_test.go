package auth

import (
	"crypto/sha256"
	"testing"

	"github.com/google/uuid"
)

// KeyPrincipals holds at most its bound: when full, it forgets every key
// and learns again, and a key it does not hold is unknown, never guessed.
func TestKeyPrincipalsStaysBounded(t *testing.T) {
	t.Parallel()
	k := NewKeyPrincipals(2)
	keys := [][sha256.Size]byte{sha256.Sum256([]byte("a")), sha256.Sum256([]byte("b")), sha256.Sum256([]byte("c"))}
	principals := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	k.remember(keys[0], principals[0])
	k.remember(keys[1], principals[1])
	k.remember(keys[1], principals[1]) // known already: nothing forgotten
	if p, ok := k.lookup(keys[0]); !ok || p != principals[0] {
		t.Fatalf("lookup a = %v, %v; want %v", p, ok, principals[0])
	}
	k.remember(keys[2], principals[2]) // full: forget, then learn c
	if _, ok := k.lookup(keys[0]); ok {
		t.Fatal("a is still known past the bound")
	}
	if p, ok := k.lookup(keys[2]); !ok || p != principals[2] {
		t.Fatalf("lookup c = %v, %v; want %v", p, ok, principals[2])
	}
	if len(k.m) > 2 {
		t.Fatalf("%d keys held, bound 2", len(k.m))
	}
	c, err := k.Parse("Bearer sk_unseen")
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := c.Principal(); ok {
		t.Fatalf("an unseen key's principal is %v, want unknown", p)
	}
}
