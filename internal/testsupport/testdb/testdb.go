// Package testdb gives each test its own migrated PostgreSQL database, so
// tests run in parallel without seeing each other's rows.
//
// The server comes from TEST_DATABASE_URL when it is set (a superuser or a
// role with CREATEDB and CREATEROLE). Otherwise, when a Docker engine answers
// a ping, testcontainers starts PostgreSQL 15 for the test binary. Otherwise
// the test fails and says how to provide a database: a skipped database test
// would count as a pass while proving nothing.
//
// Migrations run once per test binary into a template database (pgtestdb);
// each test then gets a cheap copy of it.
//
// Connections are budgeted: New takes the most connections the test will
// hold at once and waits until the whole run (every package's test binary)
// has that many to spare out of TEST_DB_CONNECTIONS (DefaultBudget). The
// server enforces each test's share: its database gets a CONNECTION LIMIT,
// so a test that opens more than it asked for fails with "too many
// connections for database" instead of crowding out the server's other users.
//
// A test that fails keeps its database for inspection and names it in the
// failure; scripts/drop-test-databases removes every leftover.
package testdb

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver pgtestdb uses
	"github.com/peterldowns/pgtestdb"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"

	"github.com/payments-reference/idempotent-payments/internal/database"
	"github.com/payments-reference/idempotent-payments/migrations"
)

// DB is one test's database, reachable as each of the project's roles.
type DB struct {
	// OwnerURL connects as the role that owns the tables and ran migrations.
	OwnerURL string
	// AppURL connects as payments_app, the service role that row-level
	// security applies to.
	AppURL string
	// MaintenanceURL connects as payments_maintenance (sweeper, gauges).
	MaintenanceURL string
	// AdminURL connects as the server's admin (TEST_DATABASE_URL's role, a
	// superuser), which row-level security does not apply to: for tests
	// that count every tenant's rows.
	AdminURL string
}

const howTo = `no PostgreSQL for tests: set TEST_DATABASE_URL to a server this test can create databases and roles on, for example
  TEST_DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go test -race ./...
or start a Docker engine so that testcontainers can run PostgreSQL (%v)`

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
	container  *tcpostgres.PostgresContainer
	slots      *budget
	holders    sync.Map // testing.TB -> true while it holds a reservation
)

// server returns the admin URL of the PostgreSQL server for this process.
func server() (string, error) {
	serverOnce.Do(func() {
		size, err := budgetSize()
		if err != nil {
			serverErr = err
			return
		}
		defer func() {
			if serverErr == nil {
				serverErr = openBudget(serverURL, size)
			}
		}()
		if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
			serverURL = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := pingDocker(ctx); err != nil {
			serverErr = fmt.Errorf(howTo, err)
			return
		}
		c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
			tcpostgres.WithDatabase("postgres"),
			tcpostgres.WithUsername("postgres"),
			tcpostgres.WithPassword("postgres"),
			// The service and maintenance roles are created by migrations
			// without passwords; trust lets the tests log in as them.
			testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
			tcpostgres.BasicWaitStrategies(),
		)
		if err != nil {
			serverErr = fmt.Errorf("start PostgreSQL with testcontainers: %w", err)
			return
		}
		container = c
		serverURL, serverErr = c.ConnectionString(ctx, "sslmode=disable")
	})
	return serverURL, serverErr
}

// openBudget opens the connection budget of the server at rawURL.
func openBudget(rawURL string, size int) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("TEST_DATABASE_URL: %w", err)
	}
	slots, err = newBudget(u.Host, size)
	return err
}

// pingDocker checks that a Docker engine answers. A docker client binary alone
// (as on machines without an engine) is not enough.
func pingDocker(ctx context.Context) (err error) {
	defer func() {
		// testcontainers panics on some hosts without a Docker socket.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	defer p.Close()
	return p.Health(ctx)
}

// Main runs a package's tests, stops the container if one was started, and
// fails the run if a test leaked a goroutine. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if container != nil {
		_ = testcontainers.TerminateContainer(container)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// migrator applies the embedded migrations to pgtestdb's template.
type migrator struct{}

func (migrator) Hash() (string, error) {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	// River's tables come from the river module's own migrations.
	fmt.Fprintf(h, "river\x00%d\x00", database.RiverVersion())
	return hex.EncodeToString(h.Sum(nil)), err
}

func (migrator) Migrate(ctx context.Context, _ *sql.DB, conf pgtestdb.Config) error {
	return database.Migrate(ctx, conf.URL())
}

// minConns is the least a test may ask New for: the first test of a binary
// creates the template, which takes an admin connection, one to the template
// and up to two for the migrations, before the test opens any of its own.
const minConns = 4

// New returns a fresh database for t, dropped when t ends (kept when it
// fails, for inspection), and reserves conns connections of the run's budget
// until then. conns is the most connections t holds at once, as every role
// together: pool sizes plus single connections. Open pools after New and close
// them in t.Cleanup (which runs before the database is dropped) so that the
// count holds. Values below minConns are raised to it.
func New(t testing.TB, conns int) DB {
	t.Helper()
	admin, err := server()
	if err != nil {
		t.Fatal(err)
	}
	// A test that held slots and waited for more could deadlock the run
	// with another doing the same; a test that needs two databases uses a
	// subtest for each.
	if _, loaded := holders.LoadOrStore(t, true); loaded {
		t.Fatal("testdb.New called twice in one test: give each database a subtest of its own")
	}
	conns = max(conns, minConns)
	release, err := slots.acquire(conns)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after pgtestdb dropped the database
	// and closed its own connection.
	t.Cleanup(func() {
		release()
		holders.Delete(t)
	})

	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	password, _ := u.User.Password()
	conf := pgtestdb.Config{
		DriverName: "pgx",
		Host:       u.Hostname(),
		Port:       u.Port(),
		User:       u.User.Username(),
		Password:   password,
		Database:   u.Path[1:],
		Options:    u.RawQuery,
		TestRole: &pgtestdb.Role{
			Username: "payments_test_owner",
			// No password (PostgreSQL clears an empty one): the tests log
			// in by trust, as they do as payments_app, and a cluster-wide
			// role whose password is its own name would be a door left
			// open on a shared server. scripts/drop-test-databases drops it.
			Password: "",
			// CREATEROLE because the first migration creates the service roles.
			Capabilities: "NOSUPERUSER NOCREATEDB CREATEROLE",
		},
		ForceTerminateConnections: true,
	}
	inst := pgtestdb.Custom(t, conf, migrator{})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("testdb: kept database %s for inspection; scripts/drop-test-databases removes every leftover", inst.Database)
		}
	})
	adminURL := *u
	adminURL.Path = "/" + inst.Database
	limitConnections(t, adminURL.String(), inst.Database, conns)
	owner := inst.URL()
	return DB{
		OwnerURL:       owner,
		AppURL:         database.WithUser(owner, "payments_app"),
		MaintenanceURL: database.WithUser(owner, "payments_maintenance"),
		AdminURL:       adminURL.String(),
	}
}

// limitConnections makes the server refuse a connection to the test's
// database past its reservation. Superusers are exempt from a database's
// CONNECTION LIMIT, so AdminURL pools must be counted in conns by hand.
func limitConnections(t testing.TB, adminURL, name string, conns int) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("testdb: connect to set the connection limit: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s CONNECTION LIMIT %d", pgx.Identifier{name}.Sanitize(), conns)); err != nil {
		t.Fatalf("testdb: set the connection limit: %v", err)
	}
}
