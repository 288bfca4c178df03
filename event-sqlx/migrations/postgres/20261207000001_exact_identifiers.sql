-- Identifiers compare byte for byte (the "C" collation) whatever the database's own collation:
-- they already compare equal only when their bytes do, but a linguistic collation (en_US.UTF-8,
-- an ICU locale) makes every comparison in their unique keys, and so every insert and every
-- update of an event, dearer, for an order nobody reads. Each index on these columns is rebuilt
-- once; archive first on a large table.
ALTER TABLE biz_outbox_event
    ALTER COLUMN event_no TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN aggregate_type TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN aggregate_id TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN locked_by TYPE VARCHAR(128) COLLATE "C";
ALTER TABLE biz_outbox_event_archive
    ALTER COLUMN event_no TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN aggregate_type TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN aggregate_id TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN locked_by TYPE VARCHAR(128) COLLATE "C";
ALTER TABLE biz_message_event
    ALTER COLUMN event_no TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN biz_type TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN biz_id TYPE VARCHAR(64) COLLATE "C";
ALTER TABLE biz_message_event_archive
    ALTER COLUMN event_no TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN biz_type TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN biz_id TYPE VARCHAR(64) COLLATE "C";
ALTER TABLE consumed_event
    ALTER COLUMN consumer TYPE VARCHAR(128) COLLATE "C",
    ALTER COLUMN event_id TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN aggregate_type TYPE VARCHAR(64) COLLATE "C",
    ALTER COLUMN aggregate_id TYPE VARCHAR(64) COLLATE "C";
ALTER TABLE quarantined_event
    ALTER COLUMN consumer TYPE VARCHAR(128) COLLATE "C",
    ALTER COLUMN event_id TYPE VARCHAR(64) COLLATE "C";
