//! The console's view of a database, whatever its backend: one object-safe trait, implemented
//! once over event-sqlx's stores, so the web handlers are compiled once, not once per backend.

use chrono::{DateTime, Utc};
use event_sqlx::{
    AuditEntry, AuditLog, Backend, Consumption, Error, EventStatus, GroupCount, Lease,
    MessageRecord, MessageStore, MinuteCount, NewAuditEntry, Outbox, OutboxHealth, OutboxRecord,
    OutboxSearch, Quarantine, QuarantineCount, QuarantineFilter, QuarantineRecord,
    QuarantineStatus, StatusCounts,
};
use futures_util::future::BoxFuture;

type Answer<'a, T> = BoxFuture<'a, Result<T, Error>>;

/// Which quarantine entries to read: whose, in which status, which, after which id, how many.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct QuarantineQuery<'a> {
    pub(crate) consumer: Option<&'a str>,
    pub(crate) status: Option<QuarantineStatus>,
    pub(crate) filter: QuarantineFilter<'a>,
    pub(crate) after_id: i64,
    pub(crate) limit: u32,
}

/// A search, as owned strings (from a query string).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Search {
    pub(crate) event_no: Option<String>,
    pub(crate) aggregate: Option<(String, String)>,
    pub(crate) event_type: Option<String>,
    pub(crate) topic: Option<String>,
    pub(crate) trace_id: Option<String>,
    pub(crate) status: Option<EventStatus>,
    pub(crate) from: Option<DateTime<Utc>>,
    pub(crate) to: Option<DateTime<Utc>>,
    pub(crate) before: Option<(DateTime<Utc>, i64)>,
}

impl Search {
    fn borrowed(&self) -> OutboxSearch<'_> {
        OutboxSearch {
            event_no: self.event_no.as_deref(),
            aggregate: self
                .aggregate
                .as_ref()
                .map(|(t, i)| (t.as_str(), i.as_str())),
            event_type: self.event_type.as_deref(),
            topic: self.topic.as_deref(),
            trace_id: self.trace_id.as_deref(),
            status: self.status,
            from: self.from,
            to: self.to,
            before: self.before,
        }
    }
}

/// The outbox side: the outbox, the message table and the audit trail of one database.
pub(crate) trait Store: Send + Sync {
    fn health(&self) -> Answer<'_, OutboxHealth>;
    fn live_counts(&self, since: DateTime<Utc>) -> Answer<'_, StatusCounts>;
    fn failed_counts(&self, by_topic: bool) -> Answer<'_, Vec<GroupCount>>;
    fn per_minute(&self, since: DateTime<Utc>) -> Answer<'_, Vec<MinuteCount>>;
    fn leases(&self) -> Answer<'_, Vec<Lease>>;
    fn search<'a>(&'a self, search: &'a Search, limit: u32) -> Answer<'a, Vec<OutboxRecord>>;
    fn aggregate<'a>(&'a self, kind: &'a str, id: &'a str) -> Answer<'a, Vec<OutboxRecord>>;
    fn event<'a>(&'a self, event_no: &'a str) -> Answer<'a, Option<OutboxRecord>>;
    fn retry<'a>(&'a self, event_no: &'a str) -> Answer<'a, bool>;
    fn cancel<'a>(&'a self, event_no: &'a str, reason: &'a str) -> Answer<'a, bool>;
    fn skip<'a>(
        &'a self,
        kind: &'a str,
        id: &'a str,
        reason: &'a str,
    ) -> Answer<'a, Option<String>>;
    fn message_counts(&self, since: DateTime<Utc>) -> Answer<'_, StatusCounts>;
    fn failed_messages(&self, limit: u32) -> Answer<'_, Vec<MessageRecord>>;
    fn message<'a>(&'a self, event_no: &'a str) -> Answer<'a, Option<MessageRecord>>;
    fn messages_of<'a>(&'a self, kind: &'a str, id: &'a str) -> Answer<'a, Vec<MessageRecord>>;
    fn retry_message<'a>(&'a self, event_no: &'a str) -> Answer<'a, bool>;
    fn cancel_message<'a>(&'a self, event_no: &'a str, reason: &'a str) -> Answer<'a, bool>;
    fn audit<'a>(&'a self, entry: &'a NewAuditEntry) -> Answer<'a, i64>;
    fn settle_audit<'a>(
        &'a self,
        id: i64,
        rows: &'a [String],
        outcome: &'a str,
    ) -> Answer<'a, bool>;
    fn audit_entries(&self, before_id: i64, limit: u32) -> Answer<'_, Vec<AuditEntry>>;
}

/// The consumer side: the inbox and the quarantine.
pub(crate) trait ConsumerStore: Send + Sync {
    fn quarantine_counts(&self) -> Answer<'_, Vec<QuarantineCount>>;
    fn quarantined<'a>(&'a self, page: QuarantineQuery<'a>) -> Answer<'a, Vec<QuarantineRecord>>;
    fn entry(&self, id: i64) -> Answer<'_, Option<QuarantineRecord>>;
    fn requeue<'a>(&'a self, consumer: &'a str, event_id: &'a str) -> Answer<'a, u64>;
    fn cancel_entry<'a>(&'a self, id: i64, reason: &'a str) -> Answer<'a, bool>;
    fn consumptions<'a>(&'a self, event_id: &'a str) -> Answer<'a, Vec<Consumption>>;
}

/// Every store of one database.
pub(crate) struct Stores<DB: Backend> {
    outbox: Outbox<DB>,
    messages: MessageStore<DB>,
    audit: AuditLog<DB>,
    quarantine: Quarantine<DB>,
}

impl<DB: Backend> Stores<DB> {
    pub(crate) fn new(outbox: Outbox<DB>) -> Self {
        let pool = outbox.pool().clone();
        Stores {
            messages: MessageStore::new(pool.clone()),
            audit: AuditLog::new(pool.clone()),
            quarantine: Quarantine::new(pool),
            outbox,
        }
    }
}

impl<DB: Backend> Store for Stores<DB> {
    fn health(&self) -> Answer<'_, OutboxHealth> {
        Box::pin(self.outbox.health())
    }
    fn live_counts(&self, since: DateTime<Utc>) -> Answer<'_, StatusCounts> {
        Box::pin(self.outbox.live_counts(since))
    }
    fn failed_counts(&self, by_topic: bool) -> Answer<'_, Vec<GroupCount>> {
        Box::pin(self.outbox.failed_counts(by_topic, 20))
    }
    fn per_minute(&self, since: DateTime<Utc>) -> Answer<'_, Vec<MinuteCount>> {
        Box::pin(self.outbox.per_minute(since))
    }
    fn leases(&self) -> Answer<'_, Vec<Lease>> {
        Box::pin(self.outbox.leases())
    }
    fn search<'a>(&'a self, search: &'a Search, limit: u32) -> Answer<'a, Vec<OutboxRecord>> {
        Box::pin(async move { self.outbox.search(&search.borrowed(), limit).await })
    }
    fn aggregate<'a>(&'a self, kind: &'a str, id: &'a str) -> Answer<'a, Vec<OutboxRecord>> {
        Box::pin(self.outbox.by_aggregate(kind, id))
    }
    fn event<'a>(&'a self, event_no: &'a str) -> Answer<'a, Option<OutboxRecord>> {
        Box::pin(self.outbox.by_event_no(event_no))
    }
    fn retry<'a>(&'a self, event_no: &'a str) -> Answer<'a, bool> {
        Box::pin(self.outbox.retry(event_no))
    }
    fn cancel<'a>(&'a self, event_no: &'a str, reason: &'a str) -> Answer<'a, bool> {
        Box::pin(self.outbox.cancel(event_no, reason))
    }
    fn skip<'a>(
        &'a self,
        kind: &'a str,
        id: &'a str,
        reason: &'a str,
    ) -> Answer<'a, Option<String>> {
        Box::pin(self.outbox.skip_head(kind, id, reason))
    }
    fn message_counts(&self, since: DateTime<Utc>) -> Answer<'_, StatusCounts> {
        Box::pin(self.messages.live_counts(since))
    }
    fn failed_messages(&self, limit: u32) -> Answer<'_, Vec<MessageRecord>> {
        Box::pin(self.messages.many_failures(0, limit))
    }
    fn message<'a>(&'a self, event_no: &'a str) -> Answer<'a, Option<MessageRecord>> {
        Box::pin(self.messages.by_event_no(event_no))
    }
    fn messages_of<'a>(&'a self, kind: &'a str, id: &'a str) -> Answer<'a, Vec<MessageRecord>> {
        Box::pin(self.messages.by_biz(kind, id))
    }
    fn retry_message<'a>(&'a self, event_no: &'a str) -> Answer<'a, bool> {
        Box::pin(self.messages.retry(event_no))
    }
    fn cancel_message<'a>(&'a self, event_no: &'a str, reason: &'a str) -> Answer<'a, bool> {
        Box::pin(self.messages.cancel(event_no, reason))
    }
    fn audit<'a>(&'a self, entry: &'a NewAuditEntry) -> Answer<'a, i64> {
        Box::pin(self.audit.record(entry))
    }
    fn settle_audit<'a>(
        &'a self,
        id: i64,
        rows: &'a [String],
        outcome: &'a str,
    ) -> Answer<'a, bool> {
        Box::pin(self.audit.settle(id, rows, outcome))
    }
    fn audit_entries(&self, before_id: i64, limit: u32) -> Answer<'_, Vec<AuditEntry>> {
        Box::pin(self.audit.entries(before_id, limit))
    }
}

impl<DB: Backend> ConsumerStore for Stores<DB> {
    fn quarantine_counts(&self) -> Answer<'_, Vec<QuarantineCount>> {
        Box::pin(self.quarantine.counts())
    }
    fn quarantined<'a>(&'a self, page: QuarantineQuery<'a>) -> Answer<'a, Vec<QuarantineRecord>> {
        Box::pin(async move {
            self.quarantine
                .entries(
                    page.consumer,
                    page.status,
                    &page.filter,
                    page.after_id,
                    page.limit,
                )
                .await
        })
    }
    fn entry(&self, id: i64) -> Answer<'_, Option<QuarantineRecord>> {
        Box::pin(self.quarantine.entry(id))
    }
    fn requeue<'a>(&'a self, consumer: &'a str, event_id: &'a str) -> Answer<'a, u64> {
        Box::pin(async move {
            let filter = QuarantineFilter::default().event_id(event_id);
            self.quarantine.requeue(consumer, &filter).await
        })
    }
    fn cancel_entry<'a>(&'a self, id: i64, reason: &'a str) -> Answer<'a, bool> {
        Box::pin(self.quarantine.cancel(id, reason))
    }
    fn consumptions<'a>(&'a self, event_id: &'a str) -> Answer<'a, Vec<Consumption>> {
        Box::pin(event_sqlx::consumptions(self.outbox.pool(), event_id))
    }
}
