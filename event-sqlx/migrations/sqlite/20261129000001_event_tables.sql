-- The seeds' tables; see migrations/mysql for the column comments.
CREATE TABLE IF NOT EXISTS biz_outbox_event (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event_no TEXT NOT NULL,
    aggregate_type TEXT NOT NULL,
    aggregate_id TEXT NOT NULL,
    aggregate_sequence INTEGER NOT NULL,
    event_type TEXT NOT NULL,
    event_version INTEGER NOT NULL DEFAULT 1,
    event_source TEXT NOT NULL,
    publish_channel TEXT NOT NULL,
    topic TEXT,
    routing_key TEXT,
    event_payload TEXT NOT NULL,
    event_headers TEXT,
    publish_status INTEGER NOT NULL DEFAULT 0,
    retry_count INTEGER NOT NULL DEFAULT 0,
    max_retry_count INTEGER NOT NULL DEFAULT 5,
    next_retry_time TEXT,
    locked_by TEXT,
    lock_until TEXT,
    last_publish_time TEXT,
    published_time TEXT,
    fail_reason TEXT,
    trace_id TEXT,
    remark TEXT,
    version INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0,
    create_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    update_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    CONSTRAINT ck_outbox_status CHECK (publish_status BETWEEN 0 AND 4)
);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_uk_event_no ON biz_outbox_event (event_no);
CREATE UNIQUE INDEX IF NOT EXISTS outbox_uk_aggregate_sequence ON biz_outbox_event (aggregate_type, aggregate_id, aggregate_sequence);
CREATE INDEX IF NOT EXISTS outbox_idx_status_retry_time ON biz_outbox_event (publish_status, next_retry_time, retry_count);
CREATE INDEX IF NOT EXISTS outbox_idx_status_lock_until ON biz_outbox_event (publish_status, lock_until);
CREATE INDEX IF NOT EXISTS outbox_idx_aggregate ON biz_outbox_event (aggregate_type, aggregate_id);
CREATE INDEX IF NOT EXISTS outbox_idx_event_type_create_time ON biz_outbox_event (event_type, create_time);
CREATE INDEX IF NOT EXISTS outbox_idx_topic_create_time ON biz_outbox_event (topic, create_time);
CREATE INDEX IF NOT EXISTS outbox_idx_trace_id ON biz_outbox_event (trace_id);
CREATE INDEX IF NOT EXISTS outbox_idx_create_time ON biz_outbox_event (create_time);
-- The relay's claim walks only the claimable rows, in id order: its cost does not grow with the
-- published history.
CREATE INDEX IF NOT EXISTS outbox_idx_claimable ON biz_outbox_event (id) WHERE publish_status IN (0, 3) AND deleted = 0;
-- Per-aggregate order asks "is an earlier event of this aggregate unpublished?": answered from the
-- unpublished rows alone, however long the aggregate's history.
CREATE INDEX IF NOT EXISTS outbox_idx_unpublished_aggregate ON biz_outbox_event (aggregate_type, aggregate_id, aggregate_sequence) WHERE publish_status IN (0, 1, 3) AND deleted = 0;

CREATE TABLE IF NOT EXISTS biz_message_event (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event_no TEXT NOT NULL,
    event_type TEXT NOT NULL,
    biz_type TEXT NOT NULL,
    biz_id TEXT NOT NULL,
    event_source TEXT NOT NULL,
    event_payload TEXT NOT NULL,
    event_status INTEGER NOT NULL DEFAULT 0,
    retry_count INTEGER NOT NULL DEFAULT 0,
    max_retry_count INTEGER NOT NULL DEFAULT 3,
    next_retry_time TEXT,
    last_handle_time TEXT,
    success_time TEXT,
    fail_reason TEXT,
    trace_id TEXT,
    remark TEXT,
    version INTEGER NOT NULL DEFAULT 0,
    deleted INTEGER NOT NULL DEFAULT 0,
    create_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    update_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    CONSTRAINT ck_message_status CHECK (event_status BETWEEN 0 AND 4)
);
CREATE UNIQUE INDEX IF NOT EXISTS message_uk_event_no ON biz_message_event (event_no);
CREATE INDEX IF NOT EXISTS message_idx_status_retry_time ON biz_message_event (event_status, next_retry_time, retry_count);
CREATE INDEX IF NOT EXISTS message_idx_biz_type_biz_id ON biz_message_event (biz_type, biz_id);
CREATE INDEX IF NOT EXISTS message_idx_event_type_create_time ON biz_message_event (event_type, create_time);
CREATE INDEX IF NOT EXISTS message_idx_trace_id ON biz_message_event (trace_id);
CREATE INDEX IF NOT EXISTS message_idx_create_time ON biz_message_event (create_time);

CREATE TABLE IF NOT EXISTS consumed_event (
    consumer TEXT NOT NULL,
    event_id TEXT NOT NULL,
    consumed_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    aggregate_type TEXT,
    aggregate_id TEXT,
    aggregate_sequence INTEGER,
    deliveries INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS consumed_idx_consumed_time ON consumed_event (consumed_time);
CREATE INDEX IF NOT EXISTS consumed_idx_consumer_aggregate ON consumed_event (consumer, aggregate_type, aggregate_id, aggregate_sequence);

CREATE TABLE IF NOT EXISTS quarantined_event (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer TEXT NOT NULL,
    consumer_version TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT,
    body TEXT NOT NULL,
    failure_class TEXT NOT NULL,
    reason TEXT NOT NULL,
    retry_count INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    status INTEGER NOT NULL DEFAULT 0,
    first_failure_time TEXT NOT NULL,
    last_failure_time TEXT NOT NULL,
    replay_time TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS quarantine_uk_consumer_event ON quarantined_event (consumer, event_id);
CREATE INDEX IF NOT EXISTS quarantine_idx_status_consumer ON quarantined_event (status, consumer);
