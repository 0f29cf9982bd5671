BEGIN;
DROP FUNCTION authenticate_request(bytea, text);
COMMIT;
