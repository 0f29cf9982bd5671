package webhooks

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// RotationOverlap is how long an endpoint's previous secret keeps being
// signed with after a rotation: deliveries carry both signatures meanwhile,
// so a receiver can switch secrets without refusing a delivery.
const RotationOverlap = 24 * time.Hour

// MinKeyBytes is the shortest signing key accepted: HMAC-SHA256's own size.
const MinKeyBytes = 32

// Keyring derives endpoints' signing secrets from the service's signing key
// (WEBHOOK_SIGNING_KEY) and signs deliveries with them.
type Keyring struct{ key []byte }

// NewKeyring returns the keyring of key, at least MinKeyBytes long.
func NewKeyring(key []byte) (Keyring, error) {
	if len(key) < MinKeyBytes {
		return Keyring{}, fmt.Errorf("webhook signing key: %d bytes, want at least %d", len(key), MinKeyBytes)
	}
	return Keyring{key: key}, nil
}

// Secret returns the signing secret of version of an endpoint, in the
// specification's form: "whsec_" and the base64 of 32 bytes. It is an
// HMAC of the endpoint and the version under the service's key: the same
// inputs give the same secret, anything else an unrelated one.
func (k Keyring) Secret(endpoint uuid.UUID, version int) string {
	h := hmac.New(sha256.New, k.key)
	h.Write([]byte("webhook-endpoint-secret\x00" + endpoint.String() + "\x00" + strconv.Itoa(version)))
	return "whsec_" + base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// Sign returns the webhook-signature header of a delivery of body, with id
// msgID, timestamped at, to endpoint e: a "v1," signature by the current
// secret and, while a rotation's overlap lasts, one by the previous, space
// separated. The signatures are made by the specification's own library.
func (k Keyring) Sign(e Endpoint, msgID string, at time.Time, body []byte) (string, error) {
	versions := []int{e.secretVersion}
	if e.PreviousSecretExpiresAt != nil && at.Before(*e.PreviousSecretExpiresAt) && e.secretVersion > 1 {
		versions = append(versions, e.secretVersion-1)
	}
	sigs := make([]string, 0, len(versions))
	for _, v := range versions {
		wh, err := standardwebhooks.NewWebhook(k.Secret(e.ID, v))
		if err != nil {
			return "", fmt.Errorf("sign delivery: %w", err)
		}
		sig, err := wh.Sign(msgID, at, body)
		if err != nil {
			return "", fmt.Errorf("sign delivery: %w", err)
		}
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " "), nil
}
