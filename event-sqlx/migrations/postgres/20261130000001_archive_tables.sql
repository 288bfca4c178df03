-- Archive tables (seed 000: 归档后再清理, archive first, then delete): published or cancelled outbox
-- rows and succeeded or cancelled message rows move here, in batches, once older than the
-- retention; the online tables stay small. Same columns; the id is the live row's.
CREATE TABLE IF NOT EXISTS biz_outbox_event_archive (LIKE biz_outbox_event INCLUDING DEFAULTS);
ALTER TABLE biz_outbox_event_archive ALTER COLUMN id DROP IDENTITY IF EXISTS;
ALTER TABLE biz_outbox_event_archive ADD PRIMARY KEY (id);
CREATE INDEX IF NOT EXISTS outbox_archive_idx_update_time ON biz_outbox_event_archive (update_time);
CREATE INDEX IF NOT EXISTS outbox_archive_idx_event_no ON biz_outbox_event_archive (event_no);
CREATE INDEX IF NOT EXISTS outbox_archive_idx_aggregate ON biz_outbox_event_archive (aggregate_type, aggregate_id, aggregate_sequence);

CREATE TABLE IF NOT EXISTS biz_message_event_archive (LIKE biz_message_event INCLUDING DEFAULTS);
ALTER TABLE biz_message_event_archive ALTER COLUMN id DROP IDENTITY IF EXISTS;
ALTER TABLE biz_message_event_archive ADD PRIMARY KEY (id);
CREATE INDEX IF NOT EXISTS message_archive_idx_update_time ON biz_message_event_archive (update_time);
CREATE INDEX IF NOT EXISTS message_archive_idx_event_no ON biz_message_event_archive (event_no);

-- Archiving picks final rows by status and age: answered from this index, not a scan.
CREATE INDEX IF NOT EXISTS outbox_idx_status_update_time ON biz_outbox_event (publish_status, update_time);
CREATE INDEX IF NOT EXISTS message_idx_status_update_time ON biz_message_event (event_status, update_time);
