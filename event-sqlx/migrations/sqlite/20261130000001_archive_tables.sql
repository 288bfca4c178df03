-- Archive tables (seed 000: 归档后再清理, archive first, then delete): published or cancelled outbox
-- rows and succeeded or cancelled message rows move here, in batches, once older than the
-- retention; the online tables stay small. Same columns; the id is the live row's.
CREATE TABLE IF NOT EXISTS biz_outbox_event_archive (
    id INTEGER PRIMARY KEY,
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
    update_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))
);
CREATE INDEX IF NOT EXISTS outbox_archive_idx_update_time ON biz_outbox_event_archive (update_time);
CREATE INDEX IF NOT EXISTS outbox_archive_idx_event_no ON biz_outbox_event_archive (event_no);
CREATE INDEX IF NOT EXISTS outbox_archive_idx_aggregate ON biz_outbox_event_archive (aggregate_type, aggregate_id, aggregate_sequence);

CREATE TABLE IF NOT EXISTS biz_message_event_archive (
    id INTEGER PRIMARY KEY,
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
    update_time TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now'))
);
CREATE INDEX IF NOT EXISTS message_archive_idx_update_time ON biz_message_event_archive (update_time);
CREATE INDEX IF NOT EXISTS message_archive_idx_event_no ON biz_message_event_archive (event_no);

-- Archiving picks final rows by status and age: answered from this index, not a scan.
CREATE INDEX IF NOT EXISTS outbox_idx_status_update_time ON biz_outbox_event (publish_status, update_time);
CREATE INDEX IF NOT EXISTS message_idx_status_update_time ON biz_message_event (event_status, update_time);
