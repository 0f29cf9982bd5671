// Package migrations holds the schema as numbered SQL files, embedded into the
// binary so that `api migrate up` and `api serve` need nothing on disk.
//
// Files follow golang-migrate's NNNNNN_name.up.sql / .down.sql convention.
// `api migrate up` sends a file a statement at a time (database.Migrate;
// each statement ends with a semicolon at the end of a line, outside $$
// bodies), so each file wraps itself in BEGIN/COMMIT: without them a
// statement that fails would leave half a migration behind.
package migrations

import "embed"

// FS contains every migration file.
//
//go:embed *.sql
var FS embed.FS

// RiverGrants gives the service roles what they need on River's tables. River
// creates them with its own migrator (rivermigrate), which runs after the
// files above; golang-migrate skips this file, whose name has no version.
//
//go:embed river_grants.sql
var RiverGrants string

// Citus distributes the tables by principal on a Citus cluster. Migrate
// runs it after the numbered files and River's migrations, a statement at a
// time, when the database has the citus extension; every statement can run
// again. Its statements end with a semicolon at the end of a line, outside
// $$ bodies.
//
//go:embed citus.sql
var Citus string
