//! The PostgreSQL store: production, shared by any number of service instances.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row, SqlSafeStr as _, SqlStr};

use crate::error::{Error, Result};
use crate::lifecycle::{Decision, decide};
use crate::record::{
    BeginOutcome, BeginRequest, ClaimRef, Claimed, Record, RecordState, StoredResponse,
};
use crate::store::sql::{
    self, CurRow, DEFAULT_TABLE, contention, fence_from_db, fence_to_db, map_err, ms,
};
use crate::store::{Store, TxStore};

/// All idem migrations, in every schema, take this advisory lock: concurrent `CREATE TABLE IF
/// NOT EXISTS` statements can otherwise fail on PostgreSQL's catalog indexes.
const MIGRATION_LOCK: i64 = 0x1de3_0001;

/// A store on PostgreSQL.
///
/// Leases and retention are read against the database's `now()`, so instances with skewed
/// clocks agree. `begin` is one statement on the common paths: a data-modifying CTE that reads
/// the record and inserts it when absent (`INSERT … ON CONFLICT DO NOTHING`), and writes nothing
/// when it exists, so a replay costs a lookup. Taking over an abandoned, expired or released
/// record is a second statement, `UPDATE … WHERE fence = $n` with the conditions checked again.
/// `complete`, `release` and `checkpoint` are one `UPDATE … WHERE fence = $n` each; completion
/// changes no indexed column, so it is a HOT update on a table with room on its pages.
///
/// ```no_run
/// # async fn f() -> idem_runtime::Result<()> {
/// let store = idem_runtime::PgStore::connect("postgres://postgres@127.0.0.1/app").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    // One pointer: the macro clones the store on every call.
    inner: Arc<Shared>,
}

struct Shared {
    pool: PgPool,
    sql: Statements,
}

struct Statements {
    table: String,
    begin: SqlStr,
    reclaim: SqlStr,
    complete: SqlStr,
    release: SqlStr,
    checkpoint: SqlStr,
    lookup: SqlStr,
    purge: SqlStr,
    create: [SqlStr; 2],
}

fn sql(s: String) -> SqlStr {
    AssertSqlSafe(s).into_sql_str()
}

const MS: &str = "* interval '1 millisecond'";

impl Statements {
    fn new(table: &str) -> Result<Statements> {
        let t = sql::quote_table(table)?;
        let index = format!("\"{}_expires_at_idx\"", sql::base_name(table));
        Ok(Statements {
            table: table.to_owned(),
            // One statement on the common paths: a first claim inserts, anything else reads. It
            // writes nothing when the record exists, so a replay costs a lookup. Take-overs of
            // abandoned, expired or released records are the second statement below.
            begin: sql(format!(
                "WITH cur AS ( \
                   SELECT fence, fingerprint, state, response_status, response_error, response_body, \
                          expires_at <= now() AS expired, \
                          (EXTRACT(EPOCH FROM (lease_until - now())) * 1000)::int8 AS lease_left_ms \
                     FROM {t} WHERE scope = $1 AND key = $2 \
                 ), ins AS ( \
                   INSERT INTO {t} (scope, key, fingerprint, state, fence, lease_until, expires_at) \
                   SELECT $1, $2, $3, 'in_progress', (EXTRACT(EPOCH FROM now()) * 1000)::int8, \
                          now() + $4::int8 {MS}, now() + $5::int8 {MS} \
                    WHERE NOT EXISTS (SELECT 1 FROM cur) \
                   ON CONFLICT (scope, key) DO NOTHING \
                   RETURNING fence \
                 ) \
                 SELECT true AS inserted, fence, NULL::bytea AS fingerprint, NULL::text AS state, \
                        NULL::int4 AS response_status, false AS response_error, \
                        NULL::bytea AS response_body, false AS expired, 0::int8 AS lease_left_ms \
                   FROM ins \
                 UNION ALL \
                 SELECT false, fence, fingerprint, state, response_status, response_error, \
                        response_body, expired, lease_left_ms \
                   FROM cur"
            )),
            // The conditions are checked again against the row as it is now: since it was read,
            // another attempt may have completed, released or taken it over.
            reclaim: sql(format!(
                "UPDATE {t} SET fence = fence + 1, state = 'in_progress', fingerprint = $3, \
                 lease_until = now() + $4::int8 {MS}, expires_at = now() + $5::int8 {MS}, \
                 recovery_point = CASE WHEN state <> 'completed' AND expires_at > now() \
                   AND fingerprint = $3 THEN recovery_point END, \
                 response_status = NULL, response_error = false, response_body = NULL, \
                 updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND fence = $6 AND (expires_at <= now() \
                   OR state = 'released' \
                   OR (state = 'in_progress' AND lease_until <= now() AND fingerprint = $3 AND $7)) \
                 RETURNING fence, recovery_point"
            )),
            complete: sql(format!(
                "UPDATE {t} SET state = 'completed', response_status = $4, response_error = $5, \
                 response_body = $6, recovery_point = NULL, updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress' \
                 AND expires_at > now()"
            )),
            release: sql(format!(
                "UPDATE {t} SET state = 'released', updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress'"
            )),
            checkpoint: sql(format!(
                "UPDATE {t} SET recovery_point = $4, lease_until = now() + $5::int8 {MS}, \
                 updated_at = now() \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress' \
                 AND expires_at > now()"
            )),
            lookup: sql(format!(
                "SELECT fingerprint, state, fence, response_status, response_error, response_body, \
                 (EXTRACT(EPOCH FROM (lease_until - now())) * 1000)::int8 AS lease_left_ms \
                 FROM {t} WHERE scope = $1 AND key = $2 AND state <> 'released' \
                 AND expires_at > now()"
            )),
            purge: sql(format!(
                "WITH gone AS (DELETE FROM {t} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {t} WHERE expires_at <= now() LIMIT 10000)) RETURNING 1) \
                 SELECT count(*) FROM gone"
            )),
            create: [
                // fillfactor 80 leaves room on each page for the completion's update to stay on
                // its page: it changes no indexed column, so it is a HOT update.
                sql(format!(
                    "CREATE TABLE IF NOT EXISTS {t} ( \
                     scope text NOT NULL, \
                     key text NOT NULL, \
                     fingerprint bytea NOT NULL, \
                     state text NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')), \
                     fence bigint NOT NULL, \
                     lease_until timestamptz NOT NULL, \
                     expires_at timestamptz NOT NULL, \
                     recovery_point bytea, \
                     response_status integer, \
                     response_error boolean NOT NULL DEFAULT false, \
                     response_body bytea, \
                     created_at timestamptz NOT NULL DEFAULT now(), \
                     updated_at timestamptz NOT NULL DEFAULT now(), \
                     PRIMARY KEY (scope, key)) WITH (fillfactor = 80)"
                )),
                sql(format!(
                    "CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at)"
                )),
            ],
        })
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.inner.sql.table)
            .finish_non_exhaustive()
    }
}

/// Builds a [`PgStore`]: table name, whether to create the table.
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    table: String,
    create_table: bool,
}

impl PgStoreBuilder {
    /// The table holding the records (default `idem_records`): an identifier, optionally
    /// `schema.table`, checked.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Whether to create the table and its index if missing (default: yes).
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// A store on an existing pool.
    pub async fn build(self, pool: PgPool) -> Result<PgStore> {
        let store = PgStore {
            inner: Arc::new(Shared {
                pool,
                sql: Statements::new(&self.table)?,
            }),
        };
        if self.create_table {
            store.migrate().await?;
        }
        Ok(store)
    }

    /// Connects a pool to `url` and builds the store on it.
    pub async fn connect(self, url: &str) -> Result<PgStore> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(url)
            .await
            .map_err(map_err)?;
        self.build(pool).await
    }
}

impl PgStore {
    /// A builder with the default table name, creating the table.
    pub fn builder() -> PgStoreBuilder {
        PgStoreBuilder {
            table: DEFAULT_TABLE.to_owned(),
            create_table: true,
        }
    }

    /// Connects to `url` and creates the table if missing.
    pub async fn connect(url: &str) -> Result<PgStore> {
        PgStore::builder().connect(url).await
    }

    /// A store on `pool`, with the default table. The table is not created: call
    /// [`PgStore::migrate`], or use the builder.
    pub fn new(pool: PgPool) -> PgStore {
        PgStore {
            inner: Arc::new(Shared {
                pool,
                sql: Statements::new(DEFAULT_TABLE).expect("the default table name is valid"),
            }),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The table name.
    pub fn table(&self) -> &str {
        &self.inner.sql.table
    }

    /// Creates the table and its index if missing, under an advisory lock, so any number of
    /// instances can start at once.
    pub async fn migrate(&self) -> Result<()> {
        let mut tx = self.inner.pool.begin().await.map_err(map_err)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        for stmt in &self.inner.sql.create {
            sqlx::query(stmt.clone())
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }

    async fn begin_on(
        &self,
        conn: &mut PgConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        for _ in 0..8 {
            let row = sqlx::query(self.inner.sql.begin.clone())
                .bind(req.scope)
                .bind(req.key)
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(ms(req.policy.lease))
                .bind(ms(req.policy.retain))
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?;
            // No row: a concurrent first claim committed after this statement's snapshot was
            // taken (our insert waited for it, then did nothing). The next statement sees it.
            let Some(row) = row else { continue };
            if row.try_get::<bool, _>("inserted").map_err(map_err)? {
                return Ok(BeginOutcome::Claimed(Claimed {
                    fence: fence_from_db(row.try_get("fence").map_err(map_err)?)?,
                    reclaimed: false,
                    recovery_point: None,
                }));
            }
            let cur = cur_row(&row)?;
            match decide(cur.seen(req.fingerprint), req.policy) {
                Decision::Claim { reclaim, .. } => {
                    let updated = sqlx::query(self.inner.sql.reclaim.clone())
                        .bind(req.scope)
                        .bind(req.key)
                        .bind(&req.fingerprint.as_bytes()[..])
                        .bind(ms(req.policy.lease))
                        .bind(ms(req.policy.retain))
                        .bind(cur.fence)
                        .bind(req.policy.expired_lease == crate::record::ExpiredLease::Reclaim)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(map_err)?;
                    if let Some(row) = updated {
                        return Ok(BeginOutcome::Claimed(Claimed {
                            fence: fence_from_db(row.try_get("fence").map_err(map_err)?)?,
                            reclaimed: reclaim,
                            recovery_point: row.try_get("recovery_point").map_err(map_err)?,
                        }));
                    }
                    // Lost a race with another attempt: look again.
                }
                Decision::Replay => return Ok(BeginOutcome::Replay(cur.into_response())),
                Decision::InProgress(retry_after) => {
                    return Ok(BeginOutcome::InProgress { retry_after });
                }
                Decision::KeyReused => return Ok(BeginOutcome::KeyReused),
            }
        }
        Err(contention(req.scope, req.key))
    }

    async fn complete_on(
        &self,
        conn: &mut PgConnection,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        let done = sqlx::query(self.inner.sql.complete.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(fence_to_db(claim.fence))
            .bind(response.status.map(i32::from))
            .bind(response.is_error)
            .bind(&response.body[..])
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        owned(done.rows_affected(), claim)
    }
}

fn owned(rows: u64, claim: ClaimRef<'_>) -> Result<()> {
    if rows == 1 {
        Ok(())
    } else {
        Err(Error::FenceLost { fence: claim.fence })
    }
}

fn cur_row(row: &PgRow) -> Result<CurRow> {
    let get = || -> Result<CurRow, sqlx::Error> {
        Ok(CurRow {
            fence: row.try_get("fence")?,
            fingerprint: row.try_get("fingerprint")?,
            state: row.try_get("state")?,
            response_status: row.try_get("response_status")?,
            response_error: row.try_get("response_error")?,
            response_body: row.try_get("response_body")?,
            expired: row.try_get("expired")?,
            lease_left_ms: row.try_get("lease_left_ms")?,
        })
    };
    get().map_err(map_err)
}

impl Store for PgStore {
    async fn begin(&self, req: BeginRequest<'_>) -> Result<BeginOutcome> {
        let mut conn = self.inner.pool.acquire().await.map_err(map_err)?;
        self.begin_on(&mut conn, req).await
    }

    async fn complete(&self, claim: ClaimRef<'_>, response: &StoredResponse) -> Result<()> {
        let mut conn = self.inner.pool.acquire().await.map_err(map_err)?;
        self.complete_on(&mut conn, claim, response).await
    }

    async fn release(&self, claim: ClaimRef<'_>) -> Result<()> {
        let done = sqlx::query(self.inner.sql.release.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(fence_to_db(claim.fence))
            .execute(&self.inner.pool)
            .await
            .map_err(map_err)?;
        owned(done.rows_affected(), claim)
    }

    async fn checkpoint(
        &self,
        claim: ClaimRef<'_>,
        recovery_point: &[u8],
        lease: Duration,
    ) -> Result<()> {
        let done = sqlx::query(self.inner.sql.checkpoint.clone())
            .bind(claim.scope)
            .bind(claim.key)
            .bind(fence_to_db(claim.fence))
            .bind(recovery_point)
            .bind(ms(lease))
            .execute(&self.inner.pool)
            .await
            .map_err(map_err)?;
        owned(done.rows_affected(), claim)
    }

    async fn lookup(&self, scope: &str, key: &str) -> Result<Option<Record>> {
        let row = sqlx::query(self.inner.sql.lookup.clone())
            .bind(scope)
            .bind(key)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map_err)?;
        row.map(|row| record(&row)).transpose()
    }

    async fn purge_expired(&self) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let n: i64 = sqlx::query_scalar(self.inner.sql.purge.clone())
                .fetch_one(&self.inner.pool)
                .await
                .map_err(map_err)?;
            total += n.max(0) as u64;
            if n < 10_000 {
                return Ok(total);
            }
        }
    }

    fn release_in_background(&self, scope: String, key: String, fence: u64) {
        let store = self.clone();
        let (s, k) = (scope.clone(), key.clone());
        sql::spawn_release(&s, &k, async move {
            store
                .release(ClaimRef {
                    scope: &scope,
                    key: &key,
                    fence,
                })
                .await
        });
    }
}

fn record(row: &PgRow) -> Result<Record> {
    let get = || -> Result<Record, sqlx::Error> {
        let fp: Vec<u8> = row.try_get("fingerprint")?;
        let state: String = row.try_get("state")?;
        let completed = state == "completed";
        let left: i64 = row.try_get("lease_left_ms")?;
        Ok(Record {
            fingerprint: crate::fingerprint::Fingerprint::from_slice(&fp)
                .unwrap_or(crate::fingerprint::Fingerprint::from_bytes([0; 32])),
            state: if completed {
                RecordState::Completed
            } else {
                RecordState::InProgress
            },
            fence: row.try_get::<i64, _>("fence")?.max(0) as u64,
            response: if completed {
                Some(sql::stored_response(
                    row.try_get("response_status")?,
                    row.try_get("response_error")?,
                    row.try_get("response_body")?,
                ))
            } else {
                None
            },
            lease_remaining: (!completed).then(|| Duration::from_millis(left.max(0) as u64)),
        })
    };
    get().map_err(map_err)
}

impl TxStore for PgStore {
    type Database = sqlx::Postgres;

    async fn begin_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.inner.pool.begin().await.map_err(map_err)
    }

    async fn begin_in(
        &self,
        conn: &mut PgConnection,
        req: BeginRequest<'_>,
    ) -> Result<BeginOutcome> {
        self.begin_on(conn, req).await
    }

    async fn complete_in(
        &self,
        conn: &mut PgConnection,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        self.complete_on(conn, claim, response).await
    }
}
