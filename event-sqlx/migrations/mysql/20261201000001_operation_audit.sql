-- The operators' audit trail: every change made from the web console (retry, cancel, skip,
-- requeue, bulk retry), who made it, when, on which rows and why. Rows are only ever added.
CREATE TABLE IF NOT EXISTS operation_audit (
    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    action_time DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT 'when',
    actor VARCHAR(128) NOT NULL COMMENT 'who',
    action VARCHAR(64) NOT NULL COMMENT 'what',
    target VARCHAR(512) NOT NULL COMMENT 'the event, aggregate, entry or filter acted on',
    affected BIGINT NOT NULL DEFAULT 0 COMMENT 'rows changed',
    affected_rows TEXT COMMENT 'which rows (event numbers or entry ids)',
    reason VARCHAR(1000) COMMENT 'why',
    outcome VARCHAR(1000) NOT NULL COMMENT 'what happened',
    KEY idx_action_time (action_time)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT='operators'' audit trail';
