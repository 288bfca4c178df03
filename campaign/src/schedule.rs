//! The nemesis' schedule: faults at times, generated from a seed before the run, so that a
//! seed always gives the same schedule and a failing seed replays it.

use std::fmt;
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// A link through a fault proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// Producers to the database.
    ProducerDb,
    /// Relays to the database.
    RelayDb,
    /// Consumers to the database.
    ConsumerDb,
    /// Relays and consumers to the broker.
    Broker,
}

impl Link {
    pub(crate) const ALL: [Link; 4] = [
        Link::ProducerDb,
        Link::RelayDb,
        Link::ConsumerDb,
        Link::Broker,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Link::ProducerDb => "producer->db",
            Link::RelayDb => "relay->db",
            Link::ConsumerDb => "consumer->db",
            Link::Broker => "broker",
        }
    }
}

/// What a link fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkMode {
    Blackhole,
    Cut,
    Delay(Duration),
}

/// A kind of process the nemesis kills and pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Role {
    Producer,
    Relay,
    Consumer,
}

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Relay => "relay",
            Role::Consumer => "consumer",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// SIGKILL; the supervisor starts it again.
    Kill(Role, usize),
    /// SIGSTOP for the duration, then SIGCONT (a relay: past its lease).
    Pause(Role, usize, Duration),
    /// A fault on a link for the duration.
    Link(Link, LinkMode, Duration),
    /// Every client connection of the database ended by the server (`pg_terminate_backend`,
    /// `KILL`).
    TerminateConnections,
    /// The database killed (SIGKILL) and started again after the duration.
    CrashDb(Duration),
    /// The broker killed (SIGKILL) and started again after the duration.
    CrashBroker(Duration),
}

impl Fault {
    /// The fault's kind, for the tally.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Fault::Kill(Role::Producer, _) => "kill producer",
            Fault::Kill(Role::Relay, _) => "kill relay",
            Fault::Kill(Role::Consumer, _) => "kill consumer",
            Fault::Pause(Role::Relay, ..) => "pause relay past its lease",
            Fault::Pause(..) => "pause consumer",
            Fault::Link(_, LinkMode::Blackhole, _) => "blackhole link",
            Fault::Link(_, LinkMode::Cut, _) => "cut link",
            Fault::Link(_, LinkMode::Delay(_), _) => "delay link",
            Fault::TerminateConnections => "terminate db connections",
            Fault::CrashDb(_) => "crash-restart db",
            Fault::CrashBroker(_) => "crash-restart broker",
        }
    }

    /// How long the fault lasts.
    pub(crate) fn duration(&self) -> Duration {
        match self {
            Fault::Kill(..) | Fault::TerminateConnections => Duration::from_secs(1),
            Fault::Pause(_, _, d)
            | Fault::Link(_, _, d)
            | Fault::CrashDb(d)
            | Fault::CrashBroker(d) => *d,
        }
    }

    /// What the fault holds while it lasts: no two faults hold one thing at once.
    fn target(&self) -> String {
        match self {
            Fault::Kill(role, i) | Fault::Pause(role, i, _) => format!("{}-{i}", role.name()),
            Fault::Link(link, ..) => link.name().to_owned(),
            Fault::TerminateConnections | Fault::CrashDb(_) => "db".to_owned(),
            Fault::CrashBroker(_) => "broker".to_owned(),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: &Duration| format!("{:.1}s", d.as_secs_f64());
        match self {
            Fault::Kill(role, i) => write!(f, "kill -9 {}-{i}", role.name()),
            Fault::Pause(role, i, d) => write!(f, "SIGSTOP {}-{i} for {}", role.name(), secs(d)),
            Fault::Link(link, LinkMode::Blackhole, d) => {
                write!(f, "blackhole {} for {}", link.name(), secs(d))
            }
            Fault::Link(link, LinkMode::Cut, d) => write!(f, "cut {} for {}", link.name(), secs(d)),
            Fault::Link(link, LinkMode::Delay(delay), d) => write!(
                f,
                "delay {} by {} ms for {}",
                link.name(),
                delay.as_millis(),
                secs(d)
            ),
            Fault::TerminateConnections => write!(f, "terminate every db connection"),
            Fault::CrashDb(d) => write!(f, "kill -9 the db, restart after {}", secs(d)),
            Fault::CrashBroker(d) => write!(f, "kill -9 the broker, restart after {}", secs(d)),
        }
    }
}

/// A fault and when it starts, from the start of the load.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scheduled {
    pub(crate) at: Duration,
    pub(crate) fault: Fault,
}

/// How many processes of each role run, and what the broker survives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) producers: usize,
    pub(crate) relays: usize,
    pub(crate) consumers: usize,
    /// The relays' lease: a paused relay stays stopped past it.
    pub(crate) lease: Duration,
    pub(crate) broker_crashes: bool,
}

/// `faults` faults spread over `load`, from `seed`. The last one starts early enough to end
/// before the load does.
pub(crate) fn generate(seed: u64, load: Duration, faults: usize, shape: Shape) -> Vec<Scheduled> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut below = |n: u64| if n == 0 { 0 } else { rng.next_u64() % n };
    let mut schedule: Vec<Scheduled> = Vec::with_capacity(faults);
    if faults == 0 {
        return schedule;
    }
    let window = load
        .saturating_sub(Duration::from_secs(5))
        .max(Duration::from_secs(1));
    let mut busy: Vec<(String, Duration)> = Vec::new();
    for n in 0..faults {
        // Evenly spread, with a random offset inside each slot.
        let slot = window.as_millis() as u64 / faults as u64;
        let at = Duration::from_millis(slot * n as u64 + below(slot.max(1)));
        let ms = |lo: u64, hi: u64, below: &mut dyn FnMut(u64) -> u64| {
            Duration::from_millis(lo + below(hi - lo))
        };
        let mut chosen = None;
        for _ in 0..20 {
            let fault = match below(16) {
                0 | 1 => Fault::Kill(Role::Relay, below(shape.relays as u64) as usize),
                2 => Fault::Pause(
                    Role::Relay,
                    below(shape.relays as u64) as usize,
                    shape.lease + ms(1_000, 6_000, &mut below),
                ),
                3 | 4 => Fault::Kill(Role::Consumer, below(shape.consumers as u64) as usize),
                5 => Fault::Pause(
                    Role::Consumer,
                    below(shape.consumers as u64) as usize,
                    ms(1_000, 8_000, &mut below),
                ),
                6 => Fault::Kill(Role::Producer, below(shape.producers as u64) as usize),
                7..=11 => {
                    let link = Link::ALL[below(Link::ALL.len() as u64) as usize];
                    let mode = match below(3) {
                        0 => LinkMode::Blackhole,
                        1 => LinkMode::Cut,
                        _ => LinkMode::Delay(ms(20, 400, &mut below)),
                    };
                    Fault::Link(link, mode, ms(1_000, 6_000, &mut below))
                }
                12 => Fault::TerminateConnections,
                13 => Fault::CrashDb(ms(500, 4_000, &mut below)),
                _ if shape.broker_crashes => Fault::CrashBroker(ms(500, 4_000, &mut below)),
                _ => Fault::TerminateConnections,
            };
            let end = at + fault.duration();
            if end > load {
                continue;
            }
            let target = fault.target();
            if busy.iter().any(|(t, until)| *t == target && *until > at) {
                continue;
            }
            busy.retain(|(t, _)| *t != target);
            busy.push((target, end + Duration::from_millis(500)));
            chosen = Some(fault);
            break;
        }
        if let Some(fault) = chosen {
            schedule.push(Scheduled { at, fault });
        }
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: Shape = Shape {
        producers: 2,
        relays: 3,
        consumers: 2,
        lease: Duration::from_secs(15),
        broker_crashes: true,
    };

    #[test]
    fn a_seed_always_gives_the_same_schedule() {
        let a = generate(7, Duration::from_secs(120), 40, SHAPE);
        let b = generate(7, Duration::from_secs(120), 40, SHAPE);
        let c = generate(8, Duration::from_secs(120), 40, SHAPE);
        let show = |s: &[Scheduled]| -> Vec<String> {
            s.iter()
                .map(|f| format!("{:?} {}", f.at, f.fault))
                .collect()
        };
        assert_eq!(show(&a), show(&b));
        assert_ne!(show(&a), show(&c));
    }

    #[test]
    fn faults_end_inside_the_load_and_never_overlap_on_one_target() {
        let load = Duration::from_secs(60);
        let schedule = generate(3, load, 30, SHAPE);
        assert!(schedule.len() >= 25, "{} faults", schedule.len());
        for (i, a) in schedule.iter().enumerate() {
            assert!(a.at + a.fault.duration() <= load, "{}", a.fault);
            for b in &schedule[i + 1..] {
                if a.fault.target() == b.fault.target() {
                    assert!(
                        b.at >= a.at + a.fault.duration(),
                        "{} and {} overlap",
                        a.fault,
                        b.fault
                    );
                }
            }
        }
    }

    #[test]
    fn a_broker_that_loses_its_data_is_never_crashed() {
        let shape = Shape {
            broker_crashes: false,
            ..SHAPE
        };
        let schedule = generate(11, Duration::from_secs(300), 200, shape);
        assert!(
            schedule
                .iter()
                .all(|s| !matches!(s.fault, Fault::CrashBroker(_)))
        );
    }
}
