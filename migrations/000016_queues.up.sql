-- The outbox's jobs move out of River's 'default' queue into queues of their
-- own, each with its own workers (internal/outbox: QueueProcessor,
-- QueueWebhooks, QueueMaintenance), so that a tenant's slow webhook
-- receivers cannot hold the workers that charge every tenant's payments.
-- Jobs not finished yet move with them; a finished job keeps its queue. On a
-- new database River's tables come after these migrations: nothing to move.
DO $$
BEGIN
    IF to_regclass('river_job') IS NOT NULL THEN
        UPDATE river_job
        SET queue = CASE kind
            WHEN 'deliver_webhook' THEN 'webhooks'
            WHEN 'reconcile' THEN 'maintenance'
            ELSE 'processor' END
        WHERE queue = 'default'
          AND kind IN ('charge_payment', 'refund_payment', 'deliver_webhook', 'reconcile')
          AND state NOT IN ('completed', 'discarded', 'cancelled');
    END IF;
END $$;
