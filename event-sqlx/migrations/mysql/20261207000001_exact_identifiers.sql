-- Identifiers compare byte for byte. The tables' default collation (utf8mb4_general_ci on
-- MariaDB, utf8mb4_0900_ai_ci on MySQL 8) takes 'ORDER_PAID:abc' and 'ORDER_PAID:ABC', 'e' and
-- 'é', and (MariaDB) 'x' and 'x ' for the same value, so a unique key would take a new event for
-- a repeat of another and an inbox would skip its effect. A binary collation that does not pad
-- makes them as different as they are everywhere else (PostgreSQL, SQLite, Rust), and is
-- cheaper to compare. `/*M! */` is read by MariaDB only, `/*!80017 */` by MySQL 8.0.17 and later
-- only. Each table is rebuilt once; archive first on a large table.
ALTER TABLE biz_outbox_event
    MODIFY event_no VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'event number, the global idempotency key',
    MODIFY aggregate_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'aggregate type',
    MODIFY aggregate_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'aggregate id',
    MODIFY locked_by VARCHAR(128) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ DEFAULT NULL COMMENT 'relay instance holding the lease';
ALTER TABLE biz_outbox_event_archive
    MODIFY event_no VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'event number, the global idempotency key',
    MODIFY aggregate_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'aggregate type',
    MODIFY aggregate_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'aggregate id',
    MODIFY locked_by VARCHAR(128) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ DEFAULT NULL COMMENT 'relay instance holding the lease';
ALTER TABLE biz_message_event
    MODIFY event_no VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'event number',
    MODIFY biz_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'business type',
    MODIFY biz_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'business id';
ALTER TABLE biz_message_event_archive
    MODIFY event_no VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'event number',
    MODIFY biz_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'business type',
    MODIFY biz_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'business id';
ALTER TABLE consumed_event
    MODIFY consumer VARCHAR(128) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'consumer name',
    MODIFY event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'eventId (event_no) consumed',
    MODIFY aggregate_type VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ DEFAULT NULL COMMENT 'aggregate type of the event',
    MODIFY aggregate_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ DEFAULT NULL COMMENT 'aggregate id of the event';
ALTER TABLE quarantined_event
    MODIFY consumer VARCHAR(128) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'consumer name',
    MODIFY event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE /*M! utf8mb4_nopad_bin */ /*!80017 utf8mb4_0900_bin */ NOT NULL COMMENT 'eventId, or a digest of an undecodable body';
