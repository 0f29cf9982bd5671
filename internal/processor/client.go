package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client calls a processor's HTTP API: POST /v1/charges and POST /v1/refunds
// with an Idempotency-Key header, answered with 200 and {"id"}, 402 and
// {"error": reason} for a decline, 400 or 422 for a request it will never
// accept, and anything else (5xx, 409, 429, no answer) for "try again".
// GET /v1/charges/{key} and GET /v1/refunds/{key} read the processor's
// record of a key: the same answers, or 404 when it has none;
// POST /v1/charges/{key}/cancel (and refunds) closes the key first, and
// answers the same way.
// The simulator in this package speaks the same API.
type Client struct {
	base string
	http *http.Client
}

// NewClient returns a client for the processor at baseURL. hc bounds each
// call: give it a Timeout.
func NewClient(baseURL string, hc *http.Client) *Client {
	return &Client{base: strings.TrimRight(baseURL, "/"), http: hc}
}

// Charge implements Processor.
func (c *Client) Charge(ctx context.Context, ch Charge) (Result, error) {
	return c.call(ctx, "/v1/charges", ch.Key, ch)
}

// Refund implements Processor.
func (c *Client) Refund(ctx context.Context, r Refund) (Result, error) {
	return c.call(ctx, "/v1/refunds", r.Key, r)
}

// Lookup implements Processor.
func (c *Client) Lookup(ctx context.Context, r Record) (Result, error) {
	path := "/v1/" + string(r.Op) + "/" + url.PathEscape(r.Key)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return Result{}, fmt.Errorf("processor request: %w", err)
	}
	return c.do(req, path)
}

// Cancel implements Processor.
func (c *Client) Cancel(ctx context.Context, r Record) (Result, error) {
	path := "/v1/" + string(r.Op) + "/" + url.PathEscape(r.Key) + "/cancel"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, nil)
	if err != nil {
		return Result{}, fmt.Errorf("processor request: %w", err)
	}
	return c.do(req, path)
}

func (c *Client) call(ctx context.Context, path, key string, body any) (Result, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return Result{}, fmt.Errorf("encode %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(raw))
	if err != nil {
		return Result{}, fmt.Errorf("processor request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return c.do(req, path)
}

// do sends req and maps the processor's answer.
func (c *Client) do(req *http.Request, path string) (Result, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return Result{}, fmt.Errorf("processor %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return Result{}, fmt.Errorf("processor %s: read reply: %w", path, err)
	}
	var reply struct {
		ID    string `json:"id"`
		Error string `json:"error"`
	}
	_ = json.Unmarshal(b, &reply) // an unreadable body leaves both empty
	switch {
	case resp.StatusCode == http.StatusOK && reply.ID != "":
		return Result{ID: reply.ID}, nil
	case resp.StatusCode == http.StatusPaymentRequired:
		return Result{}, &DeclineError{Reason: reply.Error}
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity:
		return Result{}, &RejectedError{Status: resp.StatusCode, Detail: reply.Error}
	case (req.Method == http.MethodGet || strings.HasSuffix(path, "/cancel")) && resp.StatusCode == http.StatusNotFound && reply.Error == "no_record":
		// Only the processor's own "no record" counts: a 404 from a proxy
		// or a wrong base URL says nothing about the money.
		return Result{}, ErrNoRecord
	}
	return Result{}, fmt.Errorf("processor %s: status %d: %s", path, resp.StatusCode, reply.Error)
}
