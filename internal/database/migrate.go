package database

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratedb "github.com/golang-migrate/migrate/v4/database"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
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
	return MigrateFrom(ctx, ownerURL, migrations.FS)
}

// MigrateFrom is Migrate with the numbered migrations read from fsys: a
// test's migrations beside the embedded ones.
func MigrateFrom(ctx context.Context, ownerURL string, fsys fs.FS) error {
	src, err := iofs.New(fsys, ".")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	// golang-migrate's pgx/v5 driver takes the pgx5:// scheme.
	u, err := url.Parse(ownerURL)
	if err != nil {
		return fmt.Errorf("parse owner database url: %w", err)
	}
	u.Scheme = "pgx5"
	driver, err := (&pgxmigrate.Postgres{}).Open(u.String())
	if err != nil {
		return fmt.Errorf("connect for migrations: %w", Classify(err))
	}
	citus, err := hasCitus(ctx, ownerURL)
	if err != nil {
		return err
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", statementDriver{Driver: driver, citus: citus})
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
	if !citus {
		return nil
	}
	return distributeOnCitus(ctx, ownerURL)
}

// statementDriver is golang-migrate's PostgreSQL driver, but it sends a
// migration file a statement at a time (statements), on its one
// connection, instead of the whole file as one query string: a file that
// altered distributed tables failed on a cluster as one query string (the
// issue saw "cannot insert multiple commands into a prepared statement";
// TestAMigrationAfterDistributionRuns saw "failure on connection marked as
// essential" at the file's first line). The file's own BEGIN and COMMIT are
// statements too, so it still commits whole or not at all; golang-migrate
// keeps its version table, its lock and its dirty flag as before.
//
// On Citus it also runs the file's multi-shard commands one shard at a
// time (citus.multi_shard_modify_mode = 'sequential'): Citus refuses, in
// one transaction, to propagate a new function after a DDL command that
// ran on the shards in parallel ("cannot run function command because
// there was a parallel operation on a distributed table in the
// transaction"). Slower, and a migration runs once.
type statementDriver struct {
	migratedb.Driver
	citus bool
}

// Run runs each statement of the migration in order; at the first that
// fails it rolls back the file's transaction and stops, leaving the
// version dirty, as golang-migrate does for a failed file.
func (d statementDriver) Run(migration io.Reader) error {
	raw, err := io.ReadAll(migration)
	if err != nil {
		return err
	}
	if d.citus {
		if err := d.Driver.Run(strings.NewReader(`SET citus.multi_shard_modify_mode TO 'sequential'`)); err != nil {
			return err
		}
	}
	for _, stmt := range statements(string(raw)) {
		if err := d.Driver.Run(strings.NewReader(stmt)); err != nil {
			_ = d.Driver.Run(strings.NewReader("ROLLBACK"))
			return err
		}
	}
	return nil
}

// distributeOnCitus runs migrations.Citus, on a Citus coordinator (a
// database with the citus extension): the tables spread over the
// workers by principal, as part of the migrations rather than a script
// an operator must remember, and a table a later migration adds is
// distributed by the same command. Each statement runs on its own (ALTER
// SYSTEM refuses a transaction block).
func distributeOnCitus(ctx context.Context, ownerURL string) error {
	conn, err := pgx.Connect(ctx, ownerURL)
	if err != nil {
		return fmt.Errorf("connect to distribute: %w", Classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, stmt := range statements(migrations.Citus) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("distribute on Citus: %w\n%s", err, stmt)
		}
	}
	return nil
}

// hasCitus reports whether the database at url is a Citus coordinator (it
// has the citus extension).
func hasCitus(ctx context.Context, url string) (bool, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false, fmt.Errorf("connect to look for citus: %w", Classify(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return false, fmt.Errorf("look for citus: %w", err)
	}
	return citus, nil
}

// statements splits sql into statements at each semicolon that ends a line
// (before a trailing -- comment) outside a $$-quoted body, leaving out what
// holds only comments and space.
func statements(sql string) []string {
	var out []string
	var cur strings.Builder
	inBody := false
	for line := range strings.Lines(sql) {
		cur.WriteString(line)
		code := line
		if i := strings.Index(code, "--"); i >= 0 && strings.Count(code[:i], "'")%2 == 0 {
			code = code[:i] // a comment's $$ or semicolon is text
		}
		if strings.Count(code, "$$")%2 == 1 {
			inBody = !inBody
		}
		if !inBody && strings.HasSuffix(strings.TrimRight(code, " \t\r\n"), ";") {
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
