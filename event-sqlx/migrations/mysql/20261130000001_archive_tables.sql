-- Archive tables (seed 000: 归档后再清理, archive first, then delete): published or cancelled outbox
-- rows and succeeded or cancelled message rows move here, in batches, once older than the
-- retention; the online tables stay small. Same columns and keys; the id is the live row's.
CREATE TABLE IF NOT EXISTS biz_outbox_event_archive LIKE biz_outbox_event;
CREATE TABLE IF NOT EXISTS biz_message_event_archive LIKE biz_message_event;

-- Archiving picks final rows by status and age: answered from this index, not a scan.
CREATE INDEX idx_status_update_time ON biz_outbox_event (publish_status, update_time);
CREATE INDEX idx_status_update_time ON biz_message_event (event_status, update_time);
CREATE INDEX idx_update_time ON biz_outbox_event_archive (update_time);
CREATE INDEX idx_update_time ON biz_message_event_archive (update_time);
