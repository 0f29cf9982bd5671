// Package validation is the shared shape of "this request is invalid": a list
// of fields and what is wrong with each. Domain packages return *Error; the
// HTTP layer renders it as a 400 problem with an errors member.
package validation

import "strings"

// FieldError is one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error lists every invalid field of a request.
type Error struct {
	Fields []FieldError
}

func (e *Error) Error() string {
	msgs := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		msgs[i] = f.Field + ": " + f.Message
	}
	return "invalid request: " + strings.Join(msgs, "; ")
}

// NotAListItem is the message for a list cursor (starting_after) that does
// not name an item of the list.
const NotAListItem = "must be the id of an item of the list"

// Invalid is the error of one invalid field.
func Invalid(field, message string) error {
	return &Error{Fields: []FieldError{{field, message}}}
}

// Collector gathers field errors so a client learns about all of them at once.
type Collector struct{ fields []FieldError }

// Add records that field is invalid.
func (c *Collector) Add(field, message string) {
	c.fields = append(c.fields, FieldError{field, message})
}

// Err returns an *Error when anything was added, and nil otherwise.
func (c *Collector) Err() error {
	if len(c.fields) == 0 {
		return nil
	}
	return &Error{Fields: c.fields}
}
