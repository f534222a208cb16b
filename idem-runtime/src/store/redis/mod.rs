//! The Redis / Valkey store: standalone servers and clusters, for services that keep their
//! idempotency records next to their other shared state.
//!
//! # Design
//!
//! One record is one hash, named `{prefix}{<digest>}`: the digest is the first 128 bits of the
//! sha256 of the scope and the key, each preceded by its length in four big-endian bytes (so
//! that no split of the same bytes gives the same name), in hex, inside a hash tag so that every
//! key a script could touch is in one cluster slot. The hash stores the scope and the key
//! themselves, and every script compares them with the caller's before it decides anything: a
//! digest collision or a foreign writer is an [`Error::Store`], never someone else's answer.
//!
//! Every operation is one Lua script on that one key, atomic on the server (`record.lua` shared,
//! then `begin.lua`, `complete.lua`, `release.lua`, `checkpoint.lua`, `renew.lua`,
//! `lookup.lua`). `begin` decides exactly as every other store does (the rule in
//! `lifecycle::decide`, re-stated in Lua because it must run inside the script), and `complete`,
//! `release`, `checkpoint` and `renew` apply only while the fence is the caller's. Scripts are sent as `EVALSHA`; a server that does not know
//! one (after a restart or a failover) gets it again, transparently.
//!
//! Time is the server's: scripts that need the time read `TIME`, so leases, retention and first
//! fences never depend on the clocks of the service's instances. A record's first fence is the server's clock
//! in milliseconds and grows by one on every take-over or claim after a release; a record that
//! expired and is created again therefore starts above every fence of its previous life.
//! Retention is the key's own expiry (`PEXPIRE`, counted on the server's clock from the claim):
//! a key that exists is within its retention, Redis deletes expired records by itself, so no
//! sweeper is needed and [`Store::purge_expired`] does nothing.
//!
//! The hash holds `meta` (`<version> <state> <fence> <lease_until> <status> <error>`: what every
//! decision reads, in one field), `scope`, `key`, `fp` (the fingerprint), and, when there is one,
//! `recovery` and the response's `body`. A replay reads one hash and does not need the clock;
//! a completion is one conditional write.
//!
//! # Durability is the operator's choice
//!
//! - **Eviction.** A server whose `maxmemory-policy` evicts keys would silently drop records
//!   (every idem key has a TTL, so the `volatile-*` policies evict them too), and an evicted
//!   in-progress record lets a retry run the body a second time. [`RedisStore::connect`] checks
//!   the policy with `CONFIG GET` (on every primary of a cluster) and refuses anything but
//!   `noeviction` with [`Error::Config`], unless the builder was told
//!   [`allow_eviction`](RedisStoreBuilder::allow_eviction). Where `CONFIG` is not permitted, as
//!   on many managed services, it logs a warning and trusts the operator.
//! - **Persistence.** With `appendonly yes` and `appendfsync everysec` (the usual setting) a
//!   server that crashes loses at most about a second of writes; `appendfsync always` loses none
//!   and makes every write wait for the disk; without persistence a restart loses every record.
//! - **Failover** is asynchronous replication: a replica promoted after its primary died may lack
//!   the last writes, and nothing in Redis can make that window zero. What it means for
//!   exactly-once: a lost in-progress record lets a retry run the body again while the first
//!   attempt may still be running; a lost completion makes the key claimable again, so a retry
//!   runs the body a second time. The guard's downstream keys
//!   ([`ClaimInfo::downstream_key`](crate::ClaimInfo::downstream_key)) are what keep the calls
//!   to the outside world single across such a repeat; a body whose effects cannot be
//!   deduplicated downstream belongs on the PostgreSQL store, in transactional mode.
//!
//! # Errors
//!
//! Connection loss, timeouts and the server's transient refusals (`CLUSTERDOWN`, `TRYAGAIN`,
//! `LOADING`, `MASTERDOWN`, `READONLY`, `OOM`, `BUSY`) are [`Error::Unavailable`]: safe to retry,
//! HTTP 503. A key that holds something other than an idem record of the requested identity (a
//! value of another type, a hash with missing or malformed fields, another scope and key) is an
//! [`Error::Store`] naming the key; the body never runs over it.
//!
//! Transactional mode does not apply: records live outside the database, so `RedisStore` does
//! not implement `TxStore`, and `#[idempotent(…, transaction = tx)]` with it does not compile.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisError, Script, ScriptInvocation, Value};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::lifecycle::State;
use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, ExpiredLease, Record, RecordState,
    StoredResponse,
};
use crate::store::{ForcedRelease, Operation, RecordInfo, Reply, Store, StoreStats};

#[cfg(test)]
mod tests;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idem:";

/// Leases and retention are capped at about 1,100 years: every time a script computes stays
/// below 10^14 ms, where Lua's numbers are exact and print without an exponent.
const MAX_MS: u64 = 1 << 45;

struct Scripts {
    begin: Script,
    complete: Script,
    release: Script,
    checkpoint: Script,
    renew: Script,
    lookup: Script,
    info: Script,
    force_release: Script,
}

/// Each script is the shared prelude followed by its own body. `Script` keeps the SHA1, so the
/// server is sent the hash, and the source only when it does not know the hash yet.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    macro_rules! script {
        ($file:literal) => {
            Script::new(concat!(include_str!("record.lua"), include_str!($file)))
        };
    }
    Scripts {
        begin: script!("begin.lua"),
        complete: script!("complete.lua"),
        release: script!("release.lua"),
        checkpoint: script!("checkpoint.lua"),
        renew: script!("renew.lua"),
        lookup: script!("lookup.lua"),
        info: script!("info.lua"),
        force_release: script!("force_release.lua"),
    }
});

/// A store on Redis or Valkey, a standalone server or a cluster.
///
/// See the [module documentation](self) for the design, what durability the server's
/// configuration buys, and the errors. Clones share one connection (standalone: a multiplexed
/// connection that reconnects by itself; cluster: the cluster client's connections to every
/// node).
///
/// Records leave when their retention ends by the key's time to live, counted on the server's
/// clock: there is nothing to purge and no background task.
///
/// ```no_run
/// # async fn f() -> idem_runtime::Result<()> {
/// use idem_runtime::RedisStore;
/// let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
/// let cluster = RedisStore::connect_cluster(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]).await?;
/// let shared = RedisStore::builder().prefix("payments:idem:").connect("redis://127.0.0.1").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    // One pointer: the macro clones the store on every call.
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    prefix: String,
}

#[derive(Clone)]
enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, RedisError> {
        match self {
            Conn::Standalone(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "topology",
                &match self.inner.conn {
                    Conn::Standalone(_) => "standalone",
                    Conn::Cluster(_) => "cluster",
                },
            )
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisStore`]: key prefix, timeouts, and whether an evicting server is accepted.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    prefix: String,
    allow_eviction: bool,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            allow_eviction: false,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(2),
        }
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key the store writes (default `idem:`), so that several services or
    /// environments can share a server. It must not contain `{` or `}`: the part of the name in
    /// braces is the hash tag that decides a key's cluster slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Accept a server whose `maxmemory-policy` evicts keys (default: refuse it). An evicted
    /// record is a request that can run twice: say yes only where that is acceptable, or where
    /// the server is known never to reach its memory limit.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// How long establishing a connection may take (default 1 s). Past it, the operation fails
    /// with [`Error::Unavailable`].
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long the server may take to answer one operation (default 2 s). Past it, the
    /// operation fails with [`Error::Unavailable`]; the script may still have run, which is
    /// why a claim whose answer was lost is seen as in progress until its lease ends.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    fn check_prefix(&self) -> Result<()> {
        if self.prefix.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "the Redis key prefix {:?} contains a brace: braces would change the hash tag that keeps a record in one cluster slot",
                self.prefix
            )));
        }
        Ok(())
    }

    /// Connects to a standalone server or a Valkey instance: `redis://[user:password@]host[:port][/db]`.
    ///
    /// The connection reconnects by itself; operations attempted while it is down fail with
    /// [`Error::Unavailable`].
    pub async fn connect(self, url: &str) -> Result<RedisStore> {
        self.check_prefix()?;
        let client = redis::Client::open(url).map_err(config_err)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connection_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // Give up on a reconnection quickly: a request waiting for it should rather be
            // told 503 and retry than hang.
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let manager = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(map_err)?;
        let conn = Conn::Standalone(manager);
        self.finish(conn).await
    }

    /// Connects to a Redis Cluster or Valkey Cluster through any of its nodes (the client
    /// discovers the others and follows slot moves).
    pub async fn connect_cluster<I, S>(self, nodes: I) -> Result<RedisStore>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.check_prefix()?;
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        if nodes.is_empty() {
            return Err(Error::Config("no Redis cluster node was given".into()));
        }
        let client = ClusterClientBuilder::new(nodes)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .retries(3)
            .build()
            .map_err(config_err)?;
        let conn = client.get_async_connection().await.map_err(map_err)?;
        self.finish(Conn::Cluster(conn)).await
    }

    async fn finish(self, conn: Conn) -> Result<RedisStore> {
        check_eviction(&conn, self.allow_eviction).await?;
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
            }),
        })
    }
}

/// Refuses a server that may evict records, unless told otherwise; see the module docs.
async fn check_eviction(conn: &Conn, allow: bool) -> Result<()> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let answer = match conn {
        Conn::Standalone(c) => cmd.query_async::<Value>(&mut c.clone()).await,
        Conn::Cluster(c) => {
            // Every primary: a record may live on any of them.
            c.clone()
                .route_command(
                    cmd,
                    RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                )
                .await
        }
    };
    let answer = match answer {
        Ok(v) => v,
        Err(e) if is_transient(&e) => return Err(map_err(e)),
        Err(e) => {
            tracing::warn!(
                target: "idem",
                error = %e,
                "could not read the Redis server's maxmemory-policy (CONFIG GET is not permitted?): make sure it is `noeviction`, or records may be evicted and requests run twice"
            );
            return Ok(());
        }
    };
    let mut policies = Vec::new();
    collect_policies(&answer, &mut policies);
    if policies.is_empty() {
        tracing::warn!(
            target: "idem",
            "the Redis server did not report its maxmemory-policy: make sure it is `noeviction`, or records may be evicted and requests run twice"
        );
        return Ok(());
    }
    if let Some(bad) = policies.iter().find(|p| p.as_str() != "noeviction") {
        if allow {
            tracing::warn!(
                target: "idem",
                policy = %bad,
                "the Redis server evicts keys under memory pressure (allowed by the builder): an evicted record lets a request run twice"
            );
        } else {
            return Err(Error::Config(format!(
                "the Redis server's maxmemory-policy is `{bad}`: it may evict idempotency records (every one has a TTL, so `volatile-*` policies evict them too), and an evicted record lets a request run twice. Set `maxmemory-policy noeviction`, or accept the risk with RedisStore::builder().allow_eviction(true)"
            )));
        }
    }
    Ok(())
}

/// The values of `maxmemory-policy` in a `CONFIG GET` answer: a flat array or a map of
/// name → value for one server, or a map of node → such an answer for a cluster.
fn collect_policies(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Array(items) => {
            if let [name, value] = &items[..]
                && text(name).as_deref() == Some("maxmemory-policy")
            {
                if let Some(p) = text(value) {
                    out.push(p);
                }
                return;
            }
            for item in items {
                collect_policies(item, out);
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                if text(k).as_deref() == Some("maxmemory-policy") {
                    if let Some(p) = text(v) {
                        out.push(p);
                    }
                } else {
                    collect_policies(v, out);
                }
            }
        }
        _ => {}
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl RedisStore {
    /// A builder with the default prefix and timeouts, refusing an evicting server.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to a standalone server (or Valkey) with the defaults; see
    /// [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<RedisStore> {
        RedisStore::builder().connect(url).await
    }

    /// Connects to a cluster through any of its nodes with the defaults; see
    /// [`RedisStoreBuilder::connect_cluster`].
    pub async fn connect_cluster<I, S>(nodes: I) -> Result<RedisStore>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedisStore::builder().connect_cluster(nodes).await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The name of the key that holds the record of `(scope, key)`: the prefix, then in braces
    /// (a hash tag) the hex of the first 16 bytes of the sha256 of the length-prefixed scope and
    /// key.
    pub fn record_key(&self, scope: &str, key: &str) -> String {
        record_name(&self.inner.prefix, scope, key)
    }

    async fn run(&self, invocation: &ScriptInvocation<'_>) -> Result<Vec<Value>> {
        match self.inner.conn.invoke(invocation).await.map_err(map_err)? {
            Value::Array(items) => Ok(items),
            other => Err(protocol(format!(
                "a script answered {other:?} instead of an array"
            ))),
        }
    }

    /// Runs one of the fence-conditional writes and reads its answer.
    async fn write(&self, claim: ClaimRef<'_>, invocation: &ScriptInvocation<'_>) -> Result<()> {
        let reply = self.run(invocation).await?;
        match tag(&reply)? {
            1 => Ok(()),
            2 => Err(Error::FenceLost { fence: claim.fence }),
            0 => Err(not_ours(self, claim.scope, claim.key, &reply)),
            other => Err(protocol(format!("a write script answered tag {other}"))),
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `{prefix}{<hex of the first 16 bytes of sha256(len(scope) scope len(key) key)>}`, lengths as
/// four big-endian bytes. 128 bits make a collision practically impossible, and one would still
/// be caught (the record holds its scope and key); the short name is cheaper for every lookup.
fn record_name(prefix: &str, scope: &str, key: &str) -> String {
    let mut h = Sha256::new();
    for part in [scope, key] {
        // Scopes are at most 1024 bytes and keys 255: the length always fits.
        h.update(u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut name = String::with_capacity(prefix.len() + 2 + 32);
    name.push_str(prefix);
    name.push('{');
    for b in &digest[..16] {
        name.push(char::from(HEX[usize::from(b >> 4)]));
        name.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    name.push('}');
    name
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).min(MAX_MS)
}

impl Store for RedisStore {
    async fn call(&self, op: Operation<'_>) -> Result<Reply> {
        match op {
            Operation::Begin(req) => self.run_begin(req).await.map(Reply::Begun),
            Operation::Complete { claim, response } => self
                .run_complete(claim, response)
                .await
                .map(|()| Reply::Done),
            Operation::Release(claim) => {
                let mut inv = SCRIPTS.release.prepare_invoke();
                self.fenced(&mut inv, claim);
                self.write(claim, &inv).await.map(|()| Reply::Done)
            }
            Operation::Checkpoint {
                claim,
                recovery_point,
                lease,
            } => {
                let mut inv = SCRIPTS.checkpoint.prepare_invoke();
                self.fenced(&mut inv, claim)
                    .arg(recovery_point)
                    .arg(ms(lease));
                self.write(claim, &inv).await.map(|()| Reply::Done)
            }
            Operation::Renew { claim, lease } => {
                let mut inv = SCRIPTS.renew.prepare_invoke();
                self.fenced(&mut inv, claim).arg(ms(lease));
                self.write(claim, &inv).await.map(|()| Reply::Done)
            }
            Operation::Lookup { scope, key } => self.run_lookup(scope, key).await.map(Reply::Found),
            // Each record is a key with an expiry (`PEXPIREAT`, the end of its retention on the
            // server's clock), and Redis deletes expired keys by itself: nothing to purge.
            Operation::PurgeExpired | Operation::PurgeBatch => Ok(Reply::Purged(0)),
            Operation::CountExpired => Ok(Reply::Counted(0)),
            Operation::Inspect { scope, key } => {
                let name = self.record_key(scope, key);
                let found = self.info(&name, scope, key, true).await?;
                Ok(Reply::Records(found.into_iter().collect()))
            }
            Operation::ForceRelease { scope, key } => {
                let mut inv = SCRIPTS.force_release.prepare_invoke();
                inv.key(self.record_key(scope, key)).arg(scope).arg(key);
                let reply = self.run(&inv).await?;
                let done = match tag(&reply)? {
                    1 => ForcedRelease::NotFound,
                    2 => ForcedRelease::NotInProgress(state_at(&reply, 1)?),
                    3 => ForcedRelease::Released {
                        fence: int_at(&reply, 1).and_then(non_negative)?,
                    },
                    0 => return Err(not_ours(self, scope, key, &reply)),
                    other => {
                        return Err(protocol(format!(
                            "the force_release script answered tag {other}"
                        )));
                    }
                };
                Ok(Reply::ForceReleased(done))
            }
            Operation::List(query) => {
                let mut found = Vec::new();
                for name in self.scan().await? {
                    if let Some(info) = self.info(&name, "", "", false).await?
                        && query.matches(&info)
                    {
                        found.push(info);
                    }
                }
                found.sort_by_key(|r| r.fence);
                found.truncate(query.limit);
                Ok(Reply::Records(found))
            }
            Operation::Stats { expiring_within } => {
                let mut stats = StoreStats::default();
                for name in self.scan().await? {
                    if let Some(info) = self.info(&name, "", "", false).await? {
                        stats.count(&info, expiring_within);
                    }
                }
                Ok(Reply::Stats(Box::new(stats)))
            }
        }
    }

    fn release_in_background(&self, scope: String, key: String, fence: u64) {
        let store = self.clone();
        super::spawn_release(scope, key, move |scope, key| async move {
            let claim = ClaimRef {
                scope: &scope,
                key: &key,
                fence,
            };
            store.release(claim).await
        });
    }
}

impl RedisStore {
    /// The record under the Redis key `name` as an operator sees it; `scope` and `key` empty
    /// for whatever identity it holds (a key found by a scan).
    async fn info(
        &self,
        name: &str,
        scope: &str,
        key: &str,
        full: bool,
    ) -> Result<Option<RecordInfo>> {
        let mut inv = SCRIPTS.info.prepare_invoke();
        inv.key(name)
            .arg(scope)
            .arg(key)
            .arg(if full { "1" } else { "0" });
        let reply = self.run(&inv).await?;
        match tag(&reply)? {
            1 => Ok(None),
            2 => {
                let state = state_at(&reply, 3)?;
                let fence = int_at(&reply, 4).and_then(non_negative)?;
                let now = int_at(&reply, 9)?;
                let text_at = |i| {
                    String::from_utf8(bytes_at(&reply, i)?)
                        .map_err(|_| protocol("a scope or key that is not UTF-8"))
                };
                Ok(Some(RecordInfo {
                    scope: text_at(1)?,
                    key: text_at(2)?,
                    state,
                    fence,
                    attempt: int_at(&reply, 5)
                        .and_then(non_negative)
                        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))?,
                    fingerprint: Fingerprint::from_slice(&bytes_at(&reply, 6)?).ok_or_else(
                        || protocol("the info script answered a malformed fingerprint"),
                    )?,
                    age: RecordInfo::age_from(fence, now),
                    lease_remaining: (state == State::InProgress)
                        .then(|| int_at(&reply, 7).map(RecordInfo::ms_left))
                        .transpose()?,
                    // A key without an expiry (-1) has none to wait for; Redis deletes the
                    // others itself when theirs ends.
                    expires_in: RecordInfo::ms_left(int_at(&reply, 8)?),
                    recovery_point: opt_bytes_at(&reply, 10)?,
                    response: if full && state == State::Completed {
                        Some(response_at(&reply, 11)?)
                    } else {
                        None
                    },
                }))
            }
            0 if scope.is_empty() => Err(Error::Store(
                format!(
                    "the Redis key {name} under the store's prefix holds {}, not an idem record",
                    reply
                        .get(1)
                        .and_then(text)
                        .unwrap_or_else(|| "something unreadable".into())
                )
                .into(),
            )),
            0 => Err(not_ours(self, scope, key, &reply)),
            other => Err(protocol(format!("the info script answered tag {other}"))),
        }
    }

    /// Every key under the store's prefix, on every primary of a cluster: a scan, for
    /// operators, never on a request's path.
    async fn scan(&self) -> Result<Vec<String>> {
        let pattern = format!("{}*", glob_escape(&self.inner.prefix));
        let scan = |cursor: &str| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            cmd
        };
        let mut names = Vec::new();
        match &self.inner.conn {
            Conn::Standalone(c) => {
                let mut cursor = "0".to_owned();
                loop {
                    let page: Value = scan(&cursor)
                        .query_async(&mut c.clone())
                        .await
                        .map_err(map_err)?;
                    cursor = scan_page(page, &mut names)?;
                    if cursor == "0" {
                        return Ok(names);
                    }
                }
            }
            Conn::Cluster(c) => {
                // The first page from every primary, each answer under its node's address;
                // then each node's next pages from that node.
                let first = c
                    .clone()
                    .route_command(
                        scan("0"),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await
                    .map_err(map_err)?;
                let Value::Map(nodes) = first else {
                    return Err(protocol(format!(
                        "SCAN on every primary answered {first:?}"
                    )));
                };
                for (addr, page) in nodes {
                    let addr =
                        text(&addr).ok_or_else(|| protocol("a node address that is not text"))?;
                    let (host, port) = addr
                        .rsplit_once(':')
                        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                        .ok_or_else(|| protocol(format!("a node address {addr:?}")))?;
                    let mut cursor = scan_page(page, &mut names)?;
                    while cursor != "0" {
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let page = c
                            .clone()
                            .route_command(scan(&cursor), route)
                            .await
                            .map_err(map_err)?;
                        cursor = scan_page(page, &mut names)?;
                    }
                }
                Ok(names)
            }
        }
    }

    /// The record's key and the claim's scope, key and fence: the first arguments of every
    /// fenced script.
    fn fenced<'i>(
        &self,
        inv: &'i mut ScriptInvocation<'static>,
        claim: ClaimRef<'_>,
    ) -> &'i mut ScriptInvocation<'static> {
        inv.key(self.record_key(claim.scope, claim.key))
            .arg(claim.scope)
            .arg(claim.key)
            .arg(claim.fence)
    }

    async fn run_begin(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        let name = self.record_key(req.scope, req.key);
        let mut inv = SCRIPTS.begin.prepare_invoke();
        inv.key(&name)
            .arg(req.scope)
            .arg(req.key)
            .arg(&req.fingerprint.as_bytes()[..])
            .arg(ms(req.policy.lease))
            .arg(ms(req.policy.retain))
            .arg(match req.policy.expired_lease {
                ExpiredLease::FailClosed => "0",
                _ => "1",
            });
        let reply = self.run(&inv).await?;
        match tag(&reply)? {
            1 => Ok(BeginOutcome::Claimed(Claimed {
                fence: int_at(&reply, 1).and_then(non_negative)?,
                reclaimed: int_at(&reply, 2)? == 1,
                attempt: int_at(&reply, 3).and_then(non_negative).and_then(|n| {
                    u32::try_from(n).map_err(|_| protocol(format!("attempt {n} out of range")))
                })?,
                recovery_point: opt_bytes_at(&reply, 4)?,
            })),
            2 => Ok(BeginOutcome::Replay(response_at(&reply, 1)?)),
            3 => Ok(BeginOutcome::InProgress {
                retry_after: Duration::from_millis(int_at(&reply, 1).and_then(non_negative)?),
            }),
            4 => Ok(BeginOutcome::KeyReused),
            0 => Err(not_ours(self, req.scope, req.key, &reply)),
            other => Err(protocol(format!("the begin script answered tag {other}"))),
        }
    }

    async fn run_complete(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        let mut inv = SCRIPTS.complete.prepare_invoke();
        self.fenced(&mut inv, claim)
            .arg(
                response
                    .status
                    .map_or_else(|| "-".to_owned(), |s| s.to_string()),
            )
            .arg(if response.is_error { "1" } else { "0" })
            .arg(&response.body[..]);
        self.write(claim, &inv).await
    }

    async fn run_lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        let name = self.record_key(scope, key);
        let mut inv = SCRIPTS.lookup.prepare_invoke();
        inv.key(&name).arg(scope).arg(key);
        let reply = self.run(&inv).await?;
        match tag(&reply)? {
            1 => Ok(None),
            2 => {
                let state = bytes_at(&reply, 1)?;
                let completed = match &state[..] {
                    b"completed" => true,
                    b"in_progress" => false,
                    _ => return Err(protocol("the lookup script answered an unknown state")),
                };
                let fingerprint =
                    Fingerprint::from_slice(&bytes_at(&reply, 3)?).ok_or_else(|| {
                        protocol("the lookup script answered a malformed fingerprint")
                    })?;
                let left = int_at(&reply, 4)?;
                Ok(Some(Record {
                    fingerprint,
                    state: if completed {
                        RecordState::Completed
                    } else {
                        RecordState::InProgress
                    },
                    fence: int_at(&reply, 2).and_then(non_negative)?,
                    response: if completed {
                        Some(response_at(&reply, 5)?)
                    } else {
                        None
                    },
                    lease_remaining: (!completed)
                        .then(|| Duration::from_millis(u64::try_from(left).unwrap_or(0))),
                }))
            }
            0 => Err(not_ours(self, scope, key, &reply)),
            other => Err(protocol(format!("the lookup script answered tag {other}"))),
        }
    }
}

// ---- replies -----------------------------------------------------------------------------------

fn protocol(what: impl Into<String>) -> Error {
    Error::Store(format!("unexpected answer from Redis: {}", what.into()).into())
}

fn tag(reply: &[Value]) -> Result<i64> {
    int_at(reply, 0)
}

/// A record's state at `i`.
fn state_at(reply: &[Value], i: usize) -> Result<State> {
    let text =
        String::from_utf8(bytes_at(reply, i)?).map_err(|_| protocol("a state that is not text"))?;
    State::parse(&text)
}

/// One page of a SCAN, `[cursor, [names]]`: its names added to `names`, and the next cursor.
fn scan_page(page: Value, names: &mut Vec<String>) -> Result<String> {
    let Value::Array(mut parts) = page else {
        return Err(protocol(format!("SCAN answered {page:?}")));
    };
    let (Some(Value::Array(found)), Some(cursor)) = (parts.pop(), parts.pop()) else {
        return Err(protocol(
            "SCAN answered something other than a cursor and names",
        ));
    };
    for name in found {
        names.push(text(&name).ok_or_else(|| protocol("a key name that is not text"))?);
    }
    text(&cursor).ok_or_else(|| protocol("a SCAN cursor that is not text"))
}

/// `text` with the characters a SCAN pattern gives a meaning escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn int_at(reply: &[Value], i: usize) -> Result<i64> {
    match reply.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(protocol(format!(
            "expected an integer at {i}, got {other:?}"
        ))),
    }
}

fn non_negative(n: i64) -> Result<u64> {
    u64::try_from(n).map_err(|_| protocol(format!("a negative number {n}")))
}

fn bytes_at(reply: &[Value], i: usize) -> Result<Vec<u8>> {
    match reply.get(i) {
        Some(Value::BulkString(b)) => Ok(b.clone()),
        other => Err(protocol(format!("expected bytes at {i}, got {other:?}"))),
    }
}

fn opt_bytes_at(reply: &[Value], i: usize) -> Result<Option<Vec<u8>>> {
    match reply.get(i) {
        None | Some(Value::Nil) => Ok(None),
        Some(_) => bytes_at(reply, i).map(Some),
    }
}

/// A stored response at `i`: status (or nil), error flag `'0'`/`'1'`, body.
fn response_at(reply: &[Value], i: usize) -> Result<StoredResponse> {
    let status = match opt_bytes_at(reply, i)? {
        None => None,
        Some(s) => Some(
            std::str::from_utf8(&s)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .ok_or_else(|| protocol("a stored status that is not an HTTP status"))?,
        ),
    };
    let is_error = match &opt_bytes_at(reply, i + 1)?.unwrap_or_default()[..] {
        b"1" => true,
        b"0" => false,
        _ => return Err(protocol("a stored error flag that is not 0 or 1")),
    };
    let body = match reply.get(i + 2) {
        Some(Value::BulkString(b)) => bytes::Bytes::from(b.clone()),
        other => return Err(protocol(format!("expected a stored body, got {other:?}"))),
    };
    Ok(StoredResponse {
        status,
        is_error,
        body,
    })
}

/// The key holds something that is not an idem record of this identity.
fn not_ours(store: &RedisStore, scope: &str, key: &str, reply: &[Value]) -> Error {
    let why = reply
        .get(1)
        .and_then(text)
        .unwrap_or_else(|| "something unreadable".into());
    Error::Store(
        format!(
            "the Redis key {} for scope {scope:?} and key {key:?} holds {why}, not an idem record: refusing to touch it (nothing was run)",
            store.record_key(scope, key)
        )
        .into(),
    )
}

// ---- errors ------------------------------------------------------------------------------------

/// Whether retrying later can succeed: the connection, a timeout, or the server's transient
/// refusals (failover, loading, a cluster reconfiguring, memory full, a busy script).
fn is_transient(e: &RedisError) -> bool {
    use redis::{ErrorKind as K, ServerErrorKind as S};
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        K::Io | K::ClusterConnectionNotFound => true,
        K::Server(
            S::ClusterDown
            | S::TryAgain
            | S::BusyLoading
            | S::MasterDown
            | S::ReadOnly
            | S::Moved
            | S::Ask,
        ) => true,
        _ => e.code().is_some_and(|code| {
            matches!(
                code,
                "CLUSTERDOWN"
                    | "TRYAGAIN"
                    | "LOADING"
                    | "MASTERDOWN"
                    | "READONLY"
                    | "OOM"
                    | "BUSY"
                    | "NOREPLICAS"
            )
        }),
    }
}

/// Sorts a client error into "retry later" ([`Error::Unavailable`], HTTP 503) and "broken"
/// ([`Error::Store`], HTTP 500).
fn map_err(e: RedisError) -> Error {
    if is_transient(&e) {
        Error::Unavailable(Box::new(e))
    } else {
        Error::Store(Box::new(e))
    }
}

fn config_err(e: RedisError) -> Error {
    Error::Config(format!("invalid Redis address: {e}"))
}
