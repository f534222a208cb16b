//! A TCP proxy that sits between the code under test and PostgreSQL, MySQL, Redis, RabbitMQ or
//! an HTTP server and injects one fault at a chosen point: it cuts the connection before a statement reaches
//! the server, cuts it after the server did the work but before the reply reaches the client,
//! or stalls it.
//!
//! A point is chosen by the bytes the client writes: a [`Rule`] matches a client write that
//! contains every one of its needles (a statement's SQL text, a script's arguments) and acts on
//! its `nth` match, counted over every connection through the proxy. On PostgreSQL the fault
//! applies to the first write of that connection, from the matching one on, that executes
//! something (an `Execute` or a simple `Query` message): sqlx sends a statement's text in a
//! `Parse` and runs it in a later `Bind`/`Execute` write. On MySQL likewise the first command that
//! executes (`COM_STMT_EXECUTE` or `COM_QUERY`): with its statement cache off, sqlx sends a
//! statement's text in a `COM_STMT_PREPARE` and runs it by statement id in the next write, and
//! a transaction's `BEGIN`, `COMMIT` and `ROLLBACK` as `COM_QUERY`. On Redis, RabbitMQ and HTTP
//! it applies to the matching write itself.
//!
//! Rules can be added while traffic flows; each fires once. [`Proxy::fired`] says how many did,
//! so a test can check that its fault was really injected. On Redis, [`Proxy::commands`] counts
//! the commands clients sent through it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the proxy does at the chosen point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Closes the connection; the write never reaches the server.
    CutBefore,
    /// Forwards the write, waits for the server's reply, and closes the connection without
    /// relaying it: the server did the work (committed), the client never hears of it.
    CutAfterReply,
    /// Holds the write this long, then forwards it.
    Stall(Duration),
}

/// The protocol behind the proxy, for where a matched fault applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Postgres,
    /// MySQL's client/server protocol, without TLS (the client connects with
    /// `ssl-mode=DISABLED`, or the proxy sees only ciphertext).
    Mysql,
    Redis,
    /// AMQP 0.9.1 (RabbitMQ): a fault applies to the matching write itself (a publish's
    /// frames carry its `message_id`).
    Amqp,
    /// HTTP/1.1: a fault applies to the matching write itself (a request's head, which carries
    /// its method, path and headers).
    Http,
}

/// Where to inject a fault: the `nth` (from 1) client write containing every needle.
#[derive(Debug, Clone)]
pub struct Rule {
    pub needles: Vec<Vec<u8>>,
    pub nth: usize,
    pub fault: Fault,
}

impl Rule {
    /// The first write containing every needle.
    pub fn first(needles: &[&[u8]], fault: Fault) -> Rule {
        Rule {
            needles: needles.iter().map(|n| n.to_vec()).collect(),
            nth: 1,
            fault,
        }
    }
}

struct Armed {
    rule: Rule,
    seen: usize,
}

#[derive(Default)]
struct Shared {
    rules: Vec<Armed>,
    fired: Vec<(Fault, String)>,
    /// Redis commands the clients sent, whole.
    commands: usize,
}

impl Shared {
    /// The fault of the rule (if any) whose `nth` match `chunk` is; that rule is then spent.
    fn matches(&mut self, chunk: &[u8]) -> Option<Fault> {
        let mut hit = None;
        self.rules.retain_mut(|armed| {
            if hit.is_some() || !armed.rule.needles.iter().all(|n| contains(chunk, n)) {
                return true;
            }
            armed.seen += 1;
            if armed.seen < armed.rule.nth {
                return true;
            }
            hit = Some(armed.rule.clone());
            false
        });
        let rule = hit?;
        let what = rule
            .needles
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect::<Vec<_>>()
            .join(" + ");
        self.fired.push((rule.fault, what));
        Some(rule.fault)
    }
}

/// A proxy on a local port, forwarding to `upstream`; stops (and closes every connection) on
/// drop.
pub struct Proxy {
    pub addr: SocketAddr,
    wire: Wire,
    shared: Arc<Mutex<Shared>>,
    accept: JoinHandle<()>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`).
    pub async fn start(upstream: &str, wire: Wire) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy port");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let upstream = upstream.to_owned();
        let accept = tokio::spawn({
            let shared = shared.clone();
            let conns = conns.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let relay = tokio::spawn(relay(client, server, shared.clone(), wire));
                    let mut conns = conns.lock().unwrap();
                    conns.retain(|c| !c.is_finished());
                    conns.push(relay);
                }
            }
        });
        Proxy {
            addr,
            wire,
            shared,
            accept,
            conns,
        }
    }

    /// The proxy of the PostgreSQL server of `url`.
    pub async fn postgres(url: &str) -> Proxy {
        Proxy::start(&upstream_of(url, 5432), Wire::Postgres).await
    }

    /// The proxy of the MySQL (or MariaDB) server of `url`.
    pub async fn mysql(url: &str) -> Proxy {
        Proxy::start(&upstream_of(url, 3306), Wire::Mysql).await
    }

    /// The proxy of the Redis server of `url`.
    pub async fn redis(url: &str) -> Proxy {
        Proxy::start(&upstream_of(url, 6379), Wire::Redis).await
    }

    /// The proxy of the RabbitMQ server of `url`.
    pub async fn amqp(url: &str) -> Proxy {
        Proxy::start(&upstream_of(url, 5672), Wire::Amqp).await
    }

    /// Adds a rule; it fires once.
    pub fn inject(&self, rule: Rule) {
        self.shared
            .lock()
            .unwrap()
            .rules
            .push(Armed { rule, seen: 0 });
    }

    /// The faults injected so far, with the needles that chose them.
    pub fn fired(&self) -> Vec<(Fault, String)> {
        self.shared.lock().unwrap().fired.clone()
    }

    /// How many Redis commands the clients sent through the proxy so far (each a RESP array,
    /// one command of a pipeline or of a script call counted once).
    pub fn commands(&self) -> usize {
        self.shared.lock().unwrap().commands
    }

    /// Removes the rules that have not fired.
    pub fn disarm(&self) {
        self.shared.lock().unwrap().rules.clear();
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").expect("a URL");
        let (authority, tail) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let userinfo = authority
            .rsplit_once('@')
            .map(|(u, _)| format!("{u}@"))
            .unwrap_or_default();
        format!("{scheme}://{userinfo}{}{tail}", self.addr)
    }

    pub fn wire(&self) -> Wire {
        self.wire
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

/// `host:port` of a URL, `default_port` when it names none.
fn upstream_of(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").expect("a URL").1;
    let authority = rest.split(['/', '?']).next().unwrap();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether a client write runs something: on PostgreSQL, it holds an `Execute` ('E') or a simple
/// `Query` ('Q') message; on MySQL, a command packet (sequence number 0) that is a
/// `COM_STMT_EXECUTE` (0x17) or a `COM_QUERY` (0x03); on Redis, RabbitMQ and HTTP, every write
/// does.
fn executes(wire: Wire, chunk: &[u8]) -> bool {
    match wire {
        Wire::Redis | Wire::Amqp | Wire::Http => true,
        Wire::Postgres => {
            let mut at = 0;
            while at + 5 <= chunk.len() {
                let kind = chunk[at];
                let len = u32::from_be_bytes(chunk[at + 1..at + 5].try_into().unwrap()) as usize;
                if kind == b'E' || kind == b'Q' {
                    return true;
                }
                if len < 4 {
                    return false;
                }
                at += 1 + len;
            }
            false
        }
        Wire::Mysql => {
            // Each packet: a 3-byte little-endian payload length, a sequence number, the
            // payload, whose first byte is the command.
            let mut at = 0;
            while at + 5 <= chunk.len() {
                let len = usize::from(chunk[at])
                    | usize::from(chunk[at + 1]) << 8
                    | usize::from(chunk[at + 2]) << 16;
                if chunk[at + 3] == 0 && matches!(chunk[at + 4], 0x03 | 0x17) {
                    return true;
                }
                at += 4 + len;
            }
            false
        }
    }
}

/// Relays one connection both ways, injecting the fault a rule chooses.
async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    shared: Arc<Mutex<Shared>>,
    wire: Wire,
) {
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    let mut armed: Option<Fault> = None;
    let mut swallow_reply = false;
    let mut commands = Commands::default();
    loop {
        tokio::select! {
            read = client.read(&mut from_client) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = &from_client[..n];
                {
                    let mut shared = shared.lock().unwrap();
                    if wire == Wire::Redis {
                        shared.commands += commands.feed(chunk);
                    }
                    if let Some(fault) = shared.matches(chunk) {
                        armed = Some(fault);
                    }
                }
                if let Some(fault) = armed
                    && executes(wire, chunk)
                {
                    armed = None;
                    match fault {
                        // Dropping both streams closes them: the server never sees the write.
                        Fault::CutBefore => return,
                        Fault::CutAfterReply => swallow_reply = true,
                        Fault::Stall(d) => tokio::time::sleep(d).await,
                    }
                }
                if server.write_all(chunk).await.is_err() {
                    return;
                }
            }
            read = server.read(&mut from_server) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if swallow_reply {
                    // The server answered, so it did the work; let the rest of its reply (the
                    // end of a transaction) leave it, then cut without relaying any of it.
                    let _ = tokio::time::timeout(Duration::from_millis(50), async {
                        while let Ok(n) = server.read(&mut from_server).await {
                            if n == 0 {
                                break;
                            }
                        }
                    })
                    .await;
                    return;
                }
                if client.write_all(&from_server[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Counts the Redis commands in a client's stream of writes: RESP arrays of bulk strings
/// (`*<n>\r\n`, then `n` times `$<len>\r\n<bytes>\r\n`), however the writes cut them.
#[derive(Default)]
struct Commands {
    pending: Vec<u8>,
}

impl Commands {
    /// Takes `chunk`; how many commands it completed.
    fn feed(&mut self, chunk: &[u8]) -> usize {
        self.pending.extend_from_slice(chunk);
        let mut done = 0;
        while let Some(used) = Commands::one(&self.pending) {
            self.pending.drain(..used);
            done += 1;
        }
        done
    }

    /// The length of the first command of `buf`, when it is all there.
    fn one(buf: &[u8]) -> Option<usize> {
        let line = |at: usize| -> Option<(usize, usize)> {
            let end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
            let n = std::str::from_utf8(&buf[at + 1..end]).ok()?.parse().ok()?;
            Some((n, end + 2))
        };
        if buf.first() != Some(&b'*') {
            return None;
        }
        let (items, mut at) = line(0)?;
        for _ in 0..items {
            let (len, data) = line(at)?;
            at = data + len + 2;
            if buf.len() < at {
                return None;
            }
        }
        Some(at)
    }
}
