//! The builder every SQL store starts from, and what each offers the same way on its engine.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::sweeper::DEFAULT_PURGE_EVERY;

use super::*;

/// The default table name of the SQL stores.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// How long a pooled connection to a database server may have sat idle and still be lent
/// without a ping first (see [`ping_when_idle`]).
pub(crate) const LENT_UNPINGED_WITHIN: Duration = Duration::from_millis(500);

/// Pool options that ping a connection before lending it only when it has been idle for half a
/// second or more, as the pools of `PgStore::connect` and `MySqlStore::connect` do: for a pool
/// of your own, shared with the store.
///
/// sqlx pings every connection before lending it by default: on a database server, a round trip
/// before each statement, about as long as the statement itself on a busy pool. A connection
/// that went back to the pool less than half a second ago answered its last statement then (and
/// sqlx pings it as it goes back). What closes one in between, a server restart or failover, or
/// a proxy that cuts idle connections, fails the one statement it is lent for, with an error
/// the stores report as [`Error::Unavailable`] (503, which a client retries), and the
/// connection is dropped. Past the half second the ping finds it closed, and the pool lends a
/// new one instead.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::store::ping_when_idle;
/// use sqlx::postgres::PgPoolOptions;
///
/// let pool = ping_when_idle(PgPoolOptions::new())
///     .max_connections(16)
///     .connect("postgres://postgres@127.0.0.1/app")
///     .await?;
/// let store = idem::PgStore::builder().build(pool.clone()).await?;
/// # Ok(()) }
/// ```
///
/// It sets `test_before_acquire(false)` and a `before_acquire` hook: a hook of your own set
/// after it replaces it.
pub fn ping_when_idle<DB: sqlx::Database>(
    options: sqlx::pool::PoolOptions<DB>,
) -> sqlx::pool::PoolOptions<DB> {
    options
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= LENT_UNPINGED_WITHIN {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// What every SQL store offers the same way, on its engine (`inner`): `Debug`, `builder`, `new`,
/// `table`, `migrate`, and the transactional methods that need no dialect. With
/// `engine_calls`, also `Store` itself, every operation run by the engine as it is (a store
/// that batches, as PostgreSQL's, implements `Store` itself).
macro_rules! engine_store_api {
    ($store:ident, $pool:ty, $db:ty, $conn:ty, engine_calls) => {
        impl Store for $store {
            async fn call(&self, op: Operation<'_>) -> Result<Reply> {
                match op {
                    Operation::Begin(req) => self.inner.begin(None, &req).await.map(Reply::Begun),
                    op => {
                        let ends = crate::store::ends(&op);
                        crate::store::announced(&self.inner.changes, ends, self.inner.call(op))
                            .await
                    }
                }
            }

            fn defer(&self, write: crate::store::Deferred) {
                crate::store::spawn_deferred(self.clone(), write)
            }

            fn changes(&self) -> Option<&crate::store::Changes> {
                Some(&self.inner.changes)
            }
        }

        $crate::store::sql::engine_store_api!($store, $pool, $db, $conn);
    };
    ($store:ident, $pool:ty, $db:ty, $conn:ty) => {
        impl fmt::Debug for $store {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("table", &self.inner.sql.table)
                    .finish_non_exhaustive()
            }
        }

        impl $store {
            /// A builder with the default table name, creating the table.
            pub fn builder() -> SqlStoreBuilder<$store> {
                SqlStoreBuilder::default()
            }

            /// A store on `pool`, with the default table. The table is not created: call
            #[doc = concat!("[`", stringify!($store), "::migrate`], or use the builder.")]
            /// Expired records are purged in the background once a minute, as with the
            /// builder's defaults (inside a Tokio runtime); everything else is the builder's
            /// default too.
            pub fn new(pool: $pool) -> $store {
                $store::on_engine(
                    Engine::new(pool.clone(), pool, sql::DEFAULT_TABLE)
                        .expect("the default table name is valid")
                        .start(Some(crate::store::sweeper::DEFAULT_PURGE_EVERY)),
                )
            }

            /// The table name.
            pub fn table(&self) -> &str {
                &self.inner.sql.table
            }

            /// Creates the table and its indexes if missing, and brings a table created by an
            /// earlier version up to date. Any number of processes may do it at once: PostgreSQL
            /// migrates under an advisory lock, SQLite under its write lock, MySQL behind the
            /// table's metadata lock.
            pub async fn migrate(&self) -> Result<()> {
                self.inner.migrate().await
            }
        }

        impl TxStore for $store {
            type Database = $db;

            fn begin_transaction(
                &self,
            ) -> impl Future<Output = Result<sqlx::Transaction<'static, $db>>> + Send {
                self.inner.begin_transaction()
            }

            // A policy that would let a record expire under its running body never reaches
            // the store here either, as in `Store::begin` (`Policy::check`): the policy of a
            // transactional call may come from its context (`with_default_policy`, a consumer).
            async fn answer_first(&self, req: BeginRequest<'_>) -> Result<Option<BeginOutcome>> {
                req.policy.check()?;
                self.inner.answer_first_in_tx(&req).await
            }

            async fn begin_in(
                &self,
                conn: &mut $conn,
                req: BeginRequest<'_>,
            ) -> Result<BeginOutcome> {
                req.policy.check()?;
                self.begin_in_transaction(conn, req).await
            }

            fn complete_in(
                &self,
                conn: &mut $conn,
                claim: ClaimRef<'_>,
                response: &StoredResponse,
            ) -> impl Future<Output = Result<()>> + Send {
                self.inner.complete_on(conn, claim, response)
            }
        }
    };
}
pub(crate) use engine_store_api;

/// `Store` for a store that batches first claims and completions (its own `begin_grouped` and
/// `complete_grouped`) and runs every other operation on its engine as it is; `$changes` is the
/// path of its [`Changes`](crate::store::Changes) from `self`.
#[cfg(feature = "sql-groups")]
macro_rules! grouped_store {
    ($store:ident, $($changes:ident).+) => {
        impl Store for $store {
            async fn call(&self, op: Operation<'_>) -> Result<Reply> {
                match op {
                    Operation::Begin(req) => self.begin_grouped(req).await.map(Reply::Begun),
                    Operation::Complete { claim, response } => {
                        let done = async {
                            self.complete_grouped(claim, response)
                                .await
                                .map(|()| Reply::Done)
                        };
                        let ends = Some((claim.scope, claim.key));
                        crate::store::announced(&self.$($changes).+, ends, done).await
                    }
                    op => {
                        let ends = crate::store::ends(&op);
                        crate::store::announced(&self.$($changes).+, ends, self.inner.call(op))
                            .await
                    }
                }
            }

            fn defer(&self, write: crate::store::Deferred) {
                crate::store::spawn_deferred(self.clone(), write)
            }

            fn changes(&self) -> Option<&crate::store::Changes> {
                Some(&self.$($changes).+)
            }
        }
    };
}
#[cfg(feature = "sql-groups")]
pub(crate) use grouped_store;

/// Builds a SQL store: the table name, whether to create it, and how expired records are
/// purged. `PgStore::builder()` and `SqliteStore::builder()` start one; each store adds its own
/// `build` and `connect`.
///
/// # Retention
///
/// A record lives as long as its policy's retention (`retain`, 24 hours by default, set per
/// handler), then its identity is free again. The store built here deletes expired records in
/// the background: once a minute by default ([`purge_every`](Self::purge_every)), in batches
/// that give the database back to live requests in between (SQLite's one writer takes a claim
/// between two batches), on a task that starts with the store, is shared by all its clones and
/// ends when the last of them is dropped. A purge that fails is logged at `warn` and the next
/// one tries again. [`background_purge(false)`](Self::background_purge) turns it off, for a
/// database purged by other means (a job of its own, another service sharing the table).
#[derive(Debug, Clone)]
pub struct SqlStoreBuilder<S: SqlKind> {
    pub(crate) table: String,
    pub(crate) create_table: bool,
    pub(crate) read_first: Option<bool>,
    /// Whether the pool's sessions were set up by the store's own `connect`
    /// ([`Dialect::BEGIN_SET_UP`]).
    pub(crate) sessions_set_up: bool,
    purge_every: Duration,
    background_purge: bool,
    /// What only this kind of store sets (SQLite's has no settings).
    pub(crate) options: S::Options,
    store: PhantomData<fn() -> S>,
}

/// A kind of SQL store, as its builder knows it: what it sets that the others do not. Each SQL
/// store implements it; it cannot be implemented elsewhere.
pub trait SqlKind: sealed::Sealed {
    /// The settings only this store has (PostgreSQL's group commit, …), with their defaults.
    type Options: Default + Clone + fmt::Debug;
}

pub(crate) mod sealed {
    /// Only this crate's stores are SQL kinds.
    pub trait Sealed {}

    #[cfg(feature = "sql-waits")]
    /// A SQL store whose transactional duplicates wait within a bound, set by
    /// `SqlStoreBuilder::duplicate_wait` and `waiting_duplicates`.
    pub trait WaitingKind: super::SqlKind {
        /// Where its options keep those settings.
        fn waits(options: &mut Self::Options) -> &mut super::super::DuplicateWaits;
    }
}

impl<S: SqlKind> Default for SqlStoreBuilder<S> {
    fn default() -> Self {
        SqlStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            create_table: true,
            read_first: None,
            sessions_set_up: false,
            purge_every: DEFAULT_PURGE_EVERY,
            background_purge: true,
            options: S::Options::default(),
            store: PhantomData,
        }
    }
}

impl<S: SqlKind> SqlStoreBuilder<S> {
    /// Whether a claim always (`true`) or never (`false`) first reads the record on the
    /// readers (SQLite's reader pool, PostgreSQL's pool), and answers a replay or "in progress"
    /// from there without a write: a replay is then one `SELECT` that never waits for SQLite's
    /// writer, and in transactional mode no transaction opens for it. Inserting first makes a
    /// new key one statement, as in a hand-written guard, and an existing one an insert that
    /// does nothing and a read; reading first makes replays several times faster and new keys
    /// a statement dearer (a read, then the insert).
    ///
    /// By default the store chooses as it goes: it inserts first while claims are new keys,
    /// and reads first while recent claims found their record (more than about one in nine),
    /// in both modes. Fix it here for a workload known in advance. `BENCHMARKS.md` has all
    /// three. (PostgreSQL's group commit, when it batches, reads in its batch statement.)
    pub fn read_first(mut self, read_first: bool) -> Self {
        self.read_first = Some(read_first);
        self
    }

    /// The table holding the records (default `idem_records`): an identifier, checked
    /// (`schema.table` on PostgreSQL).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Whether to create the table and its index if missing (default: yes).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// How often expired records are deleted in the background (default: once a minute).
    /// Longer than zero; see [Retention](Self#retention).
    pub fn purge_every(mut self, every: Duration) -> Self {
        self.purge_every = every;
        self
    }

    /// Whether the store deletes expired records in the background (default: yes). Without
    /// it, expired records are never answered (a read checks their retention) but stay in the
    /// table until [`Store::purge_expired`](crate::Store::purge_expired) is called.
    pub fn background_purge(mut self, on: bool) -> Self {
        self.background_purge = on;
        self
    }

    /// The engine on these pools, its table created if asked for, purging in the background
    /// unless told not to; and the settings only this kind of store has.
    pub(crate) async fn open<D: Dialect>(
        self,
        writer: sqlx::Pool<D::Db>,
        reader: sqlx::Pool<D::Db>,
    ) -> Result<(Arc<Engine<D>>, S::Options)> {
        if self.background_purge && self.purge_every.is_zero() {
            return Err(Error::Config(
                "the background purge interval must be longer than zero".into(),
            ));
        }
        let mut engine = Engine::new(writer, reader, &self.table)?;
        if let Some(always) = self.read_first {
            engine.read_first = ReadFirst::always(always);
        }
        if self.sessions_set_up {
            engine.begin = D::BEGIN_SET_UP;
        }
        if self.create_table {
            engine.migrate().await?;
        } else {
            engine.check_format().await?;
        }
        let engine = engine.start(self.background_purge.then_some(self.purge_every));
        Ok((engine, self.options))
    }
}
