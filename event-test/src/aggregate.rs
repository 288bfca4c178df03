//! Given / when / then on one aggregate, without a database.

use std::fmt::{Debug, Display};
use std::path::PathBuf;

use event_core::{Aggregate, EventContext, EventEnvelope, RecordedEvents, UnitOfWork};

use crate::check::{PayloadChecks, default_snapshot_dir, under_crate};
use crate::expect::{Expected, compare, envelope_json};

/// A test of one aggregate: the state it starts from, a command, what it recorded.
///
/// Each command runs on the aggregate as the service runs it; its events are collected by a
/// [`UnitOfWork`] with the test's [`EventContext`], as the repository collects them, so the
/// test sees the envelopes that would be stored: event numbers, sequences, headers. Every
/// recorded payload makes a serde round trip and is validated against its event's derived
/// schema and, when one is committed (`schemas/<EVENT_TYPE>/v<N>.json`, or
/// `EVENT_SNAPSHOT_DIR`), its snapshot; a payload they do not describe fails the test.
///
/// `when` borrows the test, so the test goes on from the state the command left.
///
/// ```
/// use event_core::{Aggregate, DomainEvent, RecordError, RecordedEvents};
/// use event_test::{AggregateTest, Expected};
///
/// #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema, DomainEvent)]
/// #[domain_event(aggregate = "ORDER", event_no = "ORDER_PAID:{order_id}")]
/// struct OrderPaid { #[domain_event(aggregate_id)] order_id: String, amount_minor: i64 }
///
/// #[derive(Aggregate)]
/// #[aggregate(type = "ORDER")]
/// struct Order { #[aggregate(id)] id: String, paid: bool, events: RecordedEvents }
/// impl Order {
///     fn pay(&mut self, amount_minor: i64) -> Result<(), RecordError> {
///         if self.paid { return Ok(()); }
///         self.paid = true;
///         self.record(OrderPaid { order_id: self.id.clone(), amount_minor })
///     }
/// }
///
/// // Loaded at version 1: its next event is sequence 2.
/// let mut test = AggregateTest::new(Order { id: "o-1".into(), paid: false, events: RecordedEvents::loaded_at(1) });
/// test.when(|order| order.pay(1999))
///     .then_ok()
///     .then_events([Expected::event(OrderPaid { order_id: "o-1".into(), amount_minor: 1999 })
///         .event_no("ORDER_PAID:o-1")
///         .sequence(2)]);
/// // Paying again records nothing.
/// test.when(|order| order.pay(1999)).then_no_events();
/// assert!(test.aggregate().paid);
/// ```
pub struct AggregateTest<A: Aggregate> {
    aggregate: A,
    context: EventContext,
    checks: PayloadChecks,
    history: Vec<EventEnvelope>,
}

impl<A: Aggregate> AggregateTest<A> {
    /// A test of `aggregate` as it is (loaded at the version its [`RecordedEvents`] says), whose
    /// events carry the context `EventContext::new("test")`. Snapshots are read from
    /// `schemas` under the crate being tested, or `EVENT_SNAPSHOT_DIR`. Events the aggregate
    /// recorded before the test (a constructor that records) are collected by the first
    /// `given` or `when`.
    pub fn new(aggregate: A) -> AggregateTest<A> {
        AggregateTest {
            aggregate,
            context: EventContext::new("test"),
            checks: PayloadChecks::new(Some(default_snapshot_dir())),
            history: Vec::new(),
        }
    }

    /// The context the events of the next commands carry: source, tenant, correlation,
    /// causation, trace, headers, time.
    pub fn context(mut self, context: EventContext) -> Self {
        self.context = context;
        self
    }

    /// Reads the committed schema snapshots from `dir` (relative to the crate being tested)
    /// instead of `schemas`.
    pub fn snapshots(mut self, dir: impl Into<PathBuf>) -> Self {
        self.checks = PayloadChecks::new(Some(under_crate(dir.into())));
        self
    }

    /// Sets the context of the next commands, mid-test.
    pub fn set_context(&mut self, context: EventContext) -> &mut Self {
        self.context = context;
        self
    }

    /// Runs `command` to reach a starting state (the events that led to it), and keeps what it
    /// recorded as the aggregate's history. Panics, at the caller, if it fails or records a
    /// payload its schema does not describe.
    #[track_caller]
    pub fn given<T, Er: Debug>(
        &mut self,
        command: impl FnOnce(&mut A) -> Result<T, Er>,
    ) -> &mut Self {
        let then = self.when(command);
        if let Err(e) = &then.result {
            panic!("the given command failed: {e:?}");
        }
        then.report_problems();
        drop(then);
        self
    }

    /// Runs `command` on the aggregate and collects what it recorded.
    ///
    /// When the command fails, what it recorded is discarded, as a rolled-back transaction
    /// would, and the aggregate's version is left where it was; [`Then::events`] still shows
    /// it.
    #[track_caller]
    pub fn when<T, Er>(
        &mut self,
        command: impl FnOnce(&mut A) -> Result<T, Er>,
    ) -> Then<'_, A, T, Er> {
        let version = self.aggregate.recorded_events().version();
        let result = command(&mut self.aggregate);
        self.collect(version, result)
    }

    /// [`AggregateTest::when`] for an async command.
    pub async fn when_async<T, Er>(
        &mut self,
        command: impl AsyncFnOnce(&mut A) -> Result<T, Er>,
    ) -> Then<'_, A, T, Er> {
        let version = self.aggregate.recorded_events().version();
        let result = command(&mut self.aggregate).await;
        self.collect(version, result)
    }

    fn collect<T, Er>(&mut self, version: u64, result: Result<T, Er>) -> Then<'_, A, T, Er> {
        let mut uow = UnitOfWork::new(self.context.clone());
        let (events, mut problems) = match uow.collect(&mut self.aggregate) {
            Ok(_) => (uow.commit(), Vec::new()),
            Err(e) => (
                Vec::new(),
                vec![format!("the unit of work refused the recorded events: {e}")],
            ),
        };
        for envelope in &events {
            problems.extend(self.checks.problems(envelope));
        }
        if result.is_err() {
            // Rolled back: nothing recorded, the version unchanged.
            *self.aggregate.recorded_events() = RecordedEvents::loaded_at(version);
        } else {
            self.history.extend(events.iter().cloned());
        }
        Then {
            test: self,
            result,
            events,
            problems,
            reported: std::cell::Cell::new(false),
        }
    }

    /// The aggregate.
    pub fn aggregate(&self) -> &A {
        &self.aggregate
    }

    /// The aggregate, to change it between commands.
    pub fn aggregate_mut(&mut self) -> &mut A {
        &mut self.aggregate
    }

    /// The aggregate's version: the sequence of its last event.
    pub fn version(&mut self) -> u64 {
        self.aggregate.recorded_events().version()
    }

    /// Every event the given and successful commands recorded, in order.
    pub fn history(&self) -> &[EventEnvelope] {
        &self.history
    }

    /// The aggregate, ending the test.
    pub fn into_aggregate(self) -> A {
        self.aggregate
    }
}

/// What a command did: its result and the envelopes it recorded. Its assertions panic at the
/// test's line with what was expected and what happened.
///
/// A payload that fails its checks (round trip, schema, snapshot) fails the first assertion,
/// or, if none is made, the end of the statement.
pub struct Then<'t, A: Aggregate, T, Er> {
    test: &'t mut AggregateTest<A>,
    result: Result<T, Er>,
    events: Vec<EventEnvelope>,
    problems: Vec<String>,
    reported: std::cell::Cell<bool>,
}

impl<A: Aggregate, T, Er> Then<'_, A, T, Er> {
    /// The envelopes the command recorded, in order (also those discarded because it failed).
    pub fn events(&self) -> &[EventEnvelope] {
        &self.events
    }

    /// The command's result.
    pub fn result(&self) -> &Result<T, Er> {
        &self.result
    }

    /// The aggregate after the command.
    pub fn aggregate(&self) -> &A {
        &self.test.aggregate
    }

    #[track_caller]
    fn report_problems(&self) {
        self.reported.set(true);
        if !self.problems.is_empty() {
            panic!(
                "recorded events fail their checks:\n  {}",
                self.problems.join("\n  ")
            );
        }
    }

    /// Asserts the recorded events, in order and in number.
    #[track_caller]
    pub fn then_events(&self, expected: impl IntoIterator<Item = Expected>) -> &Self {
        self.report_problems();
        let expected: Vec<Expected> = expected.into_iter().collect();
        if let Some(report) = compare(&expected, &self.events) {
            panic!("the command recorded other events than expected: {report}");
        }
        self
    }

    /// Asserts the types of the recorded events, in order.
    #[track_caller]
    pub fn then_types(&self, expected: &[&str]) -> &Self {
        self.report_problems();
        let types: Vec<&str> = self.events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(
            types, expected,
            "the command recorded other event types than expected"
        );
        self
    }

    /// Asserts that the command recorded nothing.
    #[track_caller]
    pub fn then_no_events(&self) -> &Self {
        self.report_problems();
        if !self.events.is_empty() {
            let shown: Vec<_> = self.events.iter().map(envelope_json).collect();
            panic!(
                "expected no events, the command recorded {}:\n{}",
                self.events.len(),
                crate::check::pretty(&serde_json::Value::Array(shown))
            );
        }
        self
    }
}

impl<A: Aggregate, T, Er: Debug> Then<'_, A, T, Er> {
    /// Asserts that the command succeeded.
    #[track_caller]
    pub fn then_ok(&self) -> &Self {
        self.report_problems();
        if let Err(e) = &self.result {
            panic!("expected the command to succeed, it failed: {e:?}");
        }
        self
    }

    /// Asserts that the command failed with an error `matches` accepts.
    #[track_caller]
    pub fn then_error(&self, matches: impl FnOnce(&Er) -> bool) -> &Self {
        self.report_problems();
        match &self.result {
            Ok(_) => panic!(
                "expected the command to fail, it succeeded and recorded {} event(s)",
                self.events.len()
            ),
            Err(e) if matches(e) => self,
            Err(e) => panic!("the command failed with another error than expected: {e:?}"),
        }
    }

    /// Asserts that the command failed with an error equal to `expected`.
    #[track_caller]
    pub fn then_error_eq(&self, expected: &Er) -> &Self
    where
        Er: PartialEq,
    {
        self.report_problems();
        match &self.result {
            Ok(_) => panic!("expected the command to fail with {expected:?}, it succeeded"),
            Err(e) if e == expected => self,
            Err(e) => {
                panic!("expected the command to fail with {expected:?}, it failed with {e:?}")
            }
        }
    }

    /// Asserts that the command failed with an error whose message contains `text`.
    #[track_caller]
    pub fn then_error_contains(&self, text: &str) -> &Self
    where
        Er: Display,
    {
        self.report_problems();
        match &self.result {
            Ok(_) => panic!("expected the command to fail with \"{text}\", it succeeded"),
            Err(e) if e.to_string().contains(text) => self,
            Err(e) => {
                panic!("expected an error containing \"{text}\", the command failed with: {e}")
            }
        }
    }

    /// The command's value; panics if it failed.
    #[track_caller]
    pub fn value(&self) -> &T {
        self.report_problems();
        match &self.result {
            Ok(value) => value,
            Err(e) => panic!("expected the command to succeed, it failed: {e:?}"),
        }
    }
}

impl<A: Aggregate, T, Er> Drop for Then<'_, A, T, Er> {
    fn drop(&mut self) {
        if !self.reported.get() && !self.problems.is_empty() && !std::thread::panicking() {
            panic!(
                "recorded events fail their checks:\n  {}",
                self.problems.join("\n  ")
            );
        }
    }
}
