//! Where `eventctl relay` and `eventctl reconcile --republish` publish: one publisher type for
//! every target, chosen from the command line.

use anyhow::Context;
use clap::Args;
use event_sqlx::{
    JsonLinesPublisher, KafkaPublisher, NatsPublisher, OutboxMessage, PublishError, Publisher,
    RabbitMqPublisher, WireFormat,
};

/// The target and its broker options.
#[derive(Debug, Clone, Args)]
pub(crate) struct TargetArgs {
    /// NATS: create this JetStream stream, capturing --subject, unless it exists.
    #[arg(long, requires = "subject")]
    pub(crate) stream: Option<String>,
    /// NATS: a subject the --stream captures, e.g. `order.event.>` (repeat for more).
    #[arg(long)]
    pub(crate) subject: Vec<String>,
    /// NATS: append the aggregate id to each subject as its last token
    /// (`<topic>.<routing key>.<aggregate id>`), the partition key a subject-mapped stream
    /// partitions on, so that order per aggregate holds within a partition.
    #[arg(long)]
    pub(crate) subject_per_aggregate: bool,
    /// RabbitMQ: declare this durable topic exchange unless it exists (repeat for more).
    #[arg(long)]
    pub(crate) exchange: Vec<String>,
    /// Kafka: create this topic unless it exists (repeat for more), with --partitions partitions.
    #[arg(long)]
    pub(crate) topic: Vec<String>,
    /// Kafka: the partitions of each --topic created.
    #[arg(long, default_value_t = 3, requires = "topic")]
    pub(crate) partitions: i32,
    /// The wire format on the broker: `envelope` (this toolkit's own JSON envelope and
    /// headers), or a CloudEvents 1.0 event in `binary` mode (attributes as `ce-`/`ce_`
    /// headers, the payload as the body) or `structured` mode (the whole event as
    /// `application/cloudevents+json`). Subscriptions read all three.
    #[arg(long, default_value = "envelope", value_name = "envelope|binary|structured", value_parser = wire_format)]
    pub(crate) format: WireFormat,
}

fn wire_format(name: &str) -> Result<WireFormat, String> {
    name.parse()
        .map_err(|e: event_sqlx::UnknownWireFormat| e.to_string())
}

/// A publisher for any target of the command line.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// JSON lines on standard output or appended to a file.
    Lines(JsonLinesPublisher),
    /// NATS JetStream.
    Nats(NatsPublisher),
    /// RabbitMQ.
    RabbitMq(RabbitMqPublisher),
    /// Kafka.
    Kafka(KafkaPublisher),
}

impl Target {
    /// Connects to `target`: `stdout`, `jsonl:PATH`, `nats://HOST:PORT`,
    /// `amqp://USER:PASS@HOST:PORT/VHOST` or `kafka://HOST:PORT[,HOST:PORT...]`, and creates the
    /// streams, exchanges and topics asked for.
    pub(crate) async fn open(target: &str, args: &TargetArgs) -> anyhow::Result<Target> {
        if let Some(bootstrap) = target.strip_prefix("kafka://") {
            if args.stream.is_some() || args.subject_per_aggregate || !args.exchange.is_empty() {
                anyhow::bail!(
                    "--stream, --subject-per-aggregate and --exchange do not go with a kafka:// publisher"
                );
            }
            let publisher = KafkaPublisher::connect(bootstrap.trim_end_matches('/'))
                .await?
                .wire_format(args.format);
            for topic in &args.topic {
                publisher.ensure_topic(topic, args.partitions).await?;
            }
            return Ok(Target::Kafka(publisher));
        }
        if !args.topic.is_empty() {
            anyhow::bail!("--topic goes with a kafka:// publisher, not {target}");
        }
        if target.starts_with("nats://") || target.starts_with("tls://") {
            if !args.exchange.is_empty() {
                anyhow::bail!("--exchange goes with an amqp:// publisher, not {target}");
            }
            let publisher = NatsPublisher::connect(target)
                .await?
                .subject_per_aggregate(args.subject_per_aggregate)
                .wire_format(args.format);
            if let Some(stream) = &args.stream {
                publisher
                    .ensure_stream(stream, args.subject.clone())
                    .await?;
            }
            return Ok(Target::Nats(publisher));
        }
        if args.stream.is_some() || args.subject_per_aggregate {
            anyhow::bail!("--stream and --subject-per-aggregate go with a nats:// publisher");
        }
        if target.starts_with("amqp://") || target.starts_with("amqps://") {
            let publisher = RabbitMqPublisher::connect(target)
                .await?
                .wire_format(args.format);
            for exchange in &args.exchange {
                publisher.declare_exchange(exchange).await?;
            }
            return Ok(Target::RabbitMq(publisher));
        }
        if !args.exchange.is_empty() {
            anyhow::bail!("--exchange goes with an amqp:// publisher");
        }
        if args.format != WireFormat::Envelope {
            anyhow::bail!(
                "--format {} goes with a broker publisher (nats://, amqp://, kafka://); {target} writes envelopes",
                args.format
            );
        }
        Ok(Target::Lines(match target {
            "stdout" => JsonLinesPublisher::stdout(),
            other => match other.strip_prefix("jsonl:") {
                Some(path) => JsonLinesPublisher::append_to(path)
                    .await
                    .with_context(|| format!("cannot open {path} for appending"))?,
                None => anyhow::bail!(
                    "unknown publisher `{other}`: use stdout, jsonl:PATH, nats://HOST:PORT, amqp://USER:PASS@HOST:PORT/VHOST or kafka://HOST:PORT"
                ),
            },
        }))
    }
}

impl Publisher for Target {
    async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
        match self {
            Target::Lines(p) => p.publish(messages).await,
            Target::Nats(p) => p.publish(messages).await,
            Target::RabbitMq(p) => p.publish(messages).await,
            Target::Kafka(p) => p.publish(messages).await,
        }
    }
}
