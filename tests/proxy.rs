//! A TCP proxy on loopback that injects faults into one link: it passes bytes, delays them,
//! holds them (a blackhole: connections stay open, nothing arrives either way), or cuts every
//! connection and refuses new ones. Tests put it between a client and a broker or database.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// `host:port` of a broker or database URL such as `nats://127.0.0.1:4222`,
/// `amqp://u:p@host:5672/%2f` or `postgres://user@host:5432/db`, resolved.
pub fn socket_of(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit('@').next().unwrap_or(rest);
    let host_port = rest.split(['/', '?']).next().unwrap_or(rest);
    use std::net::ToSocketAddrs;
    host_port
        .to_socket_addrs()
        .expect("a host:port in the URL")
        .next()
        .expect("one address")
}

/// The same URL pointed at `proxy`.
pub fn through(url: &str, proxy: SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (format!("{auth}@"), rest),
        None => (String::new(), rest),
    };
    let path = rest
        .find(['/', '?'])
        .map(|at| rest[at..].to_owned())
        .unwrap_or_default();
    format!("{scheme}://{auth}{proxy}{path}")
}

/// What the proxy does with the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass both ways.
    Pass,
    /// Connections stay open but no byte passes, either way, until the link passes again; what
    /// was held then passes.
    Blackhole,
    /// Every open connection is closed, and new ones are closed at once.
    Cut,
    /// Bytes pass both ways, each chunk this much later than it arrived.
    Delay(std::time::Duration),
}

/// A running proxy; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    address: SocketAddr,
    fault: watch::Sender<Fault>,
    accepted: Arc<Mutex<usize>>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `target`, passing, on a free loopback port.
    pub async fn start(target: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let (fault, faults) = watch::channel(Fault::Pass);
        let accepted = Arc::new(Mutex::new(0));
        let counted = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                *counted.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                let faults = faults.clone();
                tokio::spawn(async move {
                    if *faults.borrow() == Fault::Cut {
                        return;
                    }
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    link(client, server, faults).await;
                });
            }
        });
        Ok(FaultProxy {
            address,
            fault,
            accepted,
            task,
        })
    }

    /// The proxy's own address, for the client to connect to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Sets what the link does from now on.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        *self.accepted.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set(Fault::Cut);
        self.task.abort();
    }
}

/// Copies both ways between `client` and `server` under the faults, until either side closes
/// or the link is cut.
async fn link(client: TcpStream, server: TcpStream, faults: watch::Receiver<Fault>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pipe(client_read, server_write, faults.clone()) => {}
        () = pipe(server_read, client_write, faults) => {}
    }
}

/// Copies from `from` to `to`: each chunk read is held while the link is a blackhole, and the
/// copy ends (closing both halves) when the link is cut.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut faults: watch::Receiver<Fault>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            cut = faults.wait_for(|f| *f == Fault::Cut) => {
                let _ = cut;
                return;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let Ok(fault) = faults
            .wait_for(|f| *f != Fault::Blackhole)
            .await
            .map(|f| *f)
        else {
            return;
        };
        if let Fault::Delay(delay) = fault {
            tokio::time::sleep(delay).await;
        }
        if fault == Fault::Cut || to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
