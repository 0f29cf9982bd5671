BEGIN;
DROP TABLE idempotency_keys;
DROP TABLE payments;
DROP TABLE api_keys;
DROP TABLE principals;
-- The roles are cluster-wide and may serve other databases; they are left in place.
COMMIT;
