package config_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

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
