-- Runs once, when the compose volume is new. The migrations create these
-- roles too (without passwords) when they are missing; here they get
-- passwords because the official image requires them for network logins.
CREATE ROLE payments_app LOGIN PASSWORD 'payments_app' NOSUPERUSER NOBYPASSRLS;
CREATE ROLE payments_maintenance LOGIN PASSWORD 'payments_maintenance' NOSUPERUSER NOBYPASSRLS;
CREATE DATABASE payments;
