DROP FUNCTION list_horizon();
