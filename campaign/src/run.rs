//! One campaign: private services, proxies on every link, supervised processes, the nemesis
//! playing the seed's schedule, the heal, the drain, the check.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use event_tests::proxy::{Fault as ProxyFault, FaultProxy};
use tokio::sync::Mutex;

use crate::check::{self, Truth};
use crate::pair::{Broker, Db, Pair, QUEUE, STREAM, TOPIC};
use crate::schedule::{self, Fault, Link, LinkMode, Role, Scheduled, Shape};
use crate::services::{self, Service};
use crate::supervisor::{Spec, Supervised};

/// The lease of `eventctl relay`'s defaults, which the relays run with.
const LEASE: Duration = Duration::from_secs(15);

/// What fixes a run's schedule: the pair, the seed, the load's length and the faults in it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PlanArgs {
    /// The database and broker.
    #[arg(long, value_enum)]
    pair: Pair,
    /// The seed of the fault schedule.
    #[arg(long)]
    seed: u64,
    /// How long the producers commit events, in seconds; faults happen inside it.
    #[arg(long, default_value_t = 60)]
    load: u64,
    /// How many faults.
    #[arg(long, default_value_t = 12)]
    faults: usize,
}

impl PlanArgs {
    /// The seed's schedule.
    fn schedule(&self) -> Vec<Scheduled> {
        schedule::generate(
            self.seed,
            Duration::from_secs(self.load),
            self.faults,
            shape(self.pair),
        )
    }
}

/// `event-campaign run`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    plan: PlanArgs,
    /// Events a second, per producer.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Aggregates each producer writes to.
    #[arg(long, default_value_t = 1000)]
    aggregates: u64,
    /// The drain after healing must end within this many seconds.
    #[arg(long, default_value_t = 60)]
    drain_limit: u64,
    /// Where the services' data and every process's log go (default: a new directory under
    /// the system's temporary directory, removed after a passing run).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The `eventctl` binary (default: the one next to this binary).
    #[arg(long)]
    eventctl: Option<PathBuf>,
    /// Where a failing run appends its replay line.
    #[arg(long)]
    failing_seeds: Option<PathBuf>,
    /// Keep the directory after a passing run too.
    #[arg(long)]
    keep: bool,
    /// PostgreSQL pairs: migrate the outbox in the lean index profile
    /// (`IndexProfile::Lean`), whose claims keep each aggregate's order without the partial
    /// index of unpublished events.
    #[arg(long)]
    lean: bool,
    /// How many times an operator cancels the newest pending event that follows another in its
    /// aggregate (`eventctl outbox cancel`), evenly spread over the load.
    #[arg(long, default_value_t = 4)]
    cancels: usize,
}

/// `event-campaign schedule`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ScheduleArgs {
    #[command(flatten)]
    plan: PlanArgs,
}

const PRODUCERS: usize = 2;
const RELAYS: usize = 3;
const CONSUMERS: usize = 2;

fn shape(pair: Pair) -> Shape {
    Shape {
        producers: PRODUCERS,
        relays: RELAYS,
        consumers: CONSUMERS,
        lease: LEASE,
        broker_crashes: pair.broker().survives_crash(),
    }
}

pub(crate) fn print_schedule(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    for s in &args.plan.schedule() {
        println!("t={:>6.1}s  {}", s.at.as_secs_f64(), s.fault);
    }
    Ok(ExitCode::SUCCESS)
}

/// The replay line of a run.
fn replay_line(args: &RunArgs) -> String {
    format!(
        "--pair {} --seed {} --load {} --faults {} --rate {} --aggregates {} --cancels {}{}",
        args.plan.pair.name(),
        args.plan.seed,
        args.plan.load,
        args.plan.faults,
        args.rate,
        args.aggregates,
        args.cancels,
        if args.lean { " --lean" } else { "" }
    )
}

/// Everything a run holds.
struct World {
    pair: Pair,
    db: Arc<Mutex<Service>>,
    broker: Arc<Mutex<Service>>,
    truth: Truth,
    /// The broker's URL, through its proxy.
    broker_url: String,
    /// The database's URL, not through a proxy: the operator's.
    db_url: String,
    eventctl: PathBuf,
    proxies: BTreeMap<&'static str, FaultProxy>,
    processes: BTreeMap<(Role, usize), Supervised>,
}

impl World {
    fn proxy(&self, link: Link) -> &FaultProxy {
        &self.proxies[link.name()]
    }

    fn process(&self, role: Role, i: usize) -> Option<&Supervised> {
        self.processes.get(&(role, i))
    }
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let load = Duration::from_secs(args.plan.load);
    let plan = args.plan.schedule();
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!(
            "event-campaign-{}-{}-{}",
            args.plan.pair.name(),
            args.plan.seed,
            std::process::id()
        )),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let eventctl = match &args.eventctl {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("eventctl"))
            .context("no directory for this binary")?,
    };
    if !eventctl.exists() {
        bail!(
            "no eventctl at {}: build it (`cargo build -p event-cli`) or pass --eventctl",
            eventctl.display()
        );
    }
    let me = std::env::current_exe()?;

    println!(
        "campaign {}: replay with `event-campaign run {}`",
        args.plan.pair.name(),
        replay_line(&args)
    );
    println!(
        "  {PRODUCERS} producers at {} events/s each on {} aggregates each, {RELAYS} eventctl relays (default lease {} s), {CONSUMERS} consumers (batch 1, and batch 20 in 3 lanes), {} s of load, {} faults; directory {}",
        args.rate,
        args.aggregates,
        LEASE.as_secs(),
        args.plan.load,
        plan.len(),
        dir.display()
    );
    println!("  schedule:");
    for s in &plan {
        println!("    t={:>6.1}s  {}", s.at.as_secs_f64(), s.fault);
    }

    let mut world = set_up(&args, &dir, &eventctl, &me).await?;
    let setup = started.elapsed();
    println!(
        "  services and processes up in {:.1} s",
        setup.as_secs_f64()
    );

    // The load, with the nemesis.
    let load_start = tokio::time::Instant::now();
    let world_ref = &world;
    let nemesis = async {
        use futures_util::StreamExt;
        // Per kind of fault: how many were played, and how many of those did not take effect.
        let mut tally: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
        let mut running = futures_util::stream::FuturesUnordered::new();
        let missed = |tally: &mut BTreeMap<&'static str, (usize, usize)>,
                      kind: Option<&'static str>| {
            if let Some(kind) = kind {
                tally.entry(kind).or_default().1 += 1;
            }
        };
        for s in &plan {
            let until = load_start + s.at;
            // The faults in play go on while the next one waits for its time.
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => break,
                    Some(kind) = running.next(), if !running.is_empty() => missed(&mut tally, kind),
                }
            }
            println!(
                "  t={:>6.1}s  {}",
                load_start.elapsed().as_secs_f64(),
                s.fault
            );
            tally.entry(s.fault.kind()).or_default().0 += 1;
            running.push(apply(world_ref, *s));
        }
        while let Some(kind) = running.next().await {
            missed(&mut tally, kind);
        }
        tally
    };
    let progress = async {
        let mut longest_stall = Duration::ZERO;
        let mut last_published = -1;
        let mut since = tokio::time::Instant::now();
        let mut next_report = Duration::from_secs(10);
        while load_start.elapsed() < load {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Ok(progress) = world_ref.truth.progress().await {
                let check::Progress {
                    total,
                    published,
                    cancelled,
                    applied,
                } = progress;
                if published != last_published || progress.settled() {
                    last_published = published;
                    since = tokio::time::Instant::now();
                } else {
                    longest_stall = longest_stall.max(since.elapsed());
                }
                if load_start.elapsed() >= next_report {
                    next_report += Duration::from_secs(10);
                    println!(
                        "  t={:>6.1}s  committed {total}, published {published}, cancelled {cancelled}, applied {applied}",
                        load_start.elapsed().as_secs_f64()
                    );
                }
            }
        }
        longest_stall
    };
    let operator = operate(world_ref, load_start, load, args.cancels);
    let (tally, longest_stall, cancelled) = tokio::join!(nemesis, progress, operator);
    tokio::time::sleep_until(load_start + load).await;

    // Heal: every link passes, every process runs, the services are up; the producers stop.
    for proxy in world.proxies.values() {
        proxy.set(ProxyFault::Pass);
    }
    for process in world.processes.values() {
        process.signal("CONT");
    }
    for i in 0..PRODUCERS {
        if let Some(producer) = world.processes.remove(&(Role::Producer, i)) {
            producer.stop(Duration::from_secs(10)).await;
        }
    }
    let healed = Instant::now();
    println!(
        "  healed at t={:.1}s; draining",
        load_start.elapsed().as_secs_f64()
    );
    let drain_deadline = Duration::from_secs(args.drain_limit.max(1) * 3);
    let mut drained = None;
    while healed.elapsed() < drain_deadline {
        if let Ok(progress) = world.truth.progress().await
            && progress.drained()
        {
            drained = Some(healed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let restarts: BTreeMap<String, usize> = world
        .processes
        .values()
        .map(|p| (p.name.clone(), p.starts().saturating_sub(1)))
        .collect();
    for (_, process) in std::mem::take(&mut world.processes) {
        process.stop(Duration::from_secs(10)).await;
    }

    let acked: Vec<PathBuf> = (0..PRODUCERS)
        .map(|i| dir.join(format!("producer-{i}.acked")))
        .collect();
    let mut findings = check::check(&world.truth, &acked).await?;
    if !findings.lost.is_empty() && world.pair.broker() == Broker::Kafka {
        match crate::audit::kafka(
            &world.broker_url,
            TOPIC,
            crate::pair::CONSUMER,
            &findings.lost,
        )
        .await
        {
            Ok(lines) => findings.figures.extend(lines),
            Err(e) => findings
                .figures
                .push(format!("could not audit the topic: {e:#}")),
        }
    }
    match drained {
        Some(took) if took <= Duration::from_secs(args.drain_limit) => {
            findings
                .figures
                .push(format!("drained {:.1} s after healing", took.as_secs_f64()));
        }
        Some(took) => findings.failures.push(format!(
            "the drain took {:.1} s after healing, over the {} s limit",
            took.as_secs_f64(),
            args.drain_limit
        )),
        None => findings.failures.push(format!(
            "not drained {} s after healing",
            drain_deadline.as_secs()
        )),
    }
    findings.figures.push(format!(
        "longest time the published count stood still during the load: {:.1} s",
        longest_stall.as_secs_f64()
    ));
    findings.figures.push(format!(
        "operator: {cancelled} of {} cancels took effect (eventctl outbox cancel)",
        args.cancels
    ));
    let faults: Vec<String> = tally
        .iter()
        .map(|(k, (n, missed))| match missed {
            0 => format!("{n} {k}"),
            m => format!("{n} {k} ({m} did not take effect)"),
        })
        .collect();
    findings
        .figures
        .push(format!("faults: {}", faults.join(", ")));
    let restarted: Vec<String> = restarts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(p, n)| format!("{p} x{n}"))
        .collect();
    findings.figures.push(format!(
        "restarts: {}",
        if restarted.is_empty() {
            "none".to_owned()
        } else {
            restarted.join(", ")
        }
    ));

    world.db.lock().await.stop().await;
    world.broker.lock().await.stop().await;

    println!(
        "campaign {} seed {}:",
        args.plan.pair.name(),
        args.plan.seed
    );
    for figure in &findings.figures {
        println!("  {figure}");
    }
    println!("  took {:.1} s in all", started.elapsed().as_secs_f64());
    if findings.failures.is_empty() {
        println!(
            "  PASS: 0 lost, 0 duplicate effects, 0 effects of uncommitted events, 0 order violations, every event published or cancelled"
        );
        if !args.keep && args.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Ok(ExitCode::SUCCESS);
    }
    for failure in &findings.failures {
        println!("  FAIL: {failure}");
    }
    println!("  logs and data kept in {}", dir.display());
    if let Some(file) = &args.failing_seeds {
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)?;
        writeln!(out, "{}", replay_line(&args))?;
        println!("  replay line appended to {}", file.display());
    }
    Ok(ExitCode::from(1))
}

async fn set_up(args: &RunArgs, dir: &Path, eventctl: &Path, me: &Path) -> anyhow::Result<World> {
    let pair = args.plan.pair;
    let db = services::start_db(pair.db(), dir).await?;
    let db_url = pair.db().url(db.port);
    let truth = Truth::connect(pair.db(), &db_url).await?;
    truth
        .execute(crate::roles::effects_ddl(pair.db() == Db::MariaDb))
        .await?;
    let mut config = crate::roles::outbox_config();
    if args.lean {
        config = config.index_profile(event_sqlx::IndexProfile::Lean);
    }
    match &truth {
        Truth::Postgres(pool) => {
            event_sqlx::Outbox::new(pool.clone(), config)
                .migrate()
                .await
        }
        Truth::MariaDb(pool) => {
            event_sqlx::Outbox::new(pool.clone(), config)
                .migrate()
                .await
        }
    }
    .context("cannot migrate the event tables")?;
    let mut proxies = BTreeMap::new();
    for link in [Link::ProducerDb, Link::RelayDb, Link::ConsumerDb] {
        let target = std::net::SocketAddr::from(([127, 0, 0, 1], db.port));
        proxies.insert(link.name(), FaultProxy::start(target).await?);
    }
    let broker_port = services::free_port()?;
    let broker_proxy =
        FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], broker_port))).await?;
    let broker = services::start_broker(
        pair.broker(),
        dir,
        broker_proxy.address().port(),
        broker_port,
    )
    .await?;
    let broker_url = pair.broker().url(broker_proxy.address().port());
    proxies.insert(Link::Broker.name(), broker_proxy);
    set_up_topology(pair.broker(), &broker_url).await?;

    let via = |link: Link| pair.db().url(proxies[link.name()].address().port());
    let mut processes = BTreeMap::new();
    let relay_target: Vec<String> = match pair.broker() {
        Broker::Jetstream => vec![format!("--stream={STREAM}"), format!("--subject={TOPIC}.>")],
        Broker::Rabbitmq => vec![format!("--exchange={TOPIC}")],
        Broker::Kafka => vec![format!("--topic={TOPIC}"), "--partitions=3".into()],
    };
    let publisher = match pair.broker() {
        Broker::Kafka => format!("kafka://{broker_url}"),
        _ => broker_url.clone(),
    };
    for i in 0..RELAYS {
        let mut relay_args = vec![
            "relay".to_owned(),
            format!("--database-url={}", via(Link::RelayDb)),
            format!("--publisher={publisher}"),
            format!("--instance-id=relay-{i}"),
            "--batch-size=100".into(),
        ];
        relay_args.extend(relay_target.iter().cloned());
        processes.insert(
            (Role::Relay, i),
            Supervised::start(Spec {
                name: format!("relay-{i}"),
                program: eventctl.to_owned(),
                args: relay_args,
                log: dir.join(format!("relay-{i}.log")),
            }),
        );
    }
    for i in 0..CONSUMERS {
        let broker_name = match pair.broker() {
            Broker::Jetstream => "jetstream",
            Broker::Rabbitmq => "rabbitmq",
            Broker::Kafka => "kafka",
        };
        processes.insert(
            (Role::Consumer, i),
            Supervised::start(Spec {
                name: format!("consumer-{i}"),
                program: me.to_owned(),
                args: vec![
                    "consumer".into(),
                    format!("--db={}", via(Link::ConsumerDb)),
                    format!("--broker={broker_name}"),
                    format!("--broker-url={broker_url}"),
                    format!("--batch={}", if i == 0 { 1 } else { 20 }),
                    // The batching consumer applies each batch in three lanes at once.
                    format!("--concurrency={}", if i == 0 { 1 } else { 3 }),
                    format!("--process=consumer-{i}"),
                ],
                log: dir.join(format!("consumer-{i}.log")),
            }),
        );
    }
    for i in 0..PRODUCERS {
        processes.insert(
            (Role::Producer, i),
            Supervised::start(Spec {
                name: format!("producer-{i}"),
                program: me.to_owned(),
                args: vec![
                    "producer".into(),
                    format!("--db={}", via(Link::ProducerDb)),
                    format!("--id=p{i}"),
                    format!("--rate={}", args.rate),
                    format!("--aggregates={}", args.aggregates),
                    format!(
                        "--acked={}",
                        dir.join(format!("producer-{i}.acked")).display()
                    ),
                ],
                log: dir.join(format!("producer-{i}.log")),
            }),
        );
    }
    Ok(World {
        pair,
        db: Arc::new(Mutex::new(db)),
        broker: Arc::new(Mutex::new(broker)),
        truth,
        broker_url,
        db_url,
        eventctl: eventctl.to_owned(),
        proxies,
        processes,
    })
}

/// The operator: `cancels` times, evenly spread over the load, cancels the newest pending event
/// that follows another of its aggregate and was never tried (see
/// [`Truth::newest_pending_follower`]) with `eventctl outbox cancel`, as someone would by hand;
/// a few tries each, since relays claim new events within milliseconds. Returns how many were
/// cancelled.
async fn operate(
    world: &World,
    load_start: tokio::time::Instant,
    load: Duration,
    cancels: usize,
) -> usize {
    let mut cancelled = 0;
    for k in 1..=cancels {
        let at = load.mul_f64(k as f64 / (cancels + 1) as f64);
        tokio::time::sleep_until(load_start + at).await;
        for _ in 0..20 {
            let Ok(Some(event_no)) = world.truth.newest_pending_follower().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let cancel = tokio::process::Command::new(&world.eventctl)
                .args([
                    "outbox",
                    "cancel",
                    "--connect-timeout",
                    "2s",
                    "--database-url",
                ])
                .arg(&world.db_url)
                .args(["--reason", "cancelled by the campaign's operator"])
                .arg(&event_no)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
            let _ = tokio::time::timeout(Duration::from_secs(10), cancel).await;
            if world.truth.is_cancelled(&event_no).await.unwrap_or(false) {
                println!(
                    "  t={:>6.1}s  operator: eventctl outbox cancel {event_no}",
                    load_start.elapsed().as_secs_f64()
                );
                cancelled += 1;
                break;
            }
        }
    }
    cancelled
}

/// The stream, exchange and queue, or topic, before anything runs.
async fn set_up_topology(broker: Broker, url: &str) -> anyhow::Result<()> {
    match broker {
        Broker::Jetstream => {
            let nats = event_sqlx::NatsPublisher::connect(url).await?;
            nats.ensure_stream(STREAM, vec![format!("{TOPIC}.>")])
                .await?;
        }
        Broker::Rabbitmq => {
            let rabbit = event_sqlx::RabbitMqPublisher::connect(url).await?;
            rabbit.declare_exchange(TOPIC).await?;
            let _queue =
                event_sqlx::RabbitMqSubscription::bind(&rabbit, TOPIC, QUEUE, "order.*").await?;
        }
        Broker::Kafka => {
            let kafka = event_sqlx::KafkaPublisher::connect(url).await?;
            kafka.ensure_topic(TOPIC, 3).await?;
            start_group_at_zero(url, TOPIC, crate::pair::CONSUMER, 3).await?;
        }
    }
    Ok(())
}

/// Commits offset 0 for every partition of `topic` in the consumers' group `group`, as an operator
/// creating the group would, so that no consumer ever asks the broker for a partition's earliest
/// offset. Tansu 0.6.0 answers that with the record batch stored first in time, not the one at
/// the lowest offset: when relays write one partition at once, a batch can be stored after the
/// batch at the next offsets, and a consumer starting then begins past it, for good (the likely
/// cause of one run whose relay's whole first batch reached no consumer). A Kafka broker answers
/// with the partition's first offset.
async fn start_group_at_zero(
    url: &str,
    topic: &str,
    group: &str,
    partitions: i32,
) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    let mut offsets = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        offsets.add_partition_offset(topic, p, rdkafka::Offset::Offset(0))?;
    }
    let (url, group) = (url.to_owned(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        let group: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &url)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()?;
        group.commit(&offsets, CommitMode::Sync)
    })
    .await?
    .context("cannot commit the consumers' group's starting offsets")
}

/// Plays one fault and heals it when its time is up. Returns the fault's kind when it did not
/// take effect (the database it was to act on was down, say), so that the run reports it.
async fn apply(world: &World, scheduled: Scheduled) -> Option<&'static str> {
    match scheduled.fault {
        Fault::Kill(role, i) => {
            let Some(p) = world.process(role, i) else {
                return Some(scheduled.fault.kind());
            };
            p.signal("KILL");
        }
        Fault::Pause(role, i, d) => {
            let Some(p) = world.process(role, i) else {
                return Some(scheduled.fault.kind());
            };
            p.signal("STOP");
            tokio::time::sleep(d).await;
            p.signal("CONT");
        }
        Fault::Link(link, mode, d) => {
            let proxy = world.proxy(link);
            proxy.set(match mode {
                LinkMode::Blackhole => ProxyFault::Blackhole,
                LinkMode::Cut => ProxyFault::Cut,
                LinkMode::Delay(delay) => ProxyFault::Delay(delay),
            });
            tokio::time::sleep(d).await;
            proxy.set(ProxyFault::Pass);
        }
        Fault::TerminateConnections => match world.truth.terminate_connections().await {
            Ok(ended) => println!("    ended {ended} connections"),
            Err(e) => {
                println!("    (could not terminate connections: {e:#})");
                return Some(scheduled.fault.kind());
            }
        },
        Fault::CrashDb(d) => {
            let mut db = world.db.lock().await;
            db.crash().await;
            tokio::time::sleep(d).await;
            if let Err(e) = db.restart().await {
                println!("    the database did not restart: {e:#}");
            }
        }
        Fault::CrashBroker(d) => {
            let mut broker = world.broker.lock().await;
            broker.crash().await;
            tokio::time::sleep(d).await;
            if let Err(e) = broker.restart().await {
                println!("    the broker did not restart: {e:#}");
            }
        }
    }
    let _ = world.pair;
    None
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    /// The consumers' group starts with offset 0 committed on every partition, so that no
    /// consumer asks the broker for a partition's earliest offset.
    #[tokio::test]
    async fn the_kafka_group_starts_committed_at_offset_zero_on_every_partition() {
        let Some(publisher) = event_tests::any_broker::kafka().await else {
            return;
        };
        let url = event_tests::db::kafka_url();
        let topic = event_tests::db::unique("start");
        let group = event_tests::db::unique("start_group");
        publisher.ensure_topic(&topic, 3).await.unwrap();
        super::start_group_at_zero(&url, &topic, &group, 3)
            .await
            .unwrap();

        let mut partitions = TopicPartitionList::new();
        for p in 0..3 {
            partitions.add_partition(&topic, p);
        }
        let reader: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &url)
            .set("group.id", &group)
            .create()
            .unwrap();
        let committed = reader
            .committed_offsets(partitions, std::time::Duration::from_secs(10))
            .unwrap();
        let offsets: Vec<(i32, Offset)> = committed
            .elements()
            .iter()
            .map(|e| (e.partition(), e.offset()))
            .collect();
        assert_eq!(
            offsets,
            vec![
                (0, Offset::Offset(0)),
                (1, Offset::Offset(0)),
                (2, Offset::Offset(0))
            ]
        );
    }
}
