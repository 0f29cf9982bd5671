DO $$
BEGIN
    IF to_regclass('river_job') IS NOT NULL THEN
        UPDATE river_job SET queue = 'default'
        WHERE queue IN ('processor', 'webhooks', 'maintenance')
          AND state NOT IN ('completed', 'discarded', 'cancelled');
    END IF;
END $$;
