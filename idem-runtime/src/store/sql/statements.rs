//! Every statement of one SQL store, built once from its table name, and the migration.

use crate::error::{Error, Result};
use crate::lifecycle::State;
use crate::record::BeginRequest;
use crate::store::{ListOrder, RecordQuery};

use super::*;

/// Every statement of one store, built once from its table name.
pub(crate) struct Statements {
    pub(crate) table: String,
    /// Deletes a batch of expired records; the last statement returns how many.
    pub(crate) purge: Vec<Stmt>,
    /// A first claim alone: `INSERT … ON CONFLICT DO NOTHING RETURNING fence`, no row when the
    /// record exists (or a concurrent claim committed it while this one waited on the index).
    pub(crate) insert: Stmt,
    /// The record's columns ([`CurRow`]), by scope and key.
    pub(crate) select: Stmt,
    pub(super) reclaim: Stmt,
    pub(super) complete: Stmt,
    /// The record completed already by the fence `$3` with the answer `$4`–`$6`: a retried
    /// completion's, when `complete` matched nothing.
    pub(super) completed: Stmt,
    pub(super) release: Stmt,
    pub(super) checkpoint: Stmt,
    pub(super) renew: Stmt,
    pub(super) lookup: Stmt,
    pub(super) suspend: Stmt,
    pub(super) due: Stmt,
    pub(super) park: Stmt,
    /// What operators ask ([`crate::store::admin`]).
    pub(crate) admin: AdminStatements,
    pub(crate) migration: Migration,
}

/// The statements of the operators' operations; `List` writes its own from its filters
/// ([`AdminStatements::list`]).
pub(crate) struct AdminStatements {
    /// The columns of a `RecordInfo`, without the recovery point and answer.
    pub(super) info_columns: String,
    /// `FROM` the table.
    pub(super) table: String,
    /// `NOW_MS`, the table's clock in ms.
    pub(super) now_ms: &'static str,
    /// `BYTE_ORDER`, what makes a comparison of scopes one of bytes.
    pub(super) byte_order: &'static str,
    pub(super) inspect: Stmt,
    pub(super) force_release: Stmt,
    pub(super) retry: Stmt,
    /// `force_release` of the claim with the fence `$3` only.
    pub(super) force_release_fenced: Stmt,
    pub(super) count_expired: Stmt,
    /// The counts by prefix and state (`prefix`, `state`, `part`, `n`, …) of every record that
    /// holds work (`part` `'work'`) and the others whose retention ends last (`'newest'`), at
    /// most `$1` of each: the counts of `Stats` read with bounded work.
    pub(crate) stats: Stmt,
    /// `expired` and `expiring` (within `$2` ms): records that hold no work, counted along the
    /// retention index up to `$1`.
    pub(crate) stats_bounded: Stmt,
}

/// `List`'s statements, from its filters ([`AdminStatements::list`]).
pub(crate) struct ListStatements<'q> {
    /// The records: those of the first `$1` of the listing's order that pass its filters, in
    /// its order, at most its limit.
    pub(crate) rows: Stmt,
    /// How many records of the listing's order it examined (`n`): the first `$1`, or all of
    /// them when there are fewer.
    pub(crate) examined: Stmt,
    /// The arguments of `rows`; `examined` takes the first `range_args` of them.
    pub(crate) args: Vec<Arg<'q>>,
    pub(crate) range_args: usize,
}

/// How a table is created, and brought up to date when it was created by an earlier version:
/// the same steps for the records' table and the outbox's.
pub(crate) struct Migration {
    /// `CREATE … IF NOT EXISTS` statements, in order.
    pub(crate) create: Vec<Stmt>,
    /// Columns added since the table was first created.
    pub(crate) upgrade: Vec<AddColumn>,
    /// Statements run once the columns are there (an index on an added column).
    pub(crate) finish: Vec<Stmt>,
    /// A check to bring up to date, when the table was created before a value it must allow
    /// or before the check took today's form: a query whose `present` column is 1 when it is
    /// up to date already, and what updates it.
    pub(crate) widen: Option<(Stmt, Vec<Stmt>)>,
    /// The dialect's catalog probe that finds the table up to date without locking it.
    pub(crate) up_to_date: Option<Stmt>,
    /// For a records table: where it names its format ([`ddl::RECORDS_FORMAT`]), and the table
    /// as the error names it.
    pub(crate) format: Option<(Stmt, String)>,
}

impl Migration {
    /// Creates what is missing, in one transaction opened by the dialect's `migration_start`; safe
    /// to run from many instances at once. A table found up to date by the probes (its columns
    /// and indexes, and its check where one may need updating) is not touched.
    pub(crate) async fn run<D: Dialect>(&self, pool: &sqlx::Pool<D::Db>) -> Result<()> {
        self.check_format::<D>(pool).await?;
        if let Some(probe) = &self.up_to_date {
            let mut conn = pool.acquire().await.map_err(map_err)?;
            let widen = self.widen.as_ref().map(|(probe, _)| probe);
            let mut current = true;
            for probe in std::iter::once(probe).chain(widen) {
                current = match D::fetch(&mut conn, probe, &[]).await? {
                    Some(row) => row.int8("present").map_err(map_err)? > 0,
                    None => false,
                };
                if !current {
                    break;
                }
            }
            if current {
                return Ok(());
            }
        }
        let mut tx = begin_on::<D>(pool).await?;
        for stmt in D::migration_start().iter().chain(&self.create) {
            D::fetch(&mut tx, stmt, &[]).await?;
        }
        for add in &self.upgrade {
            if let Some(probe) = &add.probe
                && let Some(row) = D::fetch(&mut tx, probe, &[]).await?
                && row.int8("present").map_err(map_err)? > 0
            {
                continue;
            }
            D::fetch(&mut tx, &add.alter, &[]).await?;
        }
        if let Some((probe, widen)) = &self.widen {
            let present = match D::fetch(&mut tx, probe, &[]).await? {
                Some(row) => row.int8("present").map_err(map_err)? > 0,
                None => false,
            };
            if !present {
                for stmt in widen {
                    D::fetch(&mut tx, stmt, &[]).await?;
                }
            }
        }
        for stmt in &self.finish {
            D::fetch(&mut tx, stmt, &[]).await?;
        }
        tx.commit().await.map_err(map_err)
    }

    /// Refuses a records table that names a later format than this version's: its records would
    /// be misread, or overwritten in a form the version that wrote them cannot read. A table
    /// that names none, or does not exist yet, passes.
    pub(crate) async fn check_format<D: Dialect>(&self, pool: &sqlx::Pool<D::Db>) -> Result<()> {
        let Some((probe, table)) = &self.format else {
            return Ok(());
        };
        let mut conn = pool.acquire().await.map_err(map_err)?;
        let note = match D::fetch(&mut conn, probe, &[]).await? {
            Some(row) => row.opt_text("note").map_err(map_err)?,
            None => None,
        };
        match note.as_deref().and_then(ddl::format_in) {
            Some(format) if format > ddl::RECORDS_FORMAT => Err(Error::Config(format!(
                "the table {table} holds idem records of format {format}, written by a later \
                 version of idem; this version reads format {}: upgrade idem, or give this \
                 store a table of its own",
                ddl::RECORDS_FORMAT
            ))),
            _ => Ok(()),
        }
    }
}

impl Statements {
    pub(crate) fn new<D: Dialect>(table: &str) -> Result<Statements> {
        let t = quote_table(table, D::QUALIFIED_TABLES)?;
        let now = D::NOW;
        let types = D::TYPES;
        let (in_progress, completed, released, parked) = (
            State::InProgress.as_str(),
            State::Completed.as_str(),
            State::Released.as_str(),
            State::Parked.as_str(),
        );
        let holds = holds_work();
        let live = format!("(expires_at > {now} OR {holds})");
        // A fenced write applies only while its owner holds a live claim (`lifecycle::owns`).
        let owned = format!("fence = $3 AND state = '{in_progress}' AND {live}");
        // What ends a claim clears the work it held.
        let no_work = "request = NULL, resume_at = NULL, note = NULL";
        // A write fenced by `$3`, which it leaves as it is: it answers that fence.
        let fenced = |update: String| D::returning(update, &t, "fence", FenceFrom::Arg(3));
        // The completer's index is on a column that tables created earlier gain by migrating:
        // it is created once the columns are there.
        let mut create = ddl::records(D::DATABASE, table)?;
        let indexes = RecordIndexes {
            resume: index_name(table, "resume_at"),
            work: index_name(table, "work"),
        };
        let finish: Vec<Stmt> = create
            .split_off(create.len().min(2))
            .into_iter()
            .map(D::stmt)
            .collect();
        Ok(Statements {
            table: table.to_owned(),
            purge: D::purge(&t, &format!("expires_at <= {now} AND NOT {holds}")),
            // A resumable claim ($6) stores its request and is due to the completer once its
            // lease runs out.
            insert: D::insert_new(format!(
                "INSERT INTO {t} (scope, key, fingerprint, state, fence, lease_until, expires_at, \
                 request, resume_at, created_at, updated_at) \
                 VALUES ($1, $2, $3, '{in_progress}', {}, {}, {}, $6, \
                 CASE WHEN $6 IS NULL THEN NULL ELSE {now} END, {now}, {now})",
                D::set_fence(D::NOW_MS),
                D::after("$4"),
                D::after("$5"),
            )),
            select: D::stmt(format!(
                "SELECT fence, fingerprint, state, response_status, response_error, response_body, \
                 (expires_at <= {now} AND NOT {holds}) AS expired, {} AS lease_left_ms, \
                 {} AS lease_stamp \
                 FROM {t} WHERE scope = $1 AND key = $2",
                D::ms_until("lease_until"),
                D::stamp("lease_until"),
            )),
            // A take-over applies only to the record exactly as it was read: what to do was
            // decided from that, and anything since (a completion, a release, a checkpoint, a
            // competing take-over) changed its fence, state or lease. One that continues the
            // same request ($6) keeps its work (its request, unless a new one comes with the
            // claim, $10, and why it did not finish); another starts without.
            reclaim: D::returning(
                format!(
                    "UPDATE {t} SET fence = {}, state = '{in_progress}', fingerprint = $3, \
                 lease_until = {}, expires_at = {}, \
                 recovery_point = CASE WHEN $6 THEN recovery_point END, \
                 attempt = CASE WHEN $6 THEN attempt + 1 ELSE 1 END, \
                 response_status = NULL, response_error = {}, response_body = NULL, \
                 request = COALESCE($10, CASE WHEN $6 THEN request END), \
                 resume_at = CASE WHEN $10 IS NOT NULL OR ($6 AND request IS NOT NULL) \
                   THEN {now} END, \
                 note = CASE WHEN $6 THEN note END, \
                 updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND fence = $7 AND state = $8 AND {} = $9",
                    D::set_fence("fence + 1"),
                    D::after("$4"),
                    D::after("$5"),
                    D::FALSE,
                    D::stamp("lease_until"),
                ),
                &t,
                "fence, recovery_point, attempt",
                FenceFrom::Set,
            ),
            complete: fenced(format!(
                "UPDATE {t} SET state = '{completed}', response_status = $4, response_error = $5, \
                 response_body = $6, recovery_point = NULL, {no_work}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned}"
            )),
            // A completion whose reply was lost after the database committed it is retried
            // (`Guard::finish`): finding the record completed by this very fence with this very
            // answer, the retry succeeds rather than report the fence lost for a completion
            // that is in fact ours. Asked only when `complete` matched nothing.
            completed: D::stmt(format!(
                "SELECT fence FROM {t} WHERE scope = $1 AND key = $2 AND fence = $3 \
                 AND state = '{completed}' AND expires_at > {now} \
                 AND response_status {} $4 AND response_error = $5 AND response_body = $6",
                D::NULL_SAFE_EQ,
            )),
            release: fenced(format!(
                "UPDATE {t} SET state = '{released}', {no_work}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned}"
            )),
            checkpoint: fenced(format!(
                "UPDATE {t} SET recovery_point = $4, lease_until = {}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned}",
                D::after("$5"),
            )),
            renew: fenced(format!(
                "UPDATE {t} SET lease_until = {}, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned}",
                D::after("$4"),
            )),
            lookup: D::stmt(format!(
                "SELECT fingerprint, state, fence, response_status, response_error, response_body, \
                 {} AS lease_left_ms \
                 FROM {t} WHERE scope = $1 AND key = $2 AND state <> '{released}' AND {live}",
                D::ms_until("lease_until"),
            )),
            // The lease ends now, so the same request's retry takes it over at once; the
            // completer waits $5 ms.
            suspend: fenced(format!(
                "UPDATE {t} SET lease_until = {now}, note = $4, \
                 resume_at = CASE WHEN request IS NOT NULL THEN {} END, updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND {owned}",
                D::after("$5"),
            )),
            due: D::stmt(format!(
                "SELECT scope, key, fence, attempt, fingerprint, request, note, \
                 {} AS resume_left_ms, {} AS lease_left_ms \
                 FROM {t} WHERE resume_at IS NOT NULL AND resume_at <= {now} \
                 AND state = '{in_progress}' AND lease_until <= {now} \
                 ORDER BY resume_at LIMIT $1",
                D::ms_until("resume_at"),
                D::ms_until("lease_until"),
            )),
            park: fenced(format!(
                "UPDATE {t} SET state = '{parked}', note = $4, resume_at = NULL, \
                 updated_at = {now} \
                 WHERE scope = $1 AND key = $2 AND fence = $3 AND state = '{in_progress}' \
                 AND lease_until <= {now}"
            )),
            admin: AdminStatements::new::<D>(&t),
            migration: Migration {
                create: create.into_iter().map(D::stmt).collect(),
                upgrade: ADDED_COLUMNS
                    .iter()
                    .map(|(column, definition)| {
                        let definition = definition
                            .replace("{int4}", types.int4)
                            .replace("{bytes}", types.bytes)
                            .replace("{timestamp}", types.timestamp)
                            .replace("{text}", types.text);
                        D::add_column(&t, table, column, &definition)
                    })
                    .chain(D::upgrade_indexes(&t, table, &indexes))
                    .collect(),
                up_to_date: D::up_to_date(
                    &t,
                    &[indexes.resume, indexes.work],
                    &ADDED_COLUMNS.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
                ),
                widen: D::update_state_check(&t, table),
                finish,
                format: Some((D::format_note(&t, table), table.to_owned())),
            },
        })
    }

    /// The arguments of the first claim: scope, key, fingerprint, lease, retention and the
    /// stored request.
    pub(crate) fn claim_args<'a>(req: &BeginRequest<'a>) -> [Arg<'a>; 6] {
        [
            Arg::Text(req.scope),
            Arg::Text(req.key),
            Arg::Bytes(req.fingerprint.as_bytes()),
            Arg::Int(ms(req.policy.lease)),
            Arg::Int(ms(req.policy.retain)),
            Arg::OptBytes(req.request),
        ]
    }
}

impl AdminStatements {
    pub(super) fn new<D: Dialect>(t: &str) -> AdminStatements {
        let now = D::NOW;
        let (in_progress, released, parked) = (
            State::InProgress.as_str(),
            State::Released.as_str(),
            State::Parked.as_str(),
        );
        let holds = holds_work();
        let bump = D::set_fence("fence + 1");
        let info_columns = format!(
            "scope, key, state, fence, attempt, fingerprint, {} AS now_ms, \
             {} AS lease_left_ms, {} AS expires_ms, note, \
             CASE WHEN request IS NULL THEN 0 ELSE 1 END AS resumable",
            D::NOW_MS,
            D::ms_until("lease_until"),
            D::ms_until("expires_at"),
        );
        let live = format!("(expires_at > {now} OR {holds})");
        let expired = format!("(expires_at <= {now} AND NOT {holds})");
        let unfinished = format!(
            "state = '{in_progress}' AND (request IS NOT NULL OR note IS NOT NULL) \
             AND lease_until <= {now}"
        );
        AdminStatements {
            inspect: D::stmt(format!(
                "SELECT {info_columns}, recovery_point, response_status, response_error, \
                 response_body, request FROM {t} WHERE scope = $1 AND key = $2"
            )),
            // The fence moves on, so that the owner that is presumed gone cannot complete,
            // release or checkpoint over the next attempt if it wakes up. Parked work is
            // released the same way.
            force_release: D::returning(
                format!(
                    "UPDATE {t} SET state = '{released}', fence = {bump}, request = NULL, \
                     resume_at = NULL, note = NULL, updated_at = {now} \
                     WHERE scope = $1 AND key = $2 AND state IN ('{in_progress}', '{parked}') \
                     AND {live}"
                ),
                t,
                "fence",
                FenceFrom::Set,
            ),
            retry: D::returning(
                format!(
                    "UPDATE {t} SET state = '{in_progress}', lease_until = {now}, attempt = 1, \
                     resume_at = CASE WHEN request IS NOT NULL THEN {now} END, \
                     fence = {}, updated_at = {now} \
                     WHERE scope = $1 AND key = $2 AND state = '{parked}'",
                    D::set_fence("fence"),
                ),
                t,
                "fence",
                FenceFrom::Set,
            ),
            // Only the claim the operator saw: a claim taken since keeps running.
            force_release_fenced: D::returning(
                format!(
                    "UPDATE {t} SET state = '{released}', fence = {bump}, request = NULL, \
                     resume_at = NULL, note = NULL, updated_at = {now} \
                     WHERE scope = $1 AND key = $2 AND state IN ('{in_progress}', '{parked}') \
                     AND {live} AND fence = $3"
                ),
                t,
                "fence",
                FenceFrom::Set,
            ),
            count_expired: D::stmt(format!("SELECT count(*) AS n FROM {t} WHERE {expired}")),
            // Counted rather than summed: every database answers a count as its 64-bit
            // integer. Each part walks one index and stops at `$1` rows: the work index, and
            // the retention index from its end, past the rows that hold work. Its rows carry
            // whether a request is stored as `request` (1 or NULL), so that the conditions
            // read as they do on the table.
            stats: D::stmt(format!(
                "SELECT {prefix} AS prefix, state, part, \
                 count(*) AS n, \
                 {oldest} AS oldest_fence, \
                 count(CASE WHEN {expired} THEN 1 END) AS expired, \
                 count(CASE WHEN {unfinished} THEN 1 END) AS unfinished, \
                 min(CASE WHEN {unfinished} THEN fence END) AS oldest_unfinished_fence, \
                 max({now_ms}) AS now_ms \
                 FROM ({newest} UNION ALL {work}) s GROUP BY {prefix}, state, part",
                prefix = D::scope_prefix("scope"),
                oldest = format_args!(
                    "min(CASE WHEN state = '{in_progress}' AND {live} THEN fence END)"
                ),
                now_ms = D::NOW_MS,
                newest = stats_part(
                    t,
                    "newest",
                    &format!("NOT ({})", D::WORK),
                    "expires_at DESC"
                ),
                work = stats_part(t, "work", D::WORK, D::WORK_ORDER),
            )),
            // Along the retention index, from its start (the expired records) and from now
            // (those expiring soon): bounded by `$1` and by the rows that hold work.
            stats_bounded: D::stmt(format!(
                "SELECT (SELECT count(*) FROM (SELECT 1 AS one FROM {t} \
                   WHERE expires_at <= {now} AND NOT ({work}) ORDER BY expires_at LIMIT $1) e) \
                   AS expired, \
                 (SELECT count(*) FROM (SELECT 1 AS one FROM {t} \
                   WHERE expires_at > {now} AND expires_at <= {until} AND NOT ({work}) \
                   ORDER BY expires_at LIMIT $1) x) AS expiring",
                work = D::WORK,
                until = D::after("$2"),
            )),
            info_columns,
            table: t.to_owned(),
            now_ms: D::NOW_MS,
            byte_order: D::BYTE_ORDER,
        }
    }

    /// `List`'s statements and arguments, from its filters, in its order
    /// ([`RecordQuery::order`]); `prefix_end` is [`prefix_end`] of its scope prefix. Each
    /// reads the first `$1` (`examine`) rows of the listing's index, and no more.
    pub(crate) fn list<'q, D: Dialect>(
        &self,
        query: &'q RecordQuery,
        prefix_end: Option<&'q str>,
    ) -> ListStatements<'q> {
        let mut args = vec![Arg::Int(
            i64::try_from(query.examine.max(1)).unwrap_or(i64::MAX),
        )];
        // A range of the primary key in byte order, not LIKE (a prefix holding `%` or `_`
        // means itself) nor a function of the column (which no index serves): the scopes
        // from the prefix up to the first text after every one that starts with it.
        let scope = format!("scope{}", self.byte_order);
        let in_prefix = |args: &mut Vec<Arg<'q>>, conditions: &mut Vec<String>| {
            if let Some(prefix) = query.scope_prefix.as_deref() {
                args.push(Arg::Text(prefix));
                conditions.push(format!("{scope} >= ${}", args.len()));
                if let Some(end) = prefix_end {
                    args.push(Arg::Text(end));
                    conditions.push(format!("{scope} < ${}", args.len()));
                }
            }
        };
        let mut range = Vec::new();
        let order = query.order();
        let (index_order, then) = match order {
            ListOrder::Work => {
                range.push(D::WORK.to_owned());
                (D::WORK_ORDER.to_owned(), format!("fence, {scope}, key"))
            }
            ListOrder::Scope => {
                in_prefix(&mut args, &mut range);
                (format!("{scope}, key"), format!("{scope}, key"))
            }
            ListOrder::Retention => ("expires_at".to_owned(), format!("expires_at, {scope}, key")),
        };
        let range_args = args.len();
        let mut filters = Vec::new();
        if let Some(state) = query.state {
            args.push(Arg::Text(state.as_str()));
            filters.push(format!("state = ${}", args.len()));
        }
        if order != ListOrder::Scope {
            in_prefix(&mut args, &mut filters);
        }
        if let Some(age) = query.older_than {
            args.push(Arg::Int(ms(age)));
            filters.push(format!("fence < {} - ${}", self.now_ms, args.len()));
        }
        if query.holding_work {
            filters.push(holds_work());
        }
        let range = where_all(&range);
        let source = format!(
            "SELECT scope, key, state, fence, attempt, fingerprint, lease_until, expires_at, \
             note, CASE WHEN request IS NULL THEN NULL ELSE 1 END AS request \
             FROM {}{range} ORDER BY {index_order} LIMIT $1",
            self.table
        );
        ListStatements {
            rows: D::stmt(format!(
                "SELECT {} FROM ({source}) w{} ORDER BY {then} LIMIT {}",
                self.info_columns,
                where_all(&filters),
                query.limit.min(i64::MAX as usize),
            )),
            examined: D::stmt(format!(
                "SELECT count(*) AS n FROM (SELECT 1 AS one FROM {}{range} \
                 ORDER BY {index_order} LIMIT $1) w",
                self.table
            )),
            args,
            range_args,
        }
    }
}

/// ` WHERE` and every condition, or nothing.
fn where_all(conditions: &[String]) -> String {
    if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    }
}

/// One part of the counts' rows: the first `$1` rows of table `t` that pass `condition` in
/// `order`, with what the counts read of them and the part's `name`.
fn stats_part(t: &str, name: &str, condition: &str, order: &str) -> String {
    format!(
        "SELECT * FROM (SELECT scope, state, fence, lease_until, expires_at, note, \
         CASE WHEN request IS NULL THEN NULL ELSE 1 END AS request, '{name}' AS part \
         FROM {t} WHERE {condition} ORDER BY {order} LIMIT $1) {name}"
    )
}

/// The least text after every text that starts with `prefix`, in byte order (which is UTF-8's
/// order of code points): `prefix` with its last character that is not the greatest one
/// incremented and the characters after it dropped; `None` when there is no such character
/// (every scope from `prefix` on starts with it).
pub(crate) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            char::MAX => continue,
            // The surrogates are no characters: the next one after them.
            '\u{D7FF}' => '\u{E000}',
            c => char::from_u32(u32::from(c) + 1)?,
        };
        chars.push(next);
        return Some(chars.into_iter().collect());
    }
    None
}

/// Whether a row holds unfinished work, in SQL (`lifecycle::unfinished`): such a row never
/// expires.
pub(crate) fn holds_work() -> String {
    format!(
        "(state = '{}' OR (state = '{}' AND (request IS NOT NULL OR note IS NOT NULL)))",
        State::Parked.as_str(),
        State::InProgress.as_str()
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Every text that starts with the prefix is below its end, and every text from the
        /// prefix up to its end starts with it: the range is the prefix, exactly.
        #[test]
        fn the_end_of_a_prefix_bounds_exactly_the_texts_that_start_with_it(
            prefix in "\\PC{0,4}|[\u{10FFFF}\u{D7FF}a]{0,3}",
            rest in "\\PC{0,4}|[\u{10FFFF}\u{D7FF}\u{E000}a]{0,3}",
            other in "\\PC{0,6}",
        ) {
            let end = prefix_end(&prefix);
            let under = format!("{prefix}{rest}");
            prop_assert!(end.as_deref().is_none_or(|e| under.as_str() < e));
            let in_range = other.as_str() >= prefix.as_str()
                && end.as_deref().is_none_or(|e| other.as_str() < e);
            prop_assert_eq!(in_range, other.starts_with(&prefix));
        }
    }

    #[test]
    fn the_end_of_a_prefix_skips_what_has_no_successor() {
        assert_eq!(prefix_end("refund:").as_deref(), Some("refund;"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
        assert_eq!(prefix_end("\u{10FFFF}\u{10FFFF}"), None);
        assert_eq!(prefix_end(""), None);
    }
}
