package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The strict half of the contract check. kin-openapi, like Prism and
// Schemathesis, lets null through an enum that does not list it when the
// schema is `nullable: true`; OpenAPI 3.0.3 does not (nullable "only takes
// effect if type is explicitly defined", and enum still has the last word),
// and ajv, which generated TypeScript clients validate with, rejects it. So
// every response body is also validated by a JSON Schema 2020-12 validator
// against the spec's schemas translated the way the standard reads them:
// `nullable: true` adds "null" to `type`, and nothing else.

var (
	strictOnce    sync.Once
	strictDefs    map[string]any
	strictErr     error
	strictSchemas sync.Map // the schema's JSON text -> *jsonschema.Schema
)

// strictValidate validates body against ref, a response's schema from the
// spec, read strictly.
func strictValidate(doc *openapi3.T, ref *openapi3.SchemaRef, body []byte) error {
	strictOnce.Do(func() {
		raw, err := json.Marshal(doc.Components.Schemas)
		if err == nil {
			err = json.Unmarshal(raw, &strictDefs)
		}
		strictErr = err
		for name, s := range strictDefs {
			strictDefs[name] = toJSONSchema(s)
		}
	})
	if strictErr != nil {
		return strictErr
	}
	raw, err := json.Marshal(ref)
	if err != nil {
		return err
	}
	schema, err := compiledStrict(string(raw))
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	return schema.Validate(v)
}

func compiledStrict(text string) (*jsonschema.Schema, error) {
	if s, ok := strictSchemas.Load(text); ok {
		return s.(*jsonschema.Schema), nil
	}
	var root map[string]any
	if err := json.Unmarshal([]byte(text), &root); err != nil {
		return nil, err
	}
	root = toJSONSchema(root).(map[string]any)
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	root["$defs"] = strictDefs
	c := jsonschema.NewCompiler()
	if err := c.AddResource("strict.json", root); err != nil {
		return nil, err
	}
	s, err := c.Compile("strict.json")
	if err != nil {
		return nil, fmt.Errorf("compile the strict schema: %w", err)
	}
	strictSchemas.Store(text, s)
	return s, nil
}

// toJSONSchema translates an OpenAPI 3.0 schema (as decoded JSON) into JSON
// Schema 2020-12: references point into $defs, and `nullable: true` becomes
// "null" among the types, leaving enum as it is.
func toJSONSchema(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			switch {
			case k == "$ref":
				out[k] = strings.Replace(x.(string), "#/components/schemas/", "#/$defs/", 1)
			case k == "nullable" || k == "example" || strings.HasPrefix(k, "x-"):
			case k == "properties":
				props := map[string]any{}
				for name, p := range x.(map[string]any) {
					props[name] = toJSONSchema(p)
				}
				out[k] = props
			default:
				out[k] = toJSONSchema(x)
			}
		}
		if v["nullable"] == true {
			if t, ok := out["type"].(string); ok {
				out["type"] = []any{t, "null"}
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = toJSONSchema(x)
		}
		return out
	default:
		return v
	}
}
