//! `impl_backend!`: the statements of [`Backend`](super::Backend), written once and expanded for
//! each database with its concrete types.

macro_rules! impl_backend {
    ($module:ident, $db:ty, $dialect:expr, id = $id:ty, status = $status:ty, $migrations:literal) => {
        mod $module {
        use std::future::Future;

        use chrono::{DateTime, Utc};
        use sqlx::Pool;

        use super::imp::status_of;
        use super::{Backend, Claim, Dialect, Failure, Select};
        use crate::record::{NewOutboxRow, OutboxRecord};
        use crate::{EventStatus, TableName};

        impl super::sealed::Sealed for $db {}

        impl Backend for $db {
            const DIALECT: Dialect = $dialect;

            fn migrate<'a>(
                pool: &'a Pool<$db>,
            ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send + 'a {
                async move {
                    if Self::DIALECT == Dialect::Sqlite {
                        // WAL: the relay reads while the service writes, and a commit appends to
                        // one log instead of rewriting a rollback journal. The setting stays with
                        // the file; an in-memory database keeps its own mode.
                        if let Err(e) = sqlx::raw_sql("PRAGMA journal_mode = WAL").execute(pool).await {
                            tracing::warn!(error = %e, "could not switch SQLite to WAL journaling; relays and writers will wait for each other more");
                        }
                    }
                    let mut migrator = sqlx::migrate!($migrations);
                    // Our own history table: the application's `_sqlx_migrations` is left alone,
                    // and its migrations do not look missing to us (nor ours to it).
                    migrator.dangerous_set_table_name("event_toolkit_migrations");
                    migrator.set_ignore_missing(true);
                    migrator.run(pool).await
                }
            }

            fn insert_outbox<'a>(
                conn: &'a mut <$db as sqlx::Database>::Connection,
                table: &'a TableName,
                rows: &'a [NewOutboxRow],
            ) -> impl Future<Output = Result<Vec<String>, sqlx::Error>> + Send + 'a {
                async move {
                    use sqlx::{QueryBuilder, Row};
                    let insert = |chunk: &[&'a NewOutboxRow]| {
                        let mut q = QueryBuilder::<$db>::new(format!(
                            "INSERT INTO {table} ({}) ",
                            super::INSERT_COLUMNS
                        ));
                        q.push_values(chunk.iter(), |mut b, row| {
                            b.push_bind(row.event_no.as_str())
                                .push_bind(row.aggregate_type.as_str())
                                .push_bind(row.aggregate_id.as_str())
                                .push_bind(row.aggregate_sequence)
                                .push_bind(row.event_type.as_str())
                                .push_bind(row.event_version)
                                .push_bind(row.event_source.as_str())
                                .push_bind(row.publish_channel.as_str())
                                .push_bind(row.topic.as_deref())
                                .push_bind(row.routing_key.as_deref())
                                .push_bind(sqlx::types::Json(&row.event_payload))
                                .push_bind(sqlx::types::Json(&row.event_headers))
                                .push_bind(0_i16)
                                .push_bind(0_i32)
                                .push_bind(row.max_retry_count)
                                .push_bind(row.trace_id.as_deref())
                                .push_bind(row.create_time)
                                .push_bind(row.create_time);
                        });
                        q
                    };
                    let mut inserted = Vec::with_capacity(rows.len());
                    for chunk in rows.chunks(super::ROWS_PER_INSERT) {
                        let mut chunk: Vec<&NewOutboxRow> = chunk.iter().collect();
                        if Self::DIALECT != Dialect::MySql {
                            let mut q = insert(&chunk);
                            q.push(" ON CONFLICT (event_no) DO NOTHING RETURNING event_no");
                            for r in q.build().fetch_all(&mut *conn).await? {
                                inserted.push(r.try_get::<String, _>(0)?);
                            }
                            continue;
                        }
                        // No RETURNING on MySQL. Duplicates are rare, so a plain INSERT goes
                        // first: a duplicate key fails it whole, and MySQL then rolls back that
                        // statement only, not the caller's transaction.
                        match insert(&chunk).build().execute(&mut *conn).await {
                            Ok(_) => {
                                inserted.extend(chunk.iter().map(|row| row.event_no.clone()));
                                continue;
                            }
                            Err(e)
                                if !e
                                    .as_database_error()
                                    .is_some_and(|d| d.is_unique_violation()) =>
                            {
                                return Err(e);
                            }
                            Err(_) => {}
                        }
                        // Then find the duplicates and insert the rest with a plain INSERT
                        // again, so that a conflict on the aggregate sequence is an error and
                        // never silently absorbed.
                        let mut q = QueryBuilder::<$db>::new(format!(
                            "SELECT event_no FROM {table} WHERE event_no IN "
                        ));
                        super::push_list(&mut q, chunk.iter().map(|row| row.event_no.as_str()));
                        let existing: Vec<String> = q
                            .build()
                            .fetch_all(&mut *conn)
                            .await?
                            .iter()
                            .map(|r| r.try_get::<String, _>(0))
                            .collect::<Result<_, _>>()?;
                        chunk.retain(|row| !existing.contains(&row.event_no));
                        if !chunk.is_empty() {
                            insert(&chunk).build().execute(&mut *conn).await?;
                            inserted.extend(chunk.iter().map(|row| row.event_no.clone()));
                        }
                    }
                    Ok(inserted)
                }
            }

            fn aggregate_version<'a>(
                conn: &'a mut <$db as sqlx::Database>::Connection,
                table: &'a TableName,
                aggregate_type: &'a str,
                aggregate_id: &'a str,
            ) -> impl Future<Output = Result<i64, sqlx::Error>> + Send + 'a {
                async move {
                    use sqlx::{QueryBuilder, Row};
                    let mut q = QueryBuilder::<$db>::new(format!(
                        "SELECT MAX(aggregate_sequence) FROM {table} WHERE aggregate_type = "
                    ));
                    q.push_bind(aggregate_type)
                        .push(" AND aggregate_id = ")
                        .push_bind(aggregate_id);
                    let row = q.build().fetch_one(&mut *conn).await?;
                    Ok(row.try_get::<Option<i64>, _>(0)?.unwrap_or(0))
                }
            }

            fn claim<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                claim: &'a Claim<'a>,
            ) -> impl Future<Output = Result<Vec<OutboxRecord>, sqlx::Error>> + Send + 'a {
                async move {
                    use sqlx::QueryBuilder;
                    let ordering = if claim.ordered {
                        super::NO_EARLIER_UNPUBLISHED.replace("{t}", table.as_str())
                    } else {
                        String::new()
                    };
                    let candidates = |q: &mut QueryBuilder<$db>| {
                        q.push(format!(" FROM {table} o WHERE {}", super::CLAIMABLE));
                        q.push(" AND (o.next_retry_time IS NULL OR o.next_retry_time <= ")
                            .push_bind(claim.now)
                            .push(")");
                        q.push(ordering.as_str());
                        q.push(super::claim_order(Self::DIALECT));
                        q.push(" LIMIT ").push_bind(claim.limit);
                    };
                    let set_claimed = |q: &mut QueryBuilder<$db>| {
                        q.push(format!("UPDATE {table} SET publish_status = 1, locked_by = "));
                        q.push_bind(claim.relay_id)
                            .push(", lock_until = ")
                            .push_bind(claim.lease_until)
                            .push(", last_publish_time = ")
                            .push_bind(claim.now)
                            .push(", version = version + 1, update_time = ")
                            .push_bind(claim.now);
                    };
                    let mut records = match Self::DIALECT {
                        Dialect::Postgres | Dialect::Sqlite => {
                            // One statement: pick and lease the batch, return the rows.
                            let mut q = QueryBuilder::<$db>::new("");
                            set_claimed(&mut q);
                            // On SQLite the unary `+` keeps the planner from answering this
                            // guard from a status index instead of looking the ids up.
                            q.push(if Self::DIALECT == Dialect::Sqlite {
                                " WHERE +publish_status IN (0, 3) AND id IN (SELECT o.id"
                            } else {
                                " WHERE publish_status IN (0, 3) AND id IN (SELECT o.id"
                            });
                            candidates(&mut q);
                            if Self::DIALECT == Dialect::Postgres {
                                q.push(" FOR UPDATE SKIP LOCKED");
                            }
                            q.push(format!(") RETURNING {}", super::COLUMNS));
                            let rows = q.build().fetch_all(pool).await?;
                            rows.iter().map(decode_record).collect::<Result<Vec<_>, _>>()?
                        }
                        Dialect::MySql => {
                            // SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, in one short
                            // transaction; the rows are patched in memory, not read again.
                            let mut tx = pool.begin().await?;
                            let mut q = QueryBuilder::<$db>::new(format!(
                                "SELECT {}",
                                super::COLUMNS
                            ));
                            candidates(&mut q);
                            q.push(" FOR UPDATE SKIP LOCKED");
                            let rows = q.build().fetch_all(&mut *tx).await?;
                            let mut records =
                                rows.iter().map(decode_record).collect::<Result<Vec<_>, _>>()?;
                            if !records.is_empty() {
                                let mut q = QueryBuilder::<$db>::new("");
                                set_claimed(&mut q);
                                q.push(" WHERE publish_status IN (0, 3) AND id IN ");
                                super::push_list(&mut q, records.iter().map(|r| r.id));
                                q.build().execute(&mut *tx).await?;
                                for record in &mut records {
                                    record.publish_status = EventStatus::InProgress;
                                    record.locked_by = Some(claim.relay_id.to_owned());
                                    record.lock_until = Some(claim.lease_until);
                                    record.last_publish_time = Some(claim.now);
                                    record.version += 1;
                                    record.update_time = claim.now;
                                }
                            }
                            tx.commit().await?;
                            records
                        }
                    };
                    records.sort_by_key(|r| r.id);
                    Ok(records)
                }
            }

            fn mark_published<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                relay_id: &'a str,
                ids: &'a [i64],
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    if ids.is_empty() {
                        return Ok(0);
                    }
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "UPDATE {table} SET publish_status = 2, published_time = "
                    ));
                    q.push_bind(now)
                        .push(", fail_reason = NULL, locked_by = NULL, lock_until = NULL, update_time = ")
                        .push_bind(now)
                        .push(" WHERE deleted = 0 AND publish_status = 1 AND locked_by = ")
                        .push_bind(relay_id)
                        .push(" AND id IN ");
                    super::push_list(&mut q, ids.iter().copied());
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }

            fn mark_failed<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                relay_id: &'a str,
                failures: &'a [Failure],
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    if failures.is_empty() {
                        return Ok(0);
                    }
                    // The seed's write, for a whole batch: each row gets its own next retry time
                    // and reason through CASE. Rows already at their retry limit stay failed
                    // without counting further (the second pass).
                    let mut affected = 0;
                    for with_retries_left in [true, false] {
                        let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                            "UPDATE {table} SET publish_status = 3"
                        ));
                        if with_retries_left {
                            q.push(", retry_count = retry_count + 1");
                        }
                        q.push(", next_retry_time = CASE id");
                        for f in failures {
                            q.push(" WHEN ").push_bind(f.id).push(" THEN ").push_bind(f.next_retry_time);
                        }
                        q.push(" END, fail_reason = CASE id");
                        for f in failures {
                            q.push(" WHEN ").push_bind(f.id).push(" THEN ").push_bind(f.reason.as_str());
                        }
                        q.push(" END, locked_by = NULL, lock_until = NULL, update_time = ")
                            .push_bind(now)
                            .push(" WHERE deleted = 0 AND publish_status = 1 AND locked_by = ")
                            .push_bind(relay_id)
                            .push(if with_retries_left {
                                " AND retry_count < max_retry_count"
                            } else {
                                " AND retry_count >= max_retry_count"
                            })
                            .push(" AND id IN ");
                        super::push_list(&mut q, failures.iter().map(|f| f.id));
                        affected += q.build().execute(pool).await?.rows_affected();
                    }
                    Ok(affected)
                }
            }

            fn cancel_exhausted<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                ids: &'a [i64],
                reason: &'a str,
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    if ids.is_empty() {
                        return Ok(0);
                    }
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "UPDATE {table} SET publish_status = 4, fail_reason = "
                    ));
                    q.push_bind(reason)
                        .push(", update_time = ")
                        .push_bind(now)
                        .push(" WHERE deleted = 0 AND publish_status = 3 AND retry_count >= max_retry_count AND id IN ");
                    super::push_list(&mut q, ids.iter().copied());
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }

            fn recover_expired<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                now: DateTime<Utc>,
                retry_at: DateTime<Utc>,
                reason: &'a str,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "UPDATE {table} SET publish_status = 3, retry_count = retry_count + 1, next_retry_time = "
                    ));
                    q.push_bind(retry_at)
                        .push(", fail_reason = ")
                        .push_bind(reason)
                        .push(", locked_by = NULL, lock_until = NULL, update_time = ")
                        .push_bind(now)
                        .push(" WHERE deleted = 0 AND publish_status = 1 AND lock_until <= ")
                        .push_bind(now);
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }

            fn select<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                select: &'a Select<'a>,
            ) -> impl Future<Output = Result<Vec<OutboxRecord>, sqlx::Error>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "SELECT {} FROM {table} WHERE ",
                        super::COLUMNS
                    ));
                    match select {
                        Select::Pending { limit } => {
                            q.push("deleted = 0 AND publish_status = 0 ORDER BY create_time ASC, id ASC LIMIT ")
                                .push_bind(*limit);
                        }
                        Select::DueRetries { now, limit } => {
                            q.push("deleted = 0 AND publish_status = 3 AND retry_count < max_retry_count AND next_retry_time <= ")
                                .push_bind(*now)
                                .push(" ORDER BY next_retry_time ASC LIMIT ")
                                .push_bind(*limit);
                        }
                        Select::LeaseExpired { now, limit } => {
                            q.push("deleted = 0 AND publish_status = 1 AND lock_until <= ")
                                .push_bind(*now)
                                .push(" ORDER BY lock_until ASC LIMIT ")
                                .push_bind(*limit);
                        }
                        Select::ByAggregate { aggregate_type, aggregate_id } => {
                            q.push("deleted = 0 AND aggregate_type = ")
                                .push_bind(*aggregate_type)
                                .push(" AND aggregate_id = ")
                                .push_bind(*aggregate_id)
                                .push(" ORDER BY aggregate_sequence ASC");
                        }
                        Select::ByEventNo { event_no } => {
                            q.push("event_no = ").push_bind(*event_no);
                        }
                        Select::FailedByTopic { topic, limit } => {
                            q.push("deleted = 0 AND topic = ")
                                .push_bind(*topic)
                                .push(" AND publish_status = 3 ORDER BY update_time DESC LIMIT ")
                                .push_bind(*limit);
                        }
                        Select::ManyFailures { min_retries, limit } => {
                            q.push("deleted = 0 AND publish_status = 3 AND retry_count >= ")
                                .push_bind(*min_retries)
                                .push(" ORDER BY update_time DESC LIMIT ")
                                .push_bind(*limit);
                        }
                        Select::Published { aggregate, event_type, from, to, after_id, limit } => {
                            q.push("deleted = 0 AND publish_status = 2 AND id > ").push_bind(*after_id);
                            if let Some((aggregate_type, aggregate_id)) = aggregate {
                                q.push(" AND aggregate_type = ")
                                    .push_bind(*aggregate_type)
                                    .push(" AND aggregate_id = ")
                                    .push_bind(*aggregate_id);
                            }
                            if let Some(event_type) = event_type {
                                q.push(" AND event_type = ").push_bind(*event_type);
                            }
                            if let Some(from) = from {
                                q.push(" AND create_time >= ").push_bind(*from);
                            }
                            if let Some(to) = to {
                                q.push(" AND create_time < ").push_bind(*to);
                            }
                            q.push(" ORDER BY id ASC LIMIT ").push_bind(*limit);
                        }
                        Select::Head { aggregate_type, aggregate_id } => {
                            q.push("deleted = 0 AND publish_status IN (0, 3) AND aggregate_type = ")
                                .push_bind(*aggregate_type)
                                .push(" AND aggregate_id = ")
                                .push_bind(*aggregate_id)
                                .push(" ORDER BY aggregate_sequence ASC LIMIT 1");
                        }
                    }
                    let rows = q.build().fetch_all(pool).await?;
                    rows.iter().map(decode_record).collect()
                }
            }

            fn status_counts<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                status_column: &'static str,
                event_type: Option<&'a str>,
                from: DateTime<Utc>,
                to: DateTime<Utc>,
            ) -> impl Future<Output = Result<Vec<(EventStatus, i64)>, sqlx::Error>> + Send + 'a {
                async move {
                    use sqlx::Row;
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "SELECT {status_column}, COUNT(*) AS total_count FROM {table} WHERE deleted = 0"
                    ));
                    if let Some(event_type) = event_type {
                        q.push(" AND event_type = ").push_bind(event_type);
                    }
                    q.push(" AND create_time >= ")
                        .push_bind(from)
                        .push(" AND create_time < ")
                        .push_bind(to)
                        .push(format!(" GROUP BY {status_column} ORDER BY {status_column} ASC"));
                    let mut counts = Vec::new();
                    for row in q.build().fetch_all(pool).await? {
                        let status: $status = row.try_get(0)?;
                        counts.push((status_of(i64::from(status))?, row.try_get::<i64, _>(1)?));
                    }
                    Ok(counts)
                }
            }

            fn cancel<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                id: i64,
                reason: &'a str,
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "UPDATE {table} SET publish_status = 4, fail_reason = "
                    ));
                    q.push_bind(reason)
                        .push(", locked_by = NULL, lock_until = NULL, update_time = ")
                        .push_bind(now)
                        .push(" WHERE id = ")
                        .push_bind(id)
                        .push(" AND deleted = 0 AND publish_status IN (0, 3)");
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }

            fn insert_consumed<'a>(
                conn: &'a mut <$db as sqlx::Database>::Connection,
                table: &'a TableName,
                consumer: &'a str,
                envelope: &'a event_core::EventEnvelope,
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {table} (consumer, event_id, consumed_time, aggregate_type, aggregate_id, aggregate_sequence) VALUES ("
                    ));
                    let mut v = q.separated(", ");
                    v.push_bind(consumer)
                        .push_bind(envelope.event_id.as_str())
                        .push_bind(now)
                        .push_bind(envelope.aggregate_type.as_str())
                        .push_bind(envelope.aggregate_id.as_str())
                        .push_bind(i64::try_from(envelope.aggregate_sequence).unwrap_or(i64::MAX));
                    q.push(")");
                    // Seed 003's inbox write (never INSERT IGNORE, which also swallows other
                    // errors). sqlx connects to MySQL with CLIENT_FOUND_ROWS, under which an
                    // unchanged duplicate also reports one row: the duplicate bumps `deliveries`
                    // so that it reports two. The caller rolls a duplicate back.
                    if Self::DIALECT == Dialect::MySql {
                        q.push(" ON DUPLICATE KEY UPDATE deliveries = deliveries + 1");
                    } else {
                        q.push(" ON CONFLICT (consumer, event_id) DO NOTHING");
                    }
                    Ok(q.build().execute(&mut *conn).await?.rows_affected() == 1)
                }
            }

            fn notify_commit<'a>(
                conn: &'a mut <$db as sqlx::Database>::Connection,
                channel: &'a str,
            ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a {
                async move {
                    if Self::DIALECT == Dialect::Postgres {
                        let mut q = sqlx::QueryBuilder::<$db>::new("SELECT pg_notify(");
                        q.push_bind(channel).push(", '')");
                        q.build().execute(&mut *conn).await?;
                    }
                    Ok(())
                }
            }

            fn last_applied_sequence<'a>(
                conn: &'a mut <$db as sqlx::Database>::Connection,
                table: &'a TableName,
                consumer: &'a str,
                envelope: &'a event_core::EventEnvelope,
            ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a {
                async move {
                    use sqlx::Row;
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "SELECT MAX(aggregate_sequence) FROM {table} WHERE consumer = "
                    ));
                    q.push_bind(consumer)
                        .push(" AND aggregate_type = ")
                        .push_bind(envelope.aggregate_type.as_str())
                        .push(" AND aggregate_id = ")
                        .push_bind(envelope.aggregate_id.as_str())
                        .push(" AND event_id <> ")
                        .push_bind(envelope.event_id.as_str());
                    q.build().fetch_one(&mut *conn).await?.try_get::<Option<i64>, _>(0)
                }
            }

            fn quarantine_upsert<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                e: &'a crate::consumer::NewQuarantine,
            ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {table} (consumer, consumer_version, event_id, event_type, body, \
                         failure_class, reason, retry_count, owner, status, first_failure_time, last_failure_time) VALUES ("
                    ));
                    let mut v = q.separated(", ");
                    v.push_bind(e.consumer.as_str())
                        .push_bind(e.consumer_version.as_str())
                        .push_bind(e.event_id.as_str())
                        .push_bind(e.event_type.as_deref())
                        .push_bind(e.body.as_str())
                        .push_bind(e.failure_class)
                        .push_bind(e.reason.as_str())
                        .push_bind(e.retry_count)
                        .push_bind(e.owner.as_deref())
                        .push_bind(0_i16)
                        .push_bind(e.now)
                        .push_bind(e.now);
                    q.push(")");
                    // Failing again: count it, keep the first failure time, quarantine again.
                    if Self::DIALECT == Dialect::MySql {
                        q.push(" ON DUPLICATE KEY UPDATE retry_count = retry_count + VALUES(retry_count), \
                            reason = VALUES(reason), failure_class = VALUES(failure_class), \
                            consumer_version = VALUES(consumer_version), body = VALUES(body), \
                            last_failure_time = VALUES(last_failure_time), status = 0");
                    } else {
                        q.push(format!(" ON CONFLICT (consumer, event_id) DO UPDATE SET \
                            retry_count = {table}.retry_count + excluded.retry_count, reason = excluded.reason, \
                            failure_class = excluded.failure_class, consumer_version = excluded.consumer_version, \
                            body = excluded.body, last_failure_time = excluded.last_failure_time, status = 0"));
                    }
                    q.build().execute(pool).await?;
                    Ok(())
                }
            }

            fn quarantine_select<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                consumer: &'a str,
                status: i16,
                limit: i64,
            ) -> impl Future<Output = Result<Vec<crate::consumer::QuarantineRecord>, sqlx::Error>> + Send + 'a {
                async move {
                    use sqlx::Row;
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "SELECT id, consumer, consumer_version, event_id, event_type, body, failure_class, reason, \
                         retry_count, owner, status, first_failure_time, last_failure_time, replay_time \
                         FROM {table} WHERE consumer = "
                    ));
                    q.push_bind(consumer)
                        .push(" AND status = ")
                        .push_bind(status)
                        .push(" ORDER BY first_failure_time ASC, id ASC LIMIT ")
                        .push_bind(limit);
                    let mut out = Vec::new();
                    for row in q.build().fetch_all(pool).await? {
                        let id: $id = row.try_get("id")?;
                        let status: $status = row.try_get("status")?;
                        out.push(crate::consumer::QuarantineRecord {
                            id: i64::try_from(id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                            consumer: row.try_get("consumer")?,
                            consumer_version: row.try_get("consumer_version")?,
                            event_id: row.try_get("event_id")?,
                            event_type: row.try_get("event_type")?,
                            body: row.try_get("body")?,
                            failure_class: row.try_get("failure_class")?,
                            reason: row.try_get("reason")?,
                            retry_count: row.try_get("retry_count")?,
                            owner: row.try_get("owner")?,
                            replayed: i64::from(status) == 2,
                            first_failure_time: row.try_get("first_failure_time")?,
                            last_failure_time: row.try_get("last_failure_time")?,
                            replay_time: row.try_get("replay_time")?,
                        });
                    }
                    Ok(out)
                }
            }

            fn quarantine_mark_replayed<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                id: i64,
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!("UPDATE {table} SET status = 2, replay_time = "));
                    q.push_bind(now).push(" WHERE id = ").push_bind(id).push(" AND status = 0");
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }

            fn prune_consumed<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                older_than: DateTime<Utc>,
                limit: i64,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    // One bounded batch: short locks, however large the backlog.
                    let mut q = sqlx::QueryBuilder::<$db>::new("");
                    match Self::DIALECT {
                        Dialect::MySql => {
                            q.push(format!("DELETE FROM {table} WHERE consumed_time < "));
                            q.push_bind(older_than).push(" LIMIT ").push_bind(limit);
                        }
                        Dialect::Postgres => {
                            q.push(format!("DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE consumed_time < "));
                            q.push_bind(older_than).push(" LIMIT ").push_bind(limit).push(")");
                        }
                        Dialect::Sqlite => {
                            q.push(format!("DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE consumed_time < "));
                            q.push_bind(older_than).push(" LIMIT ").push_bind(limit).push(")");
                        }
                    }
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }

            fn retry<'a>(
                pool: &'a Pool<$db>,
                table: &'a TableName,
                id: i64,
                now: DateTime<Utc>,
            ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                async move {
                    // Failed -> Pending: one more round of attempts, due now.
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "UPDATE {table} SET publish_status = 0, next_retry_time = NULL, update_time = "
                    ));
                    q.push_bind(now)
                        .push(" WHERE id = ")
                        .push_bind(id)
                        .push(" AND deleted = 0 AND publish_status = 3");
                    Ok(q.build().execute(pool).await?.rows_affected())
                }
            }
        }

        fn decode_record(row: &<$db as sqlx::Database>::Row) -> Result<OutboxRecord, sqlx::Error> {
            use sqlx::Row;
            let id: $id = row.try_get("id")?;
            let status: $status = row.try_get("publish_status")?;
            let payload: sqlx::types::Json<serde_json::Value> = row.try_get("event_payload")?;
            let headers: Option<sqlx::types::Json<serde_json::Value>> =
                row.try_get("event_headers")?;
            Ok(OutboxRecord {
                id: i64::try_from(id).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                event_no: row.try_get("event_no")?,
                aggregate_type: row.try_get("aggregate_type")?,
                aggregate_id: row.try_get("aggregate_id")?,
                aggregate_sequence: row.try_get("aggregate_sequence")?,
                event_type: row.try_get("event_type")?,
                event_version: row.try_get("event_version")?,
                event_source: row.try_get("event_source")?,
                publish_channel: row.try_get("publish_channel")?,
                topic: row.try_get("topic")?,
                routing_key: row.try_get("routing_key")?,
                event_payload: payload.0,
                event_headers: headers.map(|h| h.0),
                publish_status: status_of(i64::from(status))?,
                retry_count: row.try_get("retry_count")?,
                max_retry_count: row.try_get("max_retry_count")?,
                next_retry_time: row.try_get("next_retry_time")?,
                locked_by: row.try_get("locked_by")?,
                lock_until: row.try_get("lock_until")?,
                last_publish_time: row.try_get("last_publish_time")?,
                published_time: row.try_get("published_time")?,
                fail_reason: row.try_get("fail_reason")?,
                trace_id: row.try_get("trace_id")?,
                remark: row.try_get("remark")?,
                version: row.try_get("version")?,
                create_time: row.try_get("create_time")?,
                update_time: row.try_get("update_time")?,
            })
        }
        }
    };
}

/// A stored status code, or a decode error naming the bad value.
pub(crate) fn status_of(code: i64) -> Result<crate::EventStatus, sqlx::Error> {
    crate::EventStatus::from_code(code).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}
