//! The database and broker pairs a campaign runs on.

/// A database and a broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Pair {
    /// PostgreSQL and NATS JetStream.
    PgJetstream,
    /// MariaDB and RabbitMQ.
    MariadbRabbitmq,
    /// PostgreSQL and a Kafka-protocol broker (Tansu).
    PgKafka,
}

/// The database of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Db {
    Postgres,
    MariaDb,
}

/// The broker of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Broker {
    Jetstream,
    Rabbitmq,
    Kafka,
}

/// The topic (stream subjects' prefix, exchange, Kafka topic) every event goes to.
pub(crate) const TOPIC: &str = "camp";
/// The JetStream stream.
pub(crate) const STREAM: &str = "CAMP";
/// The RabbitMQ queue of the consumer.
pub(crate) const QUEUE: &str = "camp-view";
/// The consumer's name (one consumer, several processes).
pub(crate) const CONSUMER: &str = "view";

impl Pair {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pair::PgJetstream => "pg-jetstream",
            Pair::MariadbRabbitmq => "mariadb-rabbitmq",
            Pair::PgKafka => "pg-kafka",
        }
    }

    pub(crate) fn db(self) -> Db {
        match self {
            Pair::PgJetstream | Pair::PgKafka => Db::Postgres,
            Pair::MariadbRabbitmq => Db::MariaDb,
        }
    }

    pub(crate) fn broker(self) -> Broker {
        match self {
            Pair::PgJetstream => Broker::Jetstream,
            Pair::MariadbRabbitmq => Broker::Rabbitmq,
            Pair::PgKafka => Broker::Kafka,
        }
    }
}

impl Db {
    /// The URL of database `campaign` on `port`.
    pub(crate) fn url(self, port: u16) -> String {
        match self {
            Db::Postgres => format!("postgres://postgres@127.0.0.1:{port}/campaign"),
            Db::MariaDb => format!("mysql://root@127.0.0.1:{port}/campaign"),
        }
    }
}

impl Broker {
    /// The URL of the broker on `port`.
    pub(crate) fn url(self, port: u16) -> String {
        match self {
            Broker::Jetstream => format!("nats://127.0.0.1:{port}"),
            Broker::Rabbitmq => format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
            Broker::Kafka => format!("127.0.0.1:{port}"),
        }
    }

    /// Whether a crash-restart keeps the broker's data. Tansu here stores in memory: its S3
    /// storage (a local moto server) keeps data across a crash, but its consumer groups then
    /// delivered nothing in a campaign, so the Kafka pair is not crashed.
    pub(crate) fn survives_crash(self) -> bool {
        !matches!(self, Broker::Kafka)
    }
}
