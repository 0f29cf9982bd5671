package database

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5" // registers pgx5://
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/payments-reference/idempotent-payments/migrations"
)

// Migrate applies every pending migration to the database at ownerURL. It
// must run as the role that owns the tables (and may create roles), never as
// the service role.
func Migrate(ctx context.Context, ownerURL string) error {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	// golang-migrate's pgx/v5 driver registers the pgx5:// scheme.
	u, err := url.Parse(ownerURL)
	if err != nil {
		return fmt.Errorf("parse owner database url: %w", err)
	}
	u.Scheme = "pgx5"
	m, err := migrate.NewWithSourceInstance("iofs", src, u.String())
	if err != nil {
		return fmt.Errorf("connect for migrations: %w", Classify(err))
	}
	defer m.Close()
	stop := context.AfterFunc(ctx, func() { m.GracefulStop <- true })
	defer stop()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("apply migrations: %w", err)
	}
	if err := migrateRiver(ctx, ownerURL); err != nil {
		return err
	}
	return distributeOnCitus(ctx, ownerURL)
}

// distributeOnCitus runs migrations.Citus when the database is a Citus
// coordinator (it has the citus extension): the tables spread over the
// workers by principal, as part of the migrations rather than a script
// an operator must remember, and a table a later migration adds is
// distributed by the same command. Each statement runs on its own (ALTER
// SYSTEM refuses a transaction block); a database without Citus is left as
// it is.
func distributeOnCitus(ctx context.Context, ownerURL string) error {
	conn, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		return fmt.Errorf("connect to distribute: %w", Classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return fmt.Errorf("look for citus: %w", err)
	}
	if !citus {
		return nil
	}
	for _, stmt := range statements(migrations.Citus) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("distribute on Citus: %w\n%s", err, stmt)
		}
	}
	return nil
}

// statements splits sql into statements at each semicolon that ends a line
// outside a $$-quoted body and outside a comment line, leaving out what
// holds only comments and space.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	inBody := false
	for line := range strings.Lines(sql) {
		cur.WriteString(line)
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue // a comment's $$ or semicolon is text
		}
		if strings.Count(line, "$$")%2 == 1 {
			inBody = !inBody
		}
		if !inBody && strings.HasSuffix(strings.TrimRight(line, " \t\r\n"), ";") {
			out = appendStatement(out, cur.String())
			cur.Reset()
		}
	}
	return appendStatement(out, cur.String())
}

func appendStatement(out []string, stmt string) []string {
	for line := range strings.Lines(stmt) {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
			return append(out, strings.TrimSpace(stmt))
		}
	}
	return out
}

// migrateRiver creates or upgrades River's tables, the outbox's job queue, to
// the version the river module ships, and grants the service roles their
// use. rivermigrate records its versions in river_migration.
func migrateRiver(ctx context.Context, ownerURL string) error {
	pc, err := pgxpool.ParseConfig(ownerURL)
	if err != nil {
		return fmt.Errorf("parse owner database url: %w", err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connect for river migrations: %w", Classify(err))
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("apply river migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, migrations.RiverGrants); err != nil {
		return fmt.Errorf("grant river tables: %w", err)
	}
	return nil
}

// RiverVersion is the newest River schema version the river module ships,
// the one migrate brings a database to.
func RiverVersion() int {
	migrator, err := rivermigrate.New(riverpgxv5.New(nil), nil)
	if err != nil {
		panic(err) // only a nil driver's config is checked; it cannot fail
	}
	all := migrator.AllVersions()
	return all[len(all)-1].Version
}

// WithUser returns the database URL raw with its user replaced by user and
// no password: the service roles log in without one locally (trust), and
// tools derive their URLs from one superuser URL this way. A URL that does
// not parse is returned as it is, for the connection to report.
func WithUser(raw, user string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.User = url.User(user)
	return u.String()
}

// DropDatabase drops the database name on the server serverURL connects to,
// ending its sessions first. The fault suite and the failure lab use it to
// remove the scratch databases they create.
func DropDatabase(ctx context.Context, serverURL, name string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("drop database %q: %w", name, Classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %q: %w", name, err)
	}
	return nil
}

// EnsureDatabase creates the database named in ownerURL when it does not
// exist yet, connecting to the server's "postgres" database to do so. It lets
// the README's run command work on a fresh machine without hand-made setup.
func EnsureDatabase(ctx context.Context, ownerURL string) error {
	cfg, err := pgx.ParseConfig(ownerURL)
	if err != nil {
		return fmt.Errorf("parse owner database url: %w", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect as owner: %w", Classify(err))
	}
	name := cfg.Database
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to create database %q: %w", name, Classify(err))
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: another instance won the race
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}
