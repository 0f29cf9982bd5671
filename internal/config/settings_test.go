package config_test

import (
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/payments-reference/idempotent-payments/internal/config"
)

// Settings, which `api --help` prints, names every variable Load reads.
func TestSettingsCoverEverythingLoadReads(t *testing.T) {
	t.Parallel()
	var read []string
	_, err := config.Load(func(name string) string {
		read = append(read, name)
		return ""
	})
	require.NoError(t, err)
	var listed []string
	for _, s := range config.Settings() {
		listed = append(listed, s.Name)
	}
	slices.Sort(read)
	read = slices.Compact(read)
	slices.Sort(listed)
	require.Equal(t, read, listed)
}

// README.md's configuration table has one row per setting, with the
// default that the code has, and no row for a setting that does not exist.
func TestREADMEListsEverySetting(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(raw), "## Configuration")
	require.True(t, ok)
	table, _, _ = strings.Cut(table, "\n## ")
	rows := map[string]string{} // name -> default cell
	row := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| ([^|]*) \\|")
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		rows[m[1]] = m[2]
	}
	for _, s := range config.Settings() {
		cell, ok := rows[s.Name]
		require.True(t, ok, "README's configuration table has no row for %s", s.Name)
		if s.Default == "" {
			require.Contains(t, []string{"empty", "unset"}, strings.TrimSpace(cell), s.Name)
		} else {
			require.Contains(t, cell, "`"+s.Default+"`", "README's default for %s", s.Name)
		}
		delete(rows, s.Name)
	}
	delete(rows, "OTEL_EXPORTER_OTLP_ENDPOINT") // read by OpenTelemetry's SDK, not by Load
	require.Empty(t, rows, "README lists settings the code does not have")
}

// Every field of Config is a setting declared whole (a variable, a line of
// help, bounds where it has any), or a struct of such settings: a field
// without its tags would be read by nothing and shown nowhere.
func TestEverySettingIsDeclaredWhole(t *testing.T) {
	t.Parallel()
	var walk func(typ reflect.Type)
	walk = func(typ reflect.Type) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, ok := f.Tag.Lookup("env")
			if !ok {
				require.Equal(t, reflect.Struct, f.Type.Kind(), "%s has no env tag", f.Name)
				walk(f.Type)
				continue
			}
			require.Regexp(t, `^[A-Z][A-Z0-9_]+$`, name, f.Name)
			require.NotEmpty(t, f.Tag.Get("help"), "%s: a line of help", name)
			_, hasDefault := f.Tag.Lookup("default")
			require.True(t, hasDefault, "%s: a default", name)
			switch f.Type.Kind() {
			case reflect.Int, reflect.Int32, reflect.Int64, reflect.Float64:
				if f.Type != reflect.TypeFor[time.Duration]() && f.Type != reflect.TypeFor[slog.Level]() {
					require.NotEmpty(t, f.Tag.Get("min"), "%s: a lower bound", name)
					require.NotEmpty(t, f.Tag.Get("max"), "%s: an upper bound", name)
				} else if f.Type == reflect.TypeFor[time.Duration]() {
					require.NotEmpty(t, f.Tag.Get("min"), "%s: a lower bound", name)
				}
			}
		}
	}
	walk(reflect.TypeFor[config.Config]())
}

// A secret's bad value is refused without being repeated, and the log
// shows only that it was set.
func TestSecretsAreNeverShown(t *testing.T) {
	t.Parallel()
	_, err := config.Load(func(name string) string {
		if name == "WEBHOOK_SIGNING_KEY" {
			return "c2hvcnQtYnV0LXNlY3JldA=="
		}
		return ""
	})
	require.ErrorContains(t, err, "WEBHOOK_SIGNING_KEY")
	require.NotContains(t, err.Error(), "c2hvcnQtYnV0LXNlY3JldA==")

	key := "bG9uZy1lbm91Z2gtYW5kLXNlY3JldC1rZXktb2YtdGhpcnR5LXR3bw=="
	c, err := config.Load(func(name string) string {
		switch name {
		case "WEBHOOK_SIGNING_KEY":
			return key
		case "ADMIN_PASSWORD":
			return "correct horse battery staple"
		}
		return ""
	})
	require.NoError(t, err)
	logged := fmt.Sprint(c.LogAttrs()...)
	require.NotContains(t, logged, key)
	require.NotContains(t, logged, "long-enough")
	require.NotContains(t, logged, "correct horse")
	require.Contains(t, logged, "webhook_signing_key_set=true")
	require.Contains(t, logged, "admin_password_set=true")
	require.Contains(t, logged, "stripe_secret_key_set=false")
	for _, s := range config.Settings() {
		require.Contains(t, logged, strings.ToLower(s.Name), "every setting is logged at start")
	}
}
