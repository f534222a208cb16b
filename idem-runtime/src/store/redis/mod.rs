//! The Redis / Valkey store: standalone servers and clusters, for services that keep their
//! idempotency records next to their other shared state.
//!
//! # Design
//!
//! One record is one string value, named `{prefix}{<digest>}`: the digest is the first 128 bits
//! of the sha256 of the scope and the key, each preceded by its length in four big-endian bytes
//! (so that no split of the same bytes gives the same name), in hex, inside a hash tag so that
//! every key a script could touch is in one cluster slot. The record stores the scope and the
//! key themselves, and every operation compares them with the caller's before it decides
//! anything: a digest collision or a foreign writer is an [`Error::Store`], never someone else's
//! answer.
//!
//! Every operation on a record is one Lua script on that one key, atomic on the server
//! (`record.lua` shared, then `begin.lua`, `complete.lua`, `release.lua`, `checkpoint.lua`,
//! `renew.lua`, `suspend.lua`, `park.lua`, `retry.lua`, `force_release.lua`, `read.lua`). `begin` decides exactly as every other store does (the rule
//! in `lifecycle::decide`, re-stated in Lua because it must run inside the script), and
//! `complete`, `release`, `checkpoint` and `renew` apply only while the fence is the caller's.
//! Scripts are sent as `EVALSHA`; a server that does not know one (after a restart or a
//! failover) gets it again, transparently. (Redis Functions, `FCALL`, cost the same per call on
//! Redis 7.0 and would need loading on every node, so they are not used.)
//!
//! Time is the server's: scripts that need the time read `TIME`, so leases, retention and first
//! fences never depend on the clocks of the service's instances. A record's first fence is the
//! server's clock in milliseconds and grows by one on every take-over or claim after a release;
//! a record that expired and is created again therefore starts above every fence of its
//! previous life. Retention is the key's own expiry (`SET … PX`, counted on the server's clock
//! from the claim, kept by every later write with `KEEPTTL`): a key that exists is within its
//! retention, Redis deletes expired records by itself, so no sweeper is needed and
//! [`Store::purge_expired`] does nothing. A record that holds unfinished work
//! ([`lifecycle::unfinished`](crate::lifecycle::unfinished): a resumable claim in progress, a
//! suspended claim, parked work) has no expiry while it holds it, so that work that may have
//! happened is never forgotten; once it is finished or released it gets what is left of its
//! retention back as its expiry (and goes at once when nothing is left).
//!
//! A record that holds no unfinished work (format 2) is a first line of text, `idem2 <state>
//! <fence> <lease_until> <attempt> <status> <error> <identity length> <recovery length or -> <body
//! length>`, then the identity (the scope's length, a space, the scope, the key), the 32 bytes of
//! the fingerprint, the recovery point and the response's body. One that holds unfinished work
//! (format 3, `idem3`, state `i` or `p` for parked) has four more numbers on its first line, the
//! lengths of its stored request and note, its resume time and the end of its retention, and the
//! request and note after the body (both formats are described in full in `record.lua`). Both
//! are read, whichever wrote them. Reading a
//! record is one `GET` and writing it one `SET`, and the two usual cases are decided before any
//! parsing in Lua: `begin` answers a completed record by returning it as it is (this client
//! checks it whole, then replays it or answers key reused; no clock, no write), and writes a
//! first claim straight away; `complete` recognises a claim in progress under the caller's
//! fence by its first bytes and writes the completed record from parts this client rendered.
//! Everything else goes through the full check of `record.lua`; `lookup`, inspection and listing
//! read the value with the server's clock (`read.lua`) and decode it here, with the same checks.
//!
//! While recent claims keep finding a completed record (retries, redeliveries), `begin` reads
//! first with a plain `GET`, as the SQL stores read first on their readers: a completed record
//! is answered from it with the same checks, which costs the server a fraction of the script,
//! and anything else (no record, a claim in progress, parked work, a value that is not a
//! record) goes on to the script, which decides as always. While claims are new keys it runs
//! the script at once, with no `GET` before it. [`RedisStoreBuilder::read_first`] fixes either
//! order.
//!
//! # The completer's index
//!
//! [`Operation::Due`] cannot scan every record. Records that hold resumable work have an entry
//! in one sorted set, [`RedisStore::due_key`] (`{prefix}{due}`, one cluster slot of its own):
//! the record's key, scored with when it becomes due on the server's clock. Because a script
//! touches one slot, the index is written beside the record, not in the same step, so it is a
//! hint and the record is the truth: `due` reads the entries whose time came (in pages, the
//! records of a page at once), checks each record (in progress, its request stored, its lease
//! run out and its resume time passed), answers those that are due, and afterwards moves the
//! entries of records not due yet to when they will be and removes those of records that hold
//! no work any more (finished, released, gone). An entry that is early or left over costs one
//! read; a missing one would be work never resumed, so none may go missing: a resumable claim
//! and an operator's retry write the entry before the record (a crash between the two leaves an
//! entry too many) and again after it, a suspension writes it before the record (due at once)
//! and moves it to the resume time after, and `due` changes or removes an entry only if its
//! score (whose fraction is a version that every write changes) is still the one it read with
//! the record (`index.lua`). Claims that store no request never touch the index: their `begin`
//! and `complete` are exactly as described above. Entries are scored on the index's server and
//! records checked on theirs, so between a cluster's nodes a clock difference delays or hastens
//! a round by as much, never more.
//!
//! The index is also where operators find unfinished work without a scan
//! ([Bounded reads](crate::store::admin#bounded-reads)): work the completer cannot take (a
//! claim suspended without a stored request, parked work) keeps its entry, scored at 2^45 ms,
//! the end of the times the store writes, which `due` never reaches. An operator's listing
//! reads every entry (up to what it may examine), and removes, as `due` does, an entry scored
//! so whose record holds no work any more; the entries `due` will read are left to
//! it. Anything else an operator lists or counts comes from a scan of every primary that asks
//! the servers to examine about as many keys as the listing may examine, a record read per key
//! it finds.
//!
//! # Durability is the operator's choice
//!
//! - **Eviction.** A server whose `maxmemory-policy` evicts keys would silently drop records
//!   (records that hold no unfinished work have a TTL, so the `volatile-*` policies evict them too), and an evicted
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
//! value of another type, a string that is not a well-formed record, another scope and key) is an
//! [`Error::Store`] naming the key; the body never runs over it.
//!
//! Transactional mode does not apply: records live outside the database, so `RedisStore` does
//! not implement `TxStore`, and `#[idempotent(…, transaction = tx)]` with it does not compile.

use std::collections::HashSet;
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
    StoredResponse, Unfinished,
};
use crate::store;
use crate::store::read_first::ReadFirst;
use crate::store::{
    Changes, ForcedRelease, ListOrder, Operation, RecordInfo, Reply, Retried, Store, StoreStats,
};

#[cfg(test)]
mod tests;

mod notify;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "idem:";

/// Leases and retention are capped at about 1,100 years: every time a script computes stays
/// below 10^14 ms, where Lua's numbers are exact and print without an exponent.
const MAX_MS: u64 = 1 << 45;

/// The score of an index entry whose record holds work the completer cannot take (parked, or
/// suspended without a stored request): never due, read only by operators.
const NEVER: i64 = MAX_MS as i64;

/// How many records an operator's read fetches at once.
const READ_BATCH: usize = 256;

/// How many keys one SCAN call asks a server to examine.
const SCAN_COUNT: usize = 1000;

struct Scripts {
    begin: Script,
    complete: Script,
    release: Script,
    checkpoint: Script,
    renew: Script,
    read: Script,
    force_release: Script,
    suspend: Script,
    park: Script,
    retry: Script,
    index: Script,
}

/// How a completed record's value starts (`begin_fast.lua` answers such a record as it is).
const COMPLETED: &[u8] = b"idem2 c ";

/// Each script is the shared prelude followed by its own body; `begin` and `complete` first try
/// their usual case (`begin_fast.lua`: a replay or a first claim; `complete_fast.lua`: a claim
/// in progress under the caller's fence) before the prelude is even set up. `Script` keeps the SHA1,
/// so the server is sent the hash, and the source only when it does not know the hash yet.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    macro_rules! script {
        ($file:literal) => {
            Script::new(concat!(include_str!("record.lua"), include_str!($file)))
        };
    }
    Scripts {
        begin: Script::new(concat!(
            include_str!("begin_fast.lua"),
            include_str!("record.lua"),
            include_str!("begin.lua")
        )),
        complete: Script::new(concat!(
            include_str!("complete_fast.lua"),
            include_str!("record.lua"),
            include_str!("complete.lua")
        )),
        release: script!("release.lua"),
        checkpoint: script!("checkpoint.lua"),
        renew: script!("renew.lua"),
        read: script!("read.lua"),
        force_release: script!("force_release.lua"),
        suspend: script!("suspend.lua"),
        park: script!("park.lua"),
        retry: script!("retry.lua"),
        index: Script::new(include_str!("index.lua")),
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
    /// Where claims this store ends are announced: within the process, and with `PUBLISH`
    /// when built with [`notify`](RedisStoreBuilder::notify).
    changes: Changes,
    /// Whether a claim first reads its record with a plain `GET`
    /// ([`read_first`](RedisStoreBuilder::read_first)).
    read_first: ReadFirst,
}

#[derive(Clone)]
enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The value of `key`, as `GET` answers it.
    async fn get(&self, key: &str) -> Result<Value, RedisError> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        match self {
            Conn::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Conn::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

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
    notify: bool,
    read_first: Option<bool>,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            allow_eviction: false,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(2),
            notify: false,
            read_first: None,
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

    /// Whether a claim always (`true`) or never (`false`) first reads its record with a plain
    /// `GET`, and answers a replay (or "key reused") from it: a replay is then one `GET`, which
    /// costs the server several times less than the claim's script, and a new key a `GET`
    /// more (that finds nothing) before the script. Anything but a completed record (a claim in
    /// progress, parked work, a value that is not a record) goes on to the script, which
    /// decides as it always does.
    ///
    /// By default the store chooses as it goes, as the SQL stores do
    /// (`SqlStoreBuilder::read_first`): it runs the script first while claims are new keys,
    /// and reads first while recent claims found a completed record (more than about one in
    /// nine). Fix it here for a workload known in advance.
    pub fn read_first(mut self, read_first: bool) -> Self {
        self.read_first = Some(read_first);
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
        self.finish(conn, url).await
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
        let first = nodes[0].clone();
        let client = ClusterClientBuilder::new(nodes)
            .connection_timeout(self.connection_timeout)
            .response_timeout(self.response_timeout)
            .retries(3)
            .build()
            .map_err(config_err)?;
        let conn = client.get_async_connection().await.map_err(map_err)?;
        self.finish(Conn::Cluster(conn), &first).await
    }

    /// The store on `conn`; `url` is where it subscribes to announcements, if it does.
    async fn finish(self, conn: Conn, url: &str) -> Result<RedisStore> {
        check_eviction(&conn, self.allow_eviction).await?;
        let changes = if self.notify {
            notify::changes(conn.clone(), url.to_owned(), &self.prefix)
        } else {
            Changes::new()
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn,
                prefix: self.prefix,
                changes,
                read_first: match self.read_first {
                    Some(on) => ReadFirst::always(on),
                    None => ReadFirst::adaptive(),
                },
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
                "the Redis server's maxmemory-policy is `{bad}`: it may evict idempotency records (those that hold no unfinished work have a TTL, so `volatile-*` policies evict them too), and an evicted record lets a request run twice. Set `maxmemory-policy noeviction`, or accept the risk with RedisStore::builder().allow_eviction(true)"
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
        items(self.inner.conn.invoke(invocation).await.map_err(map_err)?)
    }

    /// Runs one of the fence-conditional writes and reads its answer.
    async fn write(&self, claim: ClaimRef<'_>, invocation: &ScriptInvocation<'_>) -> Result<()> {
        let reply = match self.inner.conn.invoke(invocation).await.map_err(map_err)? {
            // complete_fast.lua's answer: written.
            Value::Int(1) => return Ok(()),
            other => items(other)?,
        };
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
        let ends = store::ends(&op);
        store::announced(&self.inner.changes, ends, self.run_op(op)).await
    }

    fn changes(&self) -> Option<&Changes> {
        Some(&self.inner.changes)
    }

    fn defer(&self, write: super::Deferred) {
        super::spawn_deferred(self.clone(), write)
    }
}

impl RedisStore {
    /// One operation, unannounced.
    async fn run_op(&self, op: Operation<'_>) -> Result<Reply> {
        match op {
            Operation::Suspend {
                claim,
                note,
                resume_in,
            } => self
                .run_suspend(claim, note, resume_in)
                .await
                .map(|()| Reply::Done),
            Operation::Due { limit } => self.run_due(limit).await.map(Reply::Due),
            Operation::Park { claim, note } => {
                let mut inv = SCRIPTS.park.prepare_invoke();
                self.fenced(&mut inv, claim).arg(note);
                self.write(claim, &inv).await?;
                // Parked work is never due: its entry (which it had, being due) is kept for
                // operators, at the end of time.
                let name = self.record_key(claim.scope, claim.key);
                self.index_after(&name, IndexAt::At(NEVER)).await;
                Ok(Reply::Done)
            }
            Operation::Retry { scope, key } => self.run_retry(scope, key).await.map(Reply::Retried),
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
            // Each record is a key with an expiry (`SET … PX`, the end of its retention on the
            // server's clock), and Redis deletes expired keys by itself: nothing to purge.
            Operation::PurgeExpired | Operation::PurgeBatch => Ok(Reply::Purged(0)),
            Operation::CountExpired => Ok(Reply::Counted(0)),
            Operation::Inspect { scope, key } => {
                let name = self.record_key(scope, key);
                let found = self.info(&name, Some((scope, key)), true).await?;
                Ok(Reply::Records(found.into_iter().collect()))
            }
            Operation::ForceRelease { scope, key, fence } => {
                let mut inv = SCRIPTS.force_release.prepare_invoke();
                inv.key(self.record_key(scope, key))
                    .arg(identity(scope, key))
                    .arg(fence.map(|f| f.to_string()).unwrap_or_default());
                let reply = self.run(&inv).await?;
                let done = match tag(&reply)? {
                    1 => ForcedRelease::NotFound,
                    2 => ForcedRelease::NotInProgress(state_at(&reply, 1)?),
                    3 => ForcedRelease::Released {
                        fence: int_at(&reply, 1).and_then(non_negative)?,
                    },
                    4 => ForcedRelease::FenceMoved {
                        state: state_at(&reply, 1)?,
                        fence: std::str::from_utf8(&bytes_at(&reply, 2)?)
                            .ok()
                            .and_then(|f| f.parse().ok())
                            .ok_or_else(|| {
                                protocol("force_release answered a fence that is not one")
                            })?,
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
                // Unfinished work from the completer's index; anything else from a scan that
                // stops at `examine` keys.
                let (examined, exhausted) = match query.order() {
                    ListOrder::Work => self.work(query.examine).await?,
                    _ => {
                        let (names, exhausted) = self.scan(query.examine).await?;
                        (self.infos(&names).await?, exhausted)
                    }
                };
                let examined = examined.into_iter().map(|(_, info)| info).collect();
                Ok(Reply::Listed(query.answer(examined, exhausted)))
            }
            Operation::Stats { expiring_within } => {
                // Every record that holds work (the index), and the first others a scan meets.
                let bound = usize::try_from(StoreStats::BOUND).unwrap_or(usize::MAX);
                let (work, work_all) = self.work(bound).await?;
                let (names, scanned_all) = self.scan(bound).await?;
                let listed: HashSet<&str> = work.iter().map(|(n, _)| n.as_str()).collect();
                let others: Vec<String> = names
                    .into_iter()
                    .filter(|n| !listed.contains(n.as_str()))
                    .collect();
                let mut stats = StoreStats::default();
                for (_, info) in work.iter().chain(&self.infos(&others).await?) {
                    stats.count(info, expiring_within);
                }
                stats.complete = work_all && scanned_all;
                Ok(Reply::Stats(Box::new(stats)))
            }
        }
    }
}

impl RedisStore {
    /// The record under the Redis key `name` as an operator sees it; `identity` `None` for
    /// whatever identity it holds (a key found by a scan).
    async fn info(
        &self,
        name: &str,
        identity: Option<(&str, &str)>,
        full: bool,
    ) -> Result<Option<RecordInfo>> {
        let Some(Read {
            record,
            now,
            retention_left,
        }) = self.read(name, identity).await?
        else {
            return Ok(None);
        };
        Ok(Some(RecordInfo {
            scope: record.scope,
            key: record.key,
            state: record.state,
            fence: record.fence,
            attempt: record.attempt,
            fingerprint: record.fingerprint,
            age: RecordInfo::age_from(record.fence, now),
            lease_remaining: (record.state == State::InProgress)
                .then(|| RecordInfo::ms_left(record.lease_until - now)),
            // A record that holds unfinished work has no expiry: its retention is what its
            // first line says. Redis deletes the others itself when theirs ends.
            expires_in: match (retention_left, record.expires_at) {
                (-1, Some(at)) => RecordInfo::ms_left(at - now),
                (left, _) => RecordInfo::ms_left(left),
            },
            recovery_point: if full { record.recovery } else { None },
            response: if full { record.response } else { None },
            note: record.note,
            resumable: record.request.is_some(),
            request: if full { record.request } else { None },
        }))
    }

    /// `names` without the completer's index, the one key under the prefix that is not a
    /// record.
    fn records_only(&self, mut names: Vec<String>) -> Vec<String> {
        let index = self.due_key();
        names.retain(|n| *n != index);
        names
    }

    /// The records under `names`, each as an operator sees it, read `READ_BATCH` at a time (a
    /// name whose record is gone is left out).
    async fn infos(&self, names: &[String]) -> Result<Vec<(String, RecordInfo)>> {
        let mut found = Vec::with_capacity(names.len());
        for batch in names.chunks(READ_BATCH) {
            let reads = futures_util::future::join_all(
                batch.iter().map(|name| self.info(name, None, false)),
            )
            .await;
            for (name, read) in batch.iter().zip(reads) {
                if let Some(info) = read? {
                    found.push((name.clone(), info));
                }
            }
        }
        Ok(found)
    }

    /// The records that hold unfinished work, from the completer's index: its first `limit`
    /// entries by score, each read, and whether that was every entry. An entry scored at
    /// [`NEVER`], which `due` never reads, whose record holds no work any more (finished,
    /// released, gone) is removed, if it is still as read. Any other entry is `due`'s to fix:
    /// one written before its record (a claim in flight) must not go.
    async fn work(&self, limit: usize) -> Result<(Vec<(String, RecordInfo)>, bool)> {
        const PAGE: usize = 200;
        let index = self.due_key();
        let mut entries: Vec<(String, String)> = Vec::new();
        // One entry more than asked for says whether there are more.
        let want = limit.saturating_add(1);
        while entries.len() < want {
            let count = (want - entries.len()).min(PAGE);
            let mut inv = SCRIPTS.index.prepare_invoke();
            inv.key(&index).arg("all").arg(entries.len()).arg(count);
            let page = index_page(self.inner.conn.invoke(&inv).await.map_err(map_err)?)?;
            let ended = page.len() < count;
            entries.extend(page);
            if ended {
                break;
            }
        }
        let all = entries.len() <= limit;
        entries.truncate(limit);
        for (member, _) in &entries {
            self.check_member(&index, member)?;
        }
        let names: Vec<String> = entries.iter().map(|(m, _)| m.clone()).collect();
        let found = self.infos(&names).await?;
        let holding: HashSet<&str> = found
            .iter()
            .filter(|(_, info)| info.holds_work())
            .map(|(n, _)| n.as_str())
            .collect();
        let never = |score: &str| score.parse::<f64>().is_ok_and(|s| s >= NEVER as f64);
        let stale: Vec<&(String, String)> = entries
            .iter()
            .filter(|(m, score)| never(score) && !holding.contains(m.as_str()))
            .collect();
        for chunk in stale.chunks(100) {
            let mut inv = SCRIPTS.index.prepare_invoke();
            inv.key(&index).arg("fix");
            for (member, score) in chunk {
                inv.arg(member).arg(score).arg("-");
            }
            self.inner.conn.invoke(&inv).await.map_err(map_err)?;
        }
        let work = found
            .into_iter()
            .filter(|(_, info)| info.holds_work())
            .collect();
        Ok((work, all))
    }

    /// The keys under the store's prefix that hold records, found by a scan of every primary of
    /// a cluster that the servers give about `limit` keys to examine (pages of `SCAN_COUNT`: a
    /// server shared with other data examines those too): at most `limit` of them, and
    /// whether the scan went through every key. For operators, never on a request's path.
    async fn scan(&self, limit: usize) -> Result<(Vec<String>, bool)> {
        let pages = limit.div_ceil(SCAN_COUNT).max(1);
        let (mut names, all) = self.scan_keys(pages, limit.saturating_add(1)).await?;
        names = self.records_only(names);
        let all = all && names.len() <= limit;
        names.truncate(limit);
        Ok((names, all))
    }

    /// The keys under the store's prefix (the completer's index among them), on every primary
    /// of a cluster, in at most `pages` SCAN calls (shared between the primaries, at least one
    /// each) and until at least `enough` are found (each primary its share); and whether the
    /// scan went through every key.
    async fn scan_keys(&self, mut pages: usize, enough: usize) -> Result<(Vec<String>, bool)> {
        let pattern = format!("{}*", glob_escape(&self.inner.prefix));
        let scan = |cursor: &str| {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
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
                    pages = pages.saturating_sub(1);
                    cursor = scan_page(page, &mut names)?;
                    if cursor == "0" {
                        return Ok((names, true));
                    }
                    if names.len() >= enough || pages == 0 {
                        return Ok((names, false));
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
                let mut all = true;
                let Value::Map(nodes) = first else {
                    return Err(protocol(format!(
                        "SCAN on every primary answered {first:?}"
                    )));
                };
                // Each primary examines its share of the keys.
                let share = pages.div_ceil(nodes.len().max(1));
                let enough = enough.div_ceil(nodes.len().max(1));
                for (addr, page) in nodes {
                    let addr =
                        text(&addr).ok_or_else(|| protocol("a node address that is not text"))?;
                    let (host, port) = addr
                        .rsplit_once(':')
                        .and_then(|(h, p)| Some((h.to_owned(), p.parse::<u16>().ok()?)))
                        .ok_or_else(|| protocol(format!("a node address {addr:?}")))?;
                    let before = names.len();
                    let mut left = share.saturating_sub(1);
                    let mut cursor = scan_page(page, &mut names)?;
                    while cursor != "0" {
                        if names.len() - before >= enough || left == 0 {
                            all = false;
                            break;
                        }
                        left -= 1;
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
                Ok((names, all))
            }
        }
    }

    /// The record's key and the claim's identity and fence: the first arguments of every fenced
    /// script.
    fn fenced<'i>(
        &self,
        inv: &'i mut ScriptInvocation<'static>,
        claim: ClaimRef<'_>,
    ) -> &'i mut ScriptInvocation<'static> {
        inv.key(self.record_key(claim.scope, claim.key))
            .arg(identity(claim.scope, claim.key))
            .arg(claim.fence)
    }

    /// A completed record, as `GET` or the begin script answered it: checked here whole, then
    /// replayed or refused.
    fn answer_completed(&self, value: &[u8], req: &BeginRequest<'_>) -> Result<BeginOutcome> {
        let record = self.unpack(value, req.scope, req.key)?;
        match record.response {
            Some(response) if record.fingerprint == *req.fingerprint => {
                Ok(BeginOutcome::Replay(response))
            }
            Some(_) => Ok(BeginOutcome::KeyReused),
            None => Err(protocol("a record marked completed without its answer")),
        }
    }

    async fn run_begin(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        let name = self.record_key(req.scope, req.key);
        let read_first = &self.inner.read_first;
        let read = read_first.now();
        if read {
            match self.inner.conn.get(&name).await {
                // A completed record, exactly what the script would answer with.
                Ok(Value::BulkString(value)) if value.starts_with(COMPLETED) => {
                    read_first.answered();
                    return self.answer_completed(&value, &req);
                }
                // The server is not there, or not ready: the script would fail alike.
                Err(e) if is_transient(&e) => return Err(map_err(e)),
                // Nothing, a claim, or a value that is not a string (a `WRONGTYPE` refusal):
                // the script decides, and names what is wrong.
                _ => read_first.missed(),
            }
        }
        if req.request.is_some() {
            // Before the record: a claim that is written must have its entry.
            self.index_set(&name, IndexAt::In(req.policy.lease)).await?;
        }
        let ident = identity(req.scope, req.key);
        let first_line_end = format!(" 1 - - {} - 0\n", ident.len());
        let mut inv = SCRIPTS.begin.prepare_invoke();
        inv.key(&name)
            .arg(ident)
            .arg(&req.fingerprint.as_bytes()[..])
            .arg(ms(req.policy.lease))
            .arg(ms(req.policy.retain))
            .arg(match req.policy.expired_lease {
                ExpiredLease::FailClosed => "0",
                _ => "1",
            })
            .arg(first_line_end);
        if let Some(request) = req.request {
            inv.arg(request);
        }
        let answer = self.inner.conn.invoke(&inv).await.map_err(map_err)?;
        // A completed record, as it is: checked here whole, then replayed or refused.
        if let Value::BulkString(value) = &answer {
            if !read {
                read_first.answered();
            }
            return self.answer_completed(value, &req);
        }
        if !read {
            // Only a completed record would have been answered by a read.
            read_first.missed();
        }
        let reply = match answer {
            // begin_fast.lua's first claim: its fence alone (never for a resumable claim,
            // whose index entry needs the lease the array carries).
            Value::Int(fence) if req.request.is_none() => {
                return Ok(BeginOutcome::Claimed(Claimed {
                    fence: non_negative(fence)?,
                    reclaimed: false,
                    attempt: 1,
                    recovery_point: None,
                }));
            }
            other => items(other)?,
        };
        match tag(&reply)? {
            1 => {
                let claimed = Claimed {
                    fence: int_at(&reply, 1).and_then(non_negative)?,
                    reclaimed: int_at(&reply, 2)? == 1,
                    attempt: int_at(&reply, 3).and_then(non_negative).and_then(|n| {
                        u32::try_from(n).map_err(|_| protocol(format!("attempt {n} out of range")))
                    })?,
                    recovery_point: opt_bytes_at(&reply, 4)?,
                };
                if req.request.is_some() {
                    // After the record too: a `due` that read the entry before the claim was
                    // written, and the record as it was, cannot remove it now (the score
                    // changed).
                    let lease_until = int_at(&reply, 5)?;
                    self.index_after(&name, IndexAt::At(lease_until)).await;
                }
                Ok(BeginOutcome::Claimed(claimed))
            }
            3 => Ok(BeginOutcome::InProgress {
                retry_after: Duration::from_millis(int_at(&reply, 1).and_then(non_negative)?),
            }),
            4 => Ok(BeginOutcome::KeyReused),
            5 => Ok(BeginOutcome::Parked),
            0 => Err(not_ours(self, req.scope, req.key, &reply)),
            other => Err(protocol(format!("the begin script answered tag {other}"))),
        }
    }

    async fn run_complete(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        let status = response
            .status
            .map_or_else(|| "-".to_owned(), |s| s.to_string());
        let error = if response.is_error { "1" } else { "0" };
        let ident_len = identity(claim.scope, claim.key).len();
        let fence = claim.fence;
        let mut inv = SCRIPTS.complete.prepare_invoke();
        self.fenced(&mut inv, claim)
            .arg(&status)
            .arg(error)
            .arg(&response.body[..])
            // The parts complete_fast.lua puts around what it keeps of the record.
            .arg(format!("idem2 i {fence} "))
            .arg(format!("idem2 c {fence} "))
            .arg(format!(
                " {status} {error} {ident_len} - {}\n",
                response.body.len()
            ))
            .arg(ident_len);
        self.write(claim, &inv).await
    }

    /// The name of the completer's index: `{prefix}{due}` (a hash tag of its own: in a cluster,
    /// one slot), which no record's name can be (theirs are 32 hex digits in braces).
    pub fn due_key(&self) -> String {
        format!("{}{{due}}", self.inner.prefix)
    }

    /// Writes the index entry of the record `name` (see `index.lua`).
    async fn index_set(&self, name: &str, at: IndexAt) -> Result<()> {
        let mut inv = SCRIPTS.index.prepare_invoke();
        inv.key(self.due_key()).arg("set").arg(name);
        match at {
            IndexAt::At(ms) => inv.arg(ms).arg(0u64),
            IndexAt::In(d) => inv.arg("").arg(ms(d)),
        };
        self.inner.conn.invoke(&inv).await.map_err(map_err)?;
        Ok(())
    }

    /// The entry written again once the record is: the record's write succeeded, so its
    /// caller is answered whatever becomes of this (the entry written before it still stands,
    /// unless a `due` removed it in between, which is what this write is for).
    async fn index_after(&self, name: &str, at: IndexAt) {
        if let Err(e) = self.index_set(name, at).await {
            tracing::warn!(
                target: "idem",
                key = %name,
                error = %e,
                "could not write the completer's index entry of a resumable record after the record: it is found from the entry written before it"
            );
        }
    }

    async fn run_suspend(
        &self,
        claim: ClaimRef<'_>,
        note: &str,
        resume_in: Duration,
    ) -> Result<()> {
        let name = self.record_key(claim.scope, claim.key);
        // Before the record, so that the work it will hold has its entry whatever happens
        // next: due now, so that `due` puts it where it belongs if this write goes no further.
        self.index_set(&name, IndexAt::In(Duration::ZERO)).await?;
        let mut inv = SCRIPTS.suspend.prepare_invoke();
        self.fenced(&mut inv, claim).arg(note).arg(ms(resume_in));
        let reply = self.run(&inv).await?;
        match tag(&reply)? {
            1 => {}
            2 => return Err(Error::FenceLost { fence: claim.fence }),
            0 => return Err(not_ours(self, claim.scope, claim.key, &reply)),
            other => return Err(protocol(format!("the suspend script answered tag {other}"))),
        }
        // A resumable claim's entry moves to the resume time, which may come before the end of
        // the lease it was written with; one that stores no request is work only its retry or
        // an operator takes.
        let at = match reply.get(1) {
            Some(Value::Int(resume_at)) => *resume_at,
            _ => NEVER,
        };
        self.index_after(&name, IndexAt::At(at)).await;
        Ok(())
    }

    async fn run_retry(&self, scope: &str, key: &str) -> Result<Retried> {
        let name = self.record_key(scope, key);
        // Before the record, as a claim's: parked work made due must have its entry.
        self.index_set(&name, IndexAt::In(Duration::ZERO)).await?;
        let mut inv = SCRIPTS.retry.prepare_invoke();
        inv.key(&name).arg(identity(scope, key));
        let reply = self.run(&inv).await?;
        match tag(&reply)? {
            1 => Ok(Retried::NotFound),
            2 => Ok(Retried::NotParked(state_at(&reply, 1)?)),
            3 => {
                let fence = int_at(&reply, 1).and_then(non_negative)?;
                let at = match int_at(&reply, 3)? {
                    1 => int_at(&reply, 2)?,
                    _ => NEVER,
                };
                self.index_after(&name, IndexAt::At(at)).await;
                Ok(Retried::Retried { fence })
            }
            0 => Err(not_ours(self, scope, key, &reply)),
            other => Err(protocol(format!("the retry script answered tag {other}"))),
        }
    }

    /// At most `limit` claims due to the completer: the index's entries whose time came, read
    /// in pages, each checked against its record (see `index.lua`); then the index fixed for
    /// the entries that were early or whose record holds no resumable work any more.
    async fn run_due(&self, limit: usize) -> Result<Vec<Unfinished>> {
        const PAGE: usize = 200;
        let index = self.due_key();
        let mut due: Vec<(i64, Unfinished)> = Vec::new();
        // (member, score as read, new time or None to remove)
        let mut fixes: Vec<(String, String, Option<i64>)> = Vec::new();
        let mut offset = 0usize;
        while limit > 0 && due.len() < limit {
            let mut inv = SCRIPTS.index.prepare_invoke();
            inv.key(&index).arg("page").arg(offset).arg(PAGE);
            let entries = index_page(self.inner.conn.invoke(&inv).await.map_err(map_err)?)?;
            let reads = futures_util::future::join_all(
                entries
                    .iter()
                    .map(|(member, _)| self.due_read(&index, member)),
            )
            .await;
            for ((member, score), read) in entries.iter().zip(reads) {
                match read? {
                    Some(Ok((since, unfinished))) => due.push((since, unfinished)),
                    Some(Err(at)) => fixes.push((member.clone(), score.clone(), Some(at))),
                    None => fixes.push((member.clone(), score.clone(), None)),
                }
            }
            if entries.len() < PAGE {
                break;
            }
            offset += PAGE;
        }
        for chunk in fixes.chunks(100) {
            let mut inv = SCRIPTS.index.prepare_invoke();
            inv.key(&index).arg("fix");
            for (member, score, at) in chunk {
                inv.arg(member).arg(score);
                match at {
                    Some(at) => inv.arg(*at),
                    None => inv.arg("-"),
                };
            }
            self.inner.conn.invoke(&inv).await.map_err(map_err)?;
        }
        due.sort_by_key(|(since, _)| *since);
        due.truncate(limit);
        Ok(due.into_iter().map(|(_, u)| u).collect())
    }

    /// The record an index entry names, for `due`: `Ok` with when it became due when it is
    /// due; `Err` with when it will be when it is resumable work not due yet; `None` when it
    /// holds no resumable work (its entry is removed).
    async fn due_read(
        &self,
        index: &str,
        member: &str,
    ) -> Result<Option<Result<(i64, Unfinished), i64>>> {
        self.check_member(index, member)?;
        let Some(read) = self.read(member, None).await? else {
            return Ok(None);
        };
        let record = read.record;
        if self.record_key(&record.scope, &record.key) != member {
            return Err(self.not_a_record(member, None, "the record of another scope and key"));
        }
        let holds_work = crate::lifecycle::unfinished(
            record.state,
            record.request.is_some(),
            record.note.is_some(),
        );
        let (State::InProgress, Some(request), Some(resume_at)) =
            (record.state, record.request, record.resume_at)
        else {
            // Work the completer cannot take stays listed for operators; none, unlisted.
            return Ok(holds_work.then_some(Err(NEVER)));
        };
        let since = record.lease_until.max(resume_at);
        if since > read.now {
            return Ok(Some(Err(since)));
        }
        Ok(Some(Ok((
            since,
            Unfinished::new(
                record.scope,
                record.key,
                record.fence,
                record.attempt,
                record.fingerprint,
                request,
                record.note,
                RecordInfo::ms_left(read.now - since),
            ),
        ))))
    }

    /// An error unless `member`, an entry of the completer's index `index`, is the name of a
    /// record under the store's prefix.
    fn check_member(&self, index: &str, member: &str) -> Result<()> {
        let is_record_name = member
            .strip_prefix(self.inner.prefix.as_str())
            .and_then(|rest| rest.strip_prefix('{'))
            .and_then(|rest| rest.strip_suffix('}'))
            .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| HEX.contains(&b)));
        if is_record_name {
            return Ok(());
        }
        Err(Error::Store(
            format!(
                "the completer's index {index} holds {member:?}, which is not the name of a record under the store's prefix"
            )
            .into(),
        ))
    }

    async fn run_lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        let Some(read) = self
            .read(&self.record_key(scope, key), Some((scope, key)))
            .await?
        else {
            return Ok(None);
        };
        let record = read.record;
        let (state, response, lease_remaining) = match record.state {
            State::Released => return Ok(None),
            State::Parked => (RecordState::Parked, None, None),
            State::Completed => (RecordState::Completed, record.response, None),
            State::InProgress => (
                RecordState::InProgress,
                None,
                Some(Duration::from_millis(
                    u64::try_from(record.lease_until - read.now).unwrap_or(0),
                )),
            ),
        };
        Ok(Some(Record {
            fingerprint: record.fingerprint,
            state,
            fence: record.fence,
            response,
            lease_remaining,
        }))
    }

    /// The record under the Redis key `name`, read whole with the server's clock and the key's
    /// remaining retention: checked against `identity` when one is given, else whatever
    /// identity it holds (a key found by a scan).
    async fn read(&self, name: &str, identity: Option<(&str, &str)>) -> Result<Option<Read>> {
        let mut inv = SCRIPTS.read.prepare_invoke();
        inv.key(name);
        let reply = self.run(&inv).await?;
        match tag(&reply)? {
            1 => {}
            0 => return Err(self.not_a_record(name, identity, &text_at(&reply, 1))),
            other => return Err(protocol(format!("the read script answered tag {other}"))),
        }
        let Some(value) = opt_bytes_at(&reply, 1)? else {
            return Ok(None);
        };
        let record = match identity {
            Some((scope, key)) => self.unpack(&value, scope, key)?,
            None => unpack(&value).map_err(|why| self.not_a_record(name, None, &why))?,
        };
        Ok(Some(Read {
            record,
            now: int_at(&reply, 2)?,
            retention_left: int_at(&reply, 3)?,
        }))
    }

    /// `value` checked as the record of `(scope, key)`, and decoded.
    fn unpack(&self, value: &[u8], scope: &str, key: &str) -> Result<Unpacked> {
        let name = self.record_key(scope, key);
        let record =
            unpack(value).map_err(|why| self.not_a_record(&name, Some((scope, key)), &why))?;
        if record.scope != scope || record.key != key {
            return Err(self.not_a_record(
                &name,
                Some((scope, key)),
                "the record of another scope and key",
            ));
        }
        Ok(record)
    }

    /// The Redis key `name` holds something that is not an idem record (of this identity, when
    /// one is given), for the reason `why`.
    fn not_a_record(&self, name: &str, identity: Option<(&str, &str)>, why: &str) -> Error {
        match identity {
            Some((scope, key)) => Error::Store(
                format!(
                    "the Redis key {name} for scope {scope:?} and key {key:?} holds {why}, not an idem record: refusing to touch it (nothing was run)"
                )
                .into(),
            ),
            None => Error::Store(
                format!(
                    "the Redis key {name} under the store's prefix holds {why}, not an idem record"
                )
                .into(),
            ),
        }
    }
}

/// When an index entry says its record becomes due.
#[derive(Debug, Clone, Copy)]
enum IndexAt {
    /// At this time of the record's server, in ms.
    At(i64),
    /// This long from now on the index's server.
    In(Duration),
}

/// A record read whole (`read.lua`).
struct Read {
    record: Unpacked,
    /// The server's clock, ms since the epoch.
    now: i64,
    /// The key's time to live in ms (`PTTL`: -1 for none).
    retention_left: i64,
}

/// A record decoded from its value (the format is described in `record.lua`).
#[derive(Debug)]
struct Unpacked {
    state: State,
    fence: u64,
    lease_until: i64,
    attempt: u32,
    scope: String,
    key: String,
    fingerprint: Fingerprint,
    recovery: Option<Vec<u8>>,
    /// The stored response of a completed record.
    response: Option<StoredResponse>,
    /// The stored request of a resumable claim (format 3).
    request: Option<Vec<u8>>,
    /// Why its last attempt did not finish, or why it was parked (format 3).
    note: Option<String>,
    /// When the completer may resume it, on the server's clock (format 3).
    resume_at: Option<i64>,
    /// When its retention ends, for a record without an expiry of its own (format 3).
    expires_at: Option<i64>,
}

/// The identity of `(scope, key)` as a record stores it: the scope's length in decimal, a
/// space, the scope, the key.
fn identity(scope: &str, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(scope.len() + key.len() + 5);
    out.extend_from_slice(scope.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(scope.as_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

/// Decodes a record's value (format 2 or 3), with every check `parse` in `record.lua` makes;
/// the reason when `value` is not a record.
fn unpack(value: &[u8]) -> Result<Unpacked, String> {
    let malformed = || "a value whose first line is not that of an idem record".to_owned();
    let Some(newline) = value.iter().position(|&b| b == b'\n') else {
        return Err(malformed());
    };
    let head = std::str::from_utf8(&value[..newline]).map_err(|_| malformed())?;
    let parts: Vec<&str> = head.split(' ').collect();
    if let Some(version) = parts[0].strip_prefix("idem")
        && version != "2"
        && version != "3"
        && !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit())
        && parts.len() > 1
    {
        return Err(format!("a record of unknown format version {version}"));
    }
    let (common, work): (&[&str], &[&str]) = match &parts[..] {
        ["idem2", common @ ..] if common.len() == 9 => (common, &["-", "-", "-", "-"]),
        ["idem3", common @ ..] if common.len() == 13 => common.split_at(9),
        _ => return Err(malformed()),
    };
    let &[
        state,
        fence,
        lease_until,
        attempt,
        status,
        error,
        ilen,
        rlen,
        blen,
    ] = common
    else {
        return Err(malformed());
    };
    let &[qlen, nlen, resume_at, expires_at] = work else {
        return Err(malformed());
    };
    let digits = |s: &str, max: usize| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then_some(())
            .ok_or_else(malformed)?;
        if s.len() > max {
            return Err("a record whose numbers are out of range".to_owned());
        }
        s.parse::<u64>().map_err(|_| malformed())
    };
    let optional = |s: &str, max: usize| match s {
        "-" => Ok(None),
        n => digits(n, max).map(Some),
    };
    let state = match (state, parts[0]) {
        ("i", _) => State::InProgress,
        ("c", _) => State::Completed,
        ("r", _) => State::Released,
        ("p", "idem3") => State::Parked,
        _ => return Err(malformed()),
    };
    if !(status == "-" || (!status.is_empty() && status.bytes().all(|b| b.is_ascii_digit()))) {
        return Err(malformed());
    }
    let error = match error {
        "0" => Some(false),
        "1" => Some(true),
        "-" => None,
        _ => return Err(malformed()),
    };
    let fence = digits(fence, 15)?;
    let lease_until = digits(lease_until, 15)?;
    let attempt = digits(attempt, 9)?;
    let ilen = digits(ilen, 9)?;
    let rlen = optional(rlen, 9)?;
    let blen = digits(blen, 9)?;
    let (qlen, nlen) = (optional(qlen, 9)?, optional(nlen, 9)?);
    let time = |n: Option<u64>| {
        n.map(|n| i64::try_from(n).map_err(|_| malformed()))
            .transpose()
    };
    let resume_at = time(optional(resume_at, 15)?)?;
    let expires_at = time(optional(expires_at, 15)?)?;
    let len = |n: u64| usize::try_from(n).map_err(|_| malformed());
    let (ilen, rlen_n, blen) = (len(ilen)?, len(rlen.unwrap_or(0))?, len(blen)?);
    let (qlen_n, nlen_n) = (len(qlen.unwrap_or(0))?, len(nlen.unwrap_or(0))?);
    let rest = &value[newline + 1..];
    if rest.len() != ilen + 32 + rlen_n + blen + qlen_n + nlen_n {
        return Err("a record whose length is not what its first line says".to_owned());
    }
    let (ident, rest) = rest.split_at(ilen);
    let (fp, rest) = rest.split_at(32);
    let (recovery, rest) = rest.split_at(rlen_n);
    let (body, rest) = rest.split_at(blen);
    let (request, note) = rest.split_at(qlen_n);
    let bad_identity = || "a record whose identity is malformed".to_owned();
    let space = ident
        .iter()
        .position(|&b| b == b' ')
        .ok_or_else(bad_identity)?;
    let scope_len: usize = std::str::from_utf8(&ident[..space])
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad_identity)?;
    let names = &ident[space + 1..];
    if names.len() < scope_len {
        return Err(bad_identity());
    }
    let (scope, key) = names.split_at(scope_len);
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| bad_identity());
    let response = match (state, error) {
        (State::Completed, Some(is_error)) => Some(StoredResponse {
            status: match status {
                "-" => None,
                s => Some(
                    s.parse::<u16>()
                        .map_err(|_| "a completed record whose response is malformed".to_owned())?,
                ),
            },
            is_error,
            body: bytes::Bytes::copy_from_slice(body),
        }),
        (State::Completed, None) => {
            return Err("a completed record whose response is malformed".to_owned());
        }
        (_, None) if status == "-" && blen == 0 => None,
        _ => return Err("a record in progress or released with a response".to_owned()),
    };
    let note = match nlen {
        None => None,
        Some(_) => Some(
            String::from_utf8(note.to_vec())
                .map_err(|_| "a record whose note is not text".to_owned())?,
        ),
    };
    Ok(Unpacked {
        state,
        fence,
        lease_until: i64::try_from(lease_until).map_err(|_| malformed())?,
        attempt: u32::try_from(attempt).map_err(|_| malformed())?,
        scope: text(scope)?,
        key: text(key)?,
        fingerprint: Fingerprint::from_slice(fp).ok_or_else(malformed)?,
        recovery: rlen.map(|_| recovery.to_vec()),
        response,
        request: qlen.map(|_| request.to_vec()),
        note,
        resume_at,
        expires_at,
    })
}

// ---- replies -----------------------------------------------------------------------------------

fn protocol(what: impl Into<String>) -> Error {
    Error::Store(format!("unexpected answer from Redis: {}", what.into()).into())
}

/// A script's answer as the array it should be.
fn items(answer: Value) -> Result<Vec<Value>> {
    match answer {
        Value::Array(items) => Ok(items),
        other => Err(protocol(format!(
            "a script answered {other:?} instead of an array"
        ))),
    }
}

fn tag(reply: &[Value]) -> Result<i64> {
    int_at(reply, 0)
}

/// A page of the completer's index: its members with their scores as the server wrote them.
fn index_page(page: Value) -> Result<Vec<(String, String)>> {
    let Value::Array(items) = page else {
        return Err(protocol(format!("the index answered {page:?}")));
    };
    items
        .chunks(2)
        .map(|pair| match pair {
            [member, score] => Some((text(member)?, text(score)?)),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| protocol("an index page that is not members and scores"))
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

/// A record's state as the scripts write it (`i`, `c`, `r`, `p`), at `i` of `reply`.
fn state_at(reply: &[Value], i: usize) -> Result<State> {
    match &bytes_at(reply, i)?[..] {
        b"i" => Ok(State::InProgress),
        b"c" => Ok(State::Completed),
        b"r" => Ok(State::Released),
        b"p" => Ok(State::Parked),
        _ => Err(protocol("a script answered an unknown state")),
    }
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

/// The key holds something that is not an idem record of this identity.
fn not_ours(store: &RedisStore, scope: &str, key: &str, reply: &[Value]) -> Error {
    store.not_a_record(
        &store.record_key(scope, key),
        Some((scope, key)),
        &text_at(reply, 1),
    )
}

/// The text at `i` of a script's answer: the reason it gives.
fn text_at(reply: &[Value], i: usize) -> String {
    reply
        .get(i)
        .and_then(text)
        .unwrap_or_else(|| "something unreadable".into())
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
