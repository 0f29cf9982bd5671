package payments

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	idempotentpayments "github.com/payments-reference/idempotent-payments"
)

// openapi.yaml's currency enum is the server's list, in lower and upper
// case: a code the server takes is in the contract and the reverse.
func TestSpecListsTheServersCurrencies(t *testing.T) {
	t.Parallel()
	var spec struct {
		Components struct {
			Schemas struct {
				NewPayment struct {
					Properties struct {
						Currency struct {
							Enum []string `yaml:"enum"`
						} `yaml:"currency"`
					} `yaml:"properties"`
				} `yaml:"NewPayment"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	require.NoError(t, yaml.Unmarshal(idempotentpayments.OpenAPI, &spec))
	var want []string
	for c := range currencies {
		want = append(want, c, strings.ToUpper(c))
	}
	got := spec.Components.Schemas.NewPayment.Properties.Currency.Enum
	slices.Sort(want)
	slices.Sort(got)
	require.Equal(t, want, got)
	for _, c := range got {
		require.True(t, IsCurrency(c), c)
	}
	require.False(t, IsCurrency("Usd"), "mixed case is not in the enum")
	require.False(t, IsCurrency("xau"))
}
