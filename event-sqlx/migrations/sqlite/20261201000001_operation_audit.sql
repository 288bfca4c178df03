-- The operators' audit trail: every change made from the web console (retry, cancel, skip,
-- requeue, bulk retry), who made it, when, on which rows and why. Rows are only ever added.
CREATE TABLE IF NOT EXISTS operation_audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    action_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    affected INTEGER NOT NULL DEFAULT 0,
    affected_rows TEXT,
    reason TEXT,
    outcome TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS operation_audit_idx_action_time ON operation_audit (action_time);
