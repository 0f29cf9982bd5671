DROP FUNCTION set_lock_timeout(bigint);
