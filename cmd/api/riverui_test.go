package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/testsupport/testdb"
)

// With ADMIN_PASSWORD set, an operator sees the outbox's queues and jobs in
// River UI on the metrics listener, with job arguments hidden by default;
// without the password, or with another, nothing is shown, and a request
// from another site's page cannot act on the jobs even with it.
func TestOperatorsSeeTheQueuesBehindTheAdminPassword(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, 11)
	addr, metricsAddr := freeAddr(t), freeAddr(t)
	const password = "correct-horse-battery-staple"
	getenv := env(map[string]string{
		"ADDR": addr, "METRICS_ADDR": metricsAddr, "DB_MAX_CONNS": "4", "OUTBOX_DB_MAX_CONNS": "2",
		"DATABASE_URL": db.AppURL, "MIGRATE_DATABASE_URL": db.OwnerURL, "MAINTENANCE_DATABASE_URL": db.MaintenanceURL,
		"ADMIN_PASSWORD": password,
		// No workers: the charge job stays in the queue to be seen.
		"OUTBOX_WORKERS": "0", "WEBHOOK_WORKERS": "0",
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- runLogging(ctx, nil, getenv, io.Discard, io.Discard) }()
	waitOK(t, "http://"+addr+"/readyz")

	var out strings.Builder
	require.NoError(t, run(ctx, []string{"keys", "create", "--principal", "acme", "--scopes", "payments:write"}, getenv, &out))
	var key struct{ Secret string }
	require.NoError(t, json.Unmarshal([]byte(out.String()), &key))
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/payments", strings.NewReader(`{"amount": 1500, "currency": "usd"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key.Secret)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	ui := "http://" + metricsAddr + "/riverui"
	get := func(path, user, pass string) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodGet, ui+path, nil)
		require.NoError(t, err)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body), resp.Header
	}
	for _, who := range [][2]string{{"", ""}, {"admin", "wrong-password-wrong-password"}, {"root", password}} {
		status, body, h := get("/api/jobs?state=available", who[0], who[1])
		require.Equal(t, http.StatusUnauthorized, status, "user %q", who[0])
		require.NotContains(t, body, "charge_payment")
		require.Contains(t, h.Get("WWW-Authenticate"), "Basic")
	}

	status, body, _ := get("/", "admin", password)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "<html")
	status, body, _ = get("/api/features", "admin", password)
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, `"job_list_hide_args_by_default":true`)
	// The relay copies the charge job into River's table within moments.
	var list struct {
		Data []struct {
			ID   int64
			Kind string
		}
	}
	require.Eventually(t, func() bool {
		status, body, _ = get("/api/jobs?state=available", "admin", password)
		require.Equal(t, http.StatusOK, status)
		require.NoError(t, json.Unmarshal([]byte(body), &list))
		return len(list.Data) == 1
	}, 10*time.Second, 20*time.Millisecond, "the charge job is listed")
	require.Equal(t, "charge_payment", list.Data[0].Kind)

	// A form on another site's page, sent by a browser that holds the
	// password, is refused before it reaches River UI; River UI's own page
	// can delete the job.
	deleteJob := func(site string) int {
		req, err := http.NewRequest(http.MethodPost, ui+"/api/jobs/delete", strings.NewReader(fmt.Sprintf(`{"ids":["%d"]}`, list.Data[0].ID)))
		require.NoError(t, err)
		req.SetBasicAuth("admin", password)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Sec-Fetch-Site", site)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, deleteJob("cross-site"))
	_, body, _ = get("/api/jobs?state=available", "admin", password)
	require.Contains(t, body, `"kind":"charge_payment"`, "the refused delete deleted nothing")
	require.Equal(t, http.StatusOK, deleteJob("same-origin"))
	_, body, _ = get("/api/jobs?state=available", "admin", password)
	require.NotContains(t, body, `"kind":"charge_payment"`)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(25 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
}
