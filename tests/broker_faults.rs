//! Publishers under link faults, on real NATS JetStream, RabbitMQ and a Kafka-protocol broker
//! (a Tansu of the test's own, advertising the proxy) behind a fault proxy: a batch
//! whose acknowledgements are lost fails within one deadline (not one per message), and after
//! every connection to the broker is cut, a running relay publishes again within seconds of the
//! link coming back, with no event's retry count raised by the outage; a Kafka subscription
//! dropped while its broker is silent does not hold the dropping thread, and one reading past
//! offsets that hold no record goes on.

use std::net::SocketAddr;
use std::time::Duration;

use event_sqlx::{
    Error, EventStatus, KafkaPublisher, NatsPublisher, Outbox, Publisher, RabbitMqPublisher,
    RelayConfig,
};
use event_tests::any_broker::nats;
use event_tests::any_broker::stream_for;
use event_tests::db::{TestDb, amqp_url, nats_url, reachable, unique};
use event_tests::fixtures::{Order, commit_orders, orders_to};
use event_tests::proxy::{Fault, FaultProxy, socket_of, through};
use event_tests::wait;
use lapin::options::{QueueBindOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};

/// Messages per batch in the deadline tests: with one deadline per message, as before, the batch
/// would take ten times the ack timeout.
const BATCH: usize = 10;

/// An outbox on a fresh SQLite database routing orders to `topic`.
fn outbox_on(db: &TestDb<sqlx::Sqlite>, topic: &str) -> Outbox<sqlx::Sqlite> {
    orders_to(db.pool(), topic)
}

/// Places orders `{prefix}0..count`, one event each, in one commit.
async fn place(outbox: &Outbox<sqlx::Sqlite>, prefix: &str, count: usize) {
    commit_orders(
        outbox,
        (0..count).map(|i| Order::place(&format!("{prefix}{i}"), 1).unwrap()),
    )
    .await;
}

/// Every event of orders `{prefix}0..count` is published, none was counted as failed.
async fn all_published_uncounted(
    outbox: &Outbox<sqlx::Sqlite>,
    prefix: &str,
    count: usize,
) -> Result<(), String> {
    for i in 0..count {
        let rows = outbox
            .by_aggregate("ORDER", &format!("{prefix}{i}"))
            .await
            .map_err(|e| e.to_string())?;
        for row in rows {
            if row.publish_status != EventStatus::Succeeded {
                return Err(format!(
                    "{} is {:?} ({:?})",
                    row.event_no, row.publish_status, row.fail_reason
                ));
            }
            assert_eq!(
                row.retry_count, 0,
                "{}: the outage was counted as an attempt",
                row.event_no
            );
        }
    }
    Ok(())
}

/// Some event of orders `{prefix}0..count` was given back because the broker was unavailable.
async fn some_given_back(
    outbox: &Outbox<sqlx::Sqlite>,
    prefix: &str,
    count: usize,
) -> Result<(), String> {
    for i in 0..count {
        for row in outbox
            .by_aggregate("ORDER", &format!("{prefix}{i}"))
            .await
            .map_err(|e| e.to_string())?
        {
            if row
                .fail_reason
                .as_deref()
                .is_some_and(|r| r.contains("broker unavailable"))
            {
                return Ok(());
            }
        }
    }
    Err("no event was given back yet".into())
}

/// A batch published into a blackhole fails, as an outage, within one deadline.
async fn lost_acks_fail_within_one_deadline<P: Publisher>(
    outbox: &Outbox<sqlx::Sqlite>,
    publisher: P,
    proxy: &FaultProxy,
    timeout: Duration,
) {
    place(outbox, "o-", BATCH).await;
    let relay = outbox.relay(
        publisher,
        RelayConfig::new("blackholed").batch_size(BATCH as u32),
    );
    proxy.set(Fault::Blackhole);
    let started = tokio::time::Instant::now();
    let lost = relay.run_once().await.unwrap_err();
    let took = started.elapsed();
    let Error::BrokerUnavailable {
        claimed,
        failed,
        deferred,
        ..
    } = &lost
    else {
        panic!("lost acks are an outage: {lost:?}");
    };
    assert_eq!(
        (*claimed, *deferred, *failed),
        (BATCH, BATCH, 0),
        "{lost:?}"
    );
    // One deadline for the batch, not one per message (that would be BATCH x timeout).
    assert!(
        took < timeout * 3,
        "the batch took {took:?} to fail with a {timeout:?} timeout"
    );
    proxy.set(Fault::Pass);
    wait::until(Duration::from_secs(20), async || {
        let _ = relay.run_once().await;
        all_published_uncounted(outbox, "o-", BATCH).await
    })
    .await;
}

/// A running relay rides out a cut of every connection to the broker.
async fn a_cut_link_is_ridden_out<P: Publisher + 'static>(
    outbox: &Outbox<sqlx::Sqlite>,
    publisher: P,
    proxy: &FaultProxy,
) {
    let (stop, task) = event_tests::background::relay(
        outbox.relay(publisher, RelayConfig::new("riding").batch_size(10)),
    );
    place(outbox, "before-", 20).await;
    wait::until(Duration::from_secs(20), async || {
        all_published_uncounted(outbox, "before-", 20).await
    })
    .await;
    let connections = proxy.accepted();
    proxy.set(Fault::Cut);
    place(outbox, "during-", 20).await;
    wait::until(Duration::from_secs(20), async || {
        some_given_back(outbox, "during-", 20).await
    })
    .await;
    proxy.set(Fault::Pass);
    // Within 10 s of the link coming back, everything is out, and nothing was counted.
    wait::until(Duration::from_secs(10), async || {
        all_published_uncounted(outbox, "during-", 20).await
    })
    .await;
    assert!(
        proxy.accepted() > connections,
        "the publisher connected again"
    );
    place(outbox, "after-", 5).await;
    wait::until(Duration::from_secs(10), async || {
        all_published_uncounted(outbox, "after-", 5).await
    })
    .await;
    stop.send(()).unwrap();
    let report = task.await.unwrap();
    assert_eq!(report.failed, 0, "{report:?}");
}

/// A NATS publisher through a fresh proxy, with a stream for `topic`.
async fn nats_through_proxy(
    topic: &str,
    ack_timeout: Duration,
) -> Option<(NatsPublisher, FaultProxy)> {
    let url = nats_url();
    let direct = reachable("NATS", &url, NatsPublisher::connect(&url).await)?;
    stream_for(&direct, topic).await.unwrap();
    let proxy = FaultProxy::start(socket_of(&url)).await.unwrap();
    let publisher = NatsPublisher::connect(&through(&url, proxy.address()))
        .await
        .unwrap()
        .ack_timeout(ack_timeout);
    Some((publisher, proxy))
}

/// A RabbitMQ publisher through a fresh proxy, with an exchange `topic` and a queue bound to it.
async fn rabbitmq_through_proxy(
    topic: &str,
    confirm_timeout: Duration,
) -> Option<(RabbitMqPublisher, FaultProxy)> {
    let url = amqp_url();
    let direct = reachable("RabbitMQ", &url, RabbitMqPublisher::connect(&url).await)?;
    direct.declare_exchange(topic).await.unwrap();
    let channel = direct.channel();
    channel
        .queue_declare(
            ShortString::from(topic),
            QueueDeclareOptions {
                auto_delete: false,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            ShortString::from(topic),
            ShortString::from(topic),
            ShortString::from("order.*"),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let proxy = FaultProxy::start(socket_of(&url)).await.unwrap();
    let publisher = RabbitMqPublisher::connect(&through(&url, proxy.address()))
        .await
        .unwrap()
        .confirm_timeout(confirm_timeout);
    Some((publisher, proxy))
}

/// A Kafka publisher whose every connection goes through a fresh proxy: a Tansu of the test's
/// own, telling clients to connect to the proxy, with topic `topic`. The delivery timeout is
/// `delivery_timeout`; the batch's deadline adds 2 s to it.
async fn kafka_through_proxy(
    topic: &str,
    delivery_timeout: Duration,
) -> Option<(KafkaPublisher, FaultProxy, event_tests::tansu::Process)> {
    let Some(bin) = event_tests::tansu::bin() else {
        assert!(
            !event_tests::db::services_required(),
            "no Tansu binary: run .ci/kafka-broker"
        );
        eprintln!("skipping: no Tansu binary (run .ci/kafka-broker)");
        return None;
    };
    let port = event_tests::db::free_port();
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap();
    let broker = event_tests::tansu::in_memory(&bin, port, proxy.address().port());
    let bootstrap = proxy.address().to_string();
    let ms = delivery_timeout.as_millis().to_string();
    let mut publisher = None;
    wait::until(Duration::from_secs(30), async || {
        let connected = KafkaPublisher::with_config(
            &bootstrap,
            &[("delivery.timeout.ms", &ms), ("request.timeout.ms", &ms)],
        )
        .await
        .map_err(|e| e.to_string())?;
        publisher = Some(connected);
        Ok(())
    })
    .await;
    let publisher = publisher.unwrap();
    publisher.ensure_topic(topic, 3).await.unwrap();
    Some((publisher, proxy, broker))
}

/// Deletes the test's queue and exchange.
async fn remove_rabbitmq(topic: &str) {
    let url = amqp_url();
    if let Ok(direct) = RabbitMqPublisher::connect(&url).await {
        let channel = direct.channel();
        let _ = channel
            .queue_delete(ShortString::from(topic), Default::default())
            .await;
        let _ = channel
            .exchange_delete(ShortString::from(topic), Default::default())
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_lost_acks_fail_within_one_deadline() {
    let topic = unique("acks").replace('_', "-");
    let timeout = Duration::from_secs(1);
    let Some((publisher, proxy)) = nats_through_proxy(&topic, timeout).await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    lost_acks_fail_within_one_deadline(&outbox, publisher, &proxy, timeout).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_lost_confirms_fail_within_one_deadline() {
    let topic = unique("confirms").replace('_', "-");
    let timeout = Duration::from_secs(1);
    let Some((publisher, proxy)) = rabbitmq_through_proxy(&topic, timeout).await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    lost_acks_fail_within_one_deadline(&outbox, publisher, &proxy, timeout).await;
    db.cleanup().await;
    remove_rabbitmq(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_relay_publishes_again_after_its_link_is_cut() {
    let topic = unique("cut").replace('_', "-");
    let Some((publisher, proxy)) = nats_through_proxy(&topic, Duration::from_secs(2)).await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    a_cut_link_is_ridden_out(&outbox, publisher, &proxy).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_relay_publishes_again_after_its_connection_is_cut() {
    let topic = unique("cut").replace('_', "-");
    let Some((publisher, proxy)) = rabbitmq_through_proxy(&topic, Duration::from_secs(2)).await
    else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    a_cut_link_is_ridden_out(&outbox, publisher, &proxy).await;
    db.cleanup().await;
    remove_rabbitmq(&topic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_lost_delivery_reports_fail_within_one_deadline() {
    let topic = unique("reports").replace('_', "-");
    let delivery = Duration::from_secs(1);
    let Some((publisher, proxy, _broker)) = kafka_through_proxy(&topic, delivery).await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    // The deadline is the delivery timeout plus 2 s.
    let deadline = delivery + Duration::from_secs(2);
    lost_acks_fail_within_one_deadline(&outbox, publisher, &proxy, deadline).await;
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_relay_publishes_again_after_its_connections_are_cut() {
    let topic = unique("cut").replace('_', "-");
    let Some((publisher, proxy, _broker)) =
        kafka_through_proxy(&topic, Duration::from_secs(2)).await
    else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    a_cut_link_is_ridden_out(&outbox, publisher, &proxy).await;
    db.cleanup().await;
}

/// A NATS publisher, a fresh topic named from `prefix`, and a JetStream stream capturing it.
async fn jetstream_with_stream(prefix: &str) -> Option<(NatsPublisher, String, String)> {
    let publisher = nats().await?;
    let topic = unique(prefix).replace('_', "-");
    let stream = stream_for(&publisher, &topic).await.unwrap();
    Some((publisher, topic, stream))
}

/// A JetStream message whose processing stopped the consumer (a bug) is given back at once, not
/// left for the ack wait: the next drain, with the bug fixed, applies it straight away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_gives_back_at_once_what_a_stopped_consumer_did_not_process() {
    use event_sqlx::{Consumer, Delivered, HandlerError, JetStreamSubscription};
    use event_tests::fixtures::OrderPlaced;

    let Some((publisher, topic, stream)) = jetstream_with_stream("stop").await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    place(&outbox, "o-", 1).await;
    let relay = outbox.relay(publisher.clone(), RelayConfig::new("stop-relay"));
    assert_eq!(relay.run_once().await.unwrap().published, 1);

    // An ack wait far longer than the test: only a nak brings the message back in time.
    let subscription = JetStreamSubscription::durable(
        &publisher,
        &stream,
        "stop-service",
        &format!("{topic}.>"),
        Duration::from_secs(300),
    )
    .await
    .unwrap();
    let buggy = Consumer::new(db.pool().clone(), "stop-service", "1.0.0").on(
        async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| {
            Err(HandlerError::Bug("index out of bounds".into()))
        },
    );
    let stopped = subscription
        .drain(&buggy, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        stopped.to_string().contains("stop-service stopped"),
        "{stopped}"
    );

    let fixed = Consumer::new(db.pool().clone(), "stop-service", "1.0.1")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let report = subscription
        .drain(&fixed, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(report.applied, 1, "redelivered at once: {report:?}");

    publisher.jetstream().delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

/// Messages a JetStream subscription had received but not processed when it is dropped are
/// given back at once, not left for the ack wait: the next subscription gets them straight away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_gives_back_what_a_dropped_subscription_held() {
    use event_sqlx::{Consumer, Delivered, JetStreamSubscription};
    use event_tests::fixtures::OrderPlaced;

    let Some((publisher, topic, stream)) = jetstream_with_stream("held").await else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    let consumer = Consumer::new(db.pool().clone(), "held-service", "1.0.0")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    // An ack wait far longer than the test: only a nak brings the messages back in time.
    let subscribe = async || {
        JetStreamSubscription::durable(
            &publisher,
            &stream,
            "held-service",
            &format!("{topic}.>"),
            Duration::from_secs(300),
        )
        .await
        .unwrap()
    };
    let first = subscribe().await;
    // The first drain opens the pull stream; nothing is there yet.
    let report = first
        .drain(&consumer, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(report.applied, 0);
    place(&outbox, "o-", 3).await;
    let relay = outbox.relay(publisher.clone(), RelayConfig::new("held-relay"));
    assert_eq!(relay.run_once().await.unwrap().published, 3);
    // The server delivers them to the open pull stream; no drain takes them.
    let js = publisher.jetstream();
    wait::until(Duration::from_secs(10), async || {
        let mut durable = js
            .get_stream(&stream)
            .await
            .map_err(|e| e.to_string())?
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>("held-service")
            .await
            .map_err(|e| e.to_string())?;
        let info = durable.info().await.map_err(|e| e.to_string())?;
        match info.num_ack_pending {
            3 => Ok(()),
            n => Err(format!("{n} of 3 delivered")),
        }
    })
    .await;
    drop(first);

    let second = subscribe().await;
    let mut applied = 0;
    wait::until(Duration::from_secs(10), async || {
        applied += second
            .drain(&consumer, Duration::from_millis(500))
            .await
            .map_err(|e| e.to_string())?
            .applied;
        match applied {
            3 => Ok(()),
            n => Err(format!("{n} of 3 applied")),
        }
    })
    .await;
    js.delete_stream(&stream).await.unwrap();
    db.cleanup().await;
}

/// Dropping a Kafka subscription while its broker is silent returns at once: librdkafka's
/// close waits, without a bound, for the group coordinator to answer, and that wait must not
/// hold the caller's thread (an async worker, or a test that never ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_subscription_is_dropped_at_once_while_its_broker_is_silent() {
    use event_sqlx::{Consumer, Delivered, KafkaSubscription};
    use event_tests::fixtures::OrderPlaced;

    let topic = unique("silent").replace('_', "-");
    let Some((publisher, proxy, _broker)) =
        kafka_through_proxy(&topic, Duration::from_secs(2)).await
    else {
        return;
    };
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    place(&outbox, "o-", 1).await;
    let relay = outbox.relay(publisher, RelayConfig::new("silent-relay"));
    assert_eq!(relay.run_once().await.unwrap().published, 1);
    let consumer = Consumer::new(db.pool().clone(), "silent-service", "1.0.0")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let subscription =
        KafkaSubscription::subscribe(&proxy.address().to_string(), "silent-service", &[&topic])
            .await
            .unwrap();
    // The group is joined and the event applied: closing now has a group to leave.
    let mut applied = 0;
    wait::until(Duration::from_secs(60), async || {
        applied += subscription
            .drain(&consumer, Duration::from_millis(500))
            .await
            .map_err(|e| e.to_string())?
            .applied;
        match applied {
            1 => Ok(()),
            n => Err(format!("{n} of 1 applied")),
        }
    })
    .await;

    proxy.set(Fault::Blackhole);
    let (dropped, done) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        drop(subscription);
        let _ = dropped.send(());
    });
    tokio::time::timeout(Duration::from_secs(5), done)
        .await
        .expect("the subscription was dropped within 5 s of its broker falling silent")
        .unwrap();
    proxy.set(Fault::Pass);
    db.cleanup().await;
}

/// Offsets that hold no record (here the marker a Kafka transaction leaves) do not stall a
/// Kafka subscription: it reads the partition again from the offset it expected, as it does
/// when a broker shows a batch before the one below it is stored, and once that offset has gone
/// unread for the wait it goes on, applying each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_subscription_goes_on_past_offsets_that_hold_no_record() {
    use event_core::{EventContext, UnitOfWork};
    use event_sqlx::{Consumer, Delivered, KafkaSubscription};
    use event_tests::fixtures::{OrderPlaced, bodies};
    use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

    let url = event_tests::db::kafka_url();
    let Some(publisher) = reachable("Kafka", &url, KafkaPublisher::connect(&url).await) else {
        return;
    };
    let topic = unique("markers").replace('_', "-");
    publisher.ensure_topic(&topic, 1).await.unwrap();
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    let relay = outbox.relay(publisher, RelayConfig::new("markers-relay"));
    place(&outbox, "before-", 3).await;
    assert_eq!(relay.run_once().await.unwrap().published, 3);
    // One event in a transaction: its record at offset 3, the commit marker at offset 4.
    let mut uow = UnitOfWork::new(EventContext::new("order-service"));
    uow.collect(&mut Order::place("in-transaction", 1).unwrap())
        .unwrap();
    let body = bodies(uow).remove(0);
    let transactional: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &url)
        .set("transactional.id", &topic)
        .create()
        .unwrap();
    let timeout = Duration::from_secs(10);
    transactional.init_transactions(timeout).unwrap();
    transactional.begin_transaction().unwrap();
    let record = FutureRecord::to(&topic)
        .key("in-transaction")
        .payload(&body);
    transactional.send(record, timeout).await.unwrap();
    transactional.commit_transaction(timeout).unwrap();
    place(&outbox, "after-", 3).await;
    assert_eq!(relay.run_once().await.unwrap().published, 3);

    let consumer = Consumer::new(db.pool().clone(), "markers-service", "1.0.0")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let subscription = KafkaSubscription::subscribe(&url, &unique("markers"), &[&topic])
        .await
        .unwrap();
    let mut applied = 0;
    wait::until(Duration::from_secs(60), async || {
        // Bounded: a subscription stuck reading the marker's offset again would never be idle.
        let drain = subscription.drain(&consumer, Duration::from_secs(1));
        let report = tokio::time::timeout(Duration::from_secs(20), drain)
            .await
            .map_err(|_| format!("{applied} of 7 applied, and the drain did not end in 20 s"))?
            .map_err(|e| e.to_string())?;
        assert_eq!(report.duplicates, 0, "{report:?}");
        applied += report.applied;
        match applied {
            7 => Ok(()),
            n => Err(format!("{n} of 7 applied")),
        }
    })
    .await;
    db.cleanup().await;
}

/// A running RabbitMQ subscription rides out a cut connection: `run` does not return, it opens
/// its channel (and its connection) again once the link passes, and applies what was published
/// meanwhile, each event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_subscription_consumes_again_after_its_connection_is_cut() {
    use event_sqlx::{Consumer, Delivered, RabbitMqSubscription};
    use event_tests::fixtures::OrderPlaced;

    let url = amqp_url();
    let Some(direct) = reachable("RabbitMQ", &url, RabbitMqPublisher::connect(&url).await) else {
        return;
    };
    let topic = unique("cutsub");
    direct.declare_exchange(&topic).await.unwrap();
    let proxy = FaultProxy::start(socket_of(&url)).await.unwrap();
    let subscription =
        RabbitMqSubscription::connect(&through(&url, proxy.address()), &topic, &topic, "order.*")
            .await
            .unwrap();
    let db = TestDb::sqlite().await.unwrap();
    let outbox = outbox_on(&db, &topic);
    let relay = outbox.relay(direct.clone(), RelayConfig::new("cutsub-relay"));
    let consumer = Consumer::new(db.pool().clone(), "cutsub-service", "1.0.0")
        .on(async |_tx: &mut sqlx::SqliteConnection, _placed: Delivered<OrderPlaced>| Ok(()));
    let consumed = async |expected: i64| {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM consumed_event")
            .fetch_one(db.pool())
            .await
            .map_err(|e| e.to_string())?;
        if n == expected {
            Ok(())
        } else {
            Err(format!("{n} of {expected} consumed"))
        }
    };

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = subscription.run(&consumer, async {
        let _ = stopped.await;
    });
    tokio::pin!(run);
    let scenario = async {
        place(&outbox, "before-", 5).await;
        assert_eq!(relay.run_once().await.unwrap().published, 5);
        wait::until(Duration::from_secs(20), async || consumed(5).await).await;

        let connections = proxy.accepted();
        proxy.set(Fault::Cut);
        place(&outbox, "during-", 5).await;
        assert_eq!(relay.run_once().await.unwrap().published, 5);
        // The subscription tried to connect again while the link was cut.
        wait::until(Duration::from_secs(20), async || {
            if proxy.accepted() > connections {
                Ok(())
            } else {
                Err("no new connection tried yet".to_owned())
            }
        })
        .await;
        proxy.set(Fault::Pass);
        wait::until(Duration::from_secs(20), async || consumed(10).await).await;

        place(&outbox, "after-", 5).await;
        assert_eq!(relay.run_once().await.unwrap().published, 5);
        wait::until(Duration::from_secs(20), async || consumed(15).await).await;
    };
    tokio::select! {
        ended = &mut run => panic!("the subscription stopped at the cut: {ended:?}"),
        () = scenario => {}
    }
    stop.send(()).unwrap();
    let report = run.await.unwrap();
    assert_eq!(report.applied, 15, "each event applied once: {report:?}");

    remove_rabbitmq(&topic).await;
    db.cleanup().await;
}
