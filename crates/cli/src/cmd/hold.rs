//! `tensorwire hold` (hidden, for benchmarks and the connection-limit
//! tests): opens N connections to an agent and keeps them open and idle for
//! a while, so the agent's cost per idle client can be measured and its
//! limits tried.
//!
//! By default each connection is a whole session (Hello, one Ping and one
//! empty request through `identity`, then silence). `--no-hello` opens bare
//! connections that never say anything, as a hostile local process would
//! (for `shm://`, the control socket). `--keep-going` counts refusals
//! instead of stopping at the first, and `--bind` picks the TCP source
//! address (the identity per-peer limits count TCP peers by).

use super::{connect, CmdError, TokenArg};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use transport::Endpoint;

/// Arguments of `hold`.
#[derive(clap::Args)]
pub struct Args {
    /// The agent.
    #[arg(long)]
    connect: String,
    /// Connections to open.
    #[arg(long, default_value_t = 10)]
    clients: usize,
    /// Seconds to hold them idle (at most 3600).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Open bare connections that never send a Hello.
    #[arg(long)]
    no_hello: bool,
    /// Count connections the agent refuses (`limit-exceeded`) instead of
    /// stopping at the first; other errors still stop it.
    #[arg(long)]
    keep_going: bool,
    /// TCP only: the local address to connect from (e.g. 127.0.0.2).
    #[arg(long)]
    bind: Option<IpAddr>,
    #[command(flatten)]
    token: TokenArg,
}

/// Something held open.
enum Held {
    /// Kept only to keep it open.
    Session {
        _open: Box<super::Connection>,
    },
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// Opens the connections, prints `holding N refused M`, sleeps, closes them.
pub fn run(a: Args) -> Result<(), CmdError> {
    if a.clients == 0 || a.clients > 100_000 || a.seconds > 3600 {
        return Err("--clients must be 1..=100000 and --seconds at most 3600".into());
    }
    let ep = Endpoint::parse(&a.connect)?;
    if a.bind.is_some() && !matches!(ep, Endpoint::Tcp { .. } | Endpoint::Tls { .. }) {
        return Err("--bind applies to tcp:// endpoints only".into());
    }
    if a.bind.is_some() && !a.no_hello {
        return Err("--bind needs --no-hello (sessions connect from the default address)".into());
    }
    let mut held = Vec::with_capacity(a.clients);
    let mut refused = 0usize;
    let mut first_refusal = None;
    for _ in 0..a.clients {
        let opened = if a.no_hello {
            bare(&ep, a.bind)
        } else {
            session(&a.connect, &a.token)
        };
        match opened {
            Ok(h) => held.push(h),
            // Only the agent's refusals are counted: anything else (this
            // process out of descriptors, say) is not the agent's answer.
            Err(e) if a.keep_going && e.to_string().contains("limit-exceeded") => {
                refused += 1;
                first_refusal.get_or_insert_with(|| e.to_string());
            }
            Err(e) => return Err(e),
        }
    }
    if a.no_hello {
        // A refused bare connection is only seen as the agent's Error and
        // close, which the loop above could not wait for: look now.
        std::thread::sleep(Duration::from_millis(200));
        let before = held.len();
        held.retain(|h| !refused_now(h));
        refused += before - held.len();
    }
    println!("holding {} refused {refused}", held.len());
    if let Some(e) = first_refusal {
        println!("first refusal: {e}");
    }
    std::io::stdout().flush()?;
    let until = Instant::now() + Duration::from_secs(a.seconds);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(held);
    Ok(())
}

fn session(uri: &str, token: &TokenArg) -> Result<Held, CmdError> {
    let c = connect(uri, &[], token.apply(Default::default()))?;
    c.client.ping()?;
    c.client.model(engine::IdentityBackend::NAME)?.infer(&[])?;
    Ok(Held::Session { _open: Box::new(c) })
}

fn bare(ep: &Endpoint, bind: Option<IpAddr>) -> Result<Held, CmdError> {
    Ok(match ep {
        Endpoint::Unix(path) => Held::Unix(UnixStream::connect(path)?),
        Endpoint::Shm(name) => {
            Held::Unix(UnixStream::connect(transport::shm::control_path(name)?)?)
        }
        // A bare connection to a tls:// listener never starts its handshake.
        Endpoint::Tcp { addr, .. } | Endpoint::Tls { addr, .. } => {
            let to: SocketAddr = addr
                .parse()
                .map_err(|e| format!("--no-hello needs a numeric tcp address, not {addr}: {e}"))?;
            match bind {
                None => Held::Tcp(TcpStream::connect(to)?),
                Some(ip) => {
                    use socket2::{Domain, Socket, Type};
                    let s = Socket::new(Domain::for_address(to), Type::STREAM, None)?;
                    s.bind(&SocketAddr::new(ip, 0).into())?;
                    s.connect(&to.into())?;
                    Held::Tcp(s.into())
                }
            }
        }
        Endpoint::Inproc(_) => return Err("hold needs an agent in another process".into()),
        Endpoint::Vsock { .. } => {
            return Err("--no-hello holds unix, shm, tcp and tls connections, not vsock".into())
        }
    })
}

/// True when the agent already closed this bare connection (a refusal:
/// an Error message and end of stream, or a reset). Called after a pause
/// that lets the agent's answers arrive.
fn refused_now(h: &Held) -> bool {
    use rustix::net::{recv, RecvFlags};
    use std::os::fd::AsFd;
    let peek = |fd: std::os::fd::BorrowedFd<'_>| {
        let mut b = [0u8; 1];
        !matches!(
            recv(fd, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT),
            Err(rustix::io::Errno::AGAIN)
        )
    };
    match h {
        Held::Session { .. } => false,
        Held::Unix(s) => peek(s.as_fd()),
        Held::Tcp(s) => peek(s.as_fd()),
    }
}
