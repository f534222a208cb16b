//! Announcements across instances on PostgreSQL: `NOTIFY` on a channel of the table, heard by
//! one `LISTEN`ing connection per store ([`SqlStoreBuilder::notify`]).

use std::convert::Infallible;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use crate::store::SqlStoreBuilder;
use crate::store::changes::{Changes, Hearing};

use super::PgStore;

impl SqlStoreBuilder<PgStore> {
    /// Whether the store announces each claim it ends to other instances on the same table
    /// (default: no). A duplicate waiting for a running request
    /// ([`Policy::wait`](crate::Policy::wait)) then replays its answer as soon as another
    /// instance stores it, instead of at its next ask of the table (they come 5 ms apart at
    /// first, 250 ms apart at most). Within one instance this is always so.
    ///
    /// Each completion, release, suspension or park is followed by a `NOTIFY` on a channel
    /// of the table (`idem_` and a hash of its schema-qualified name), whose payload names the
    /// claim by 16 hex digits of a hash of its scope and key; from the first waiting duplicate
    /// on, the store keeps one more connection (its own, not one of the pool's) `LISTEN`ing on
    /// it. Off by default: a `NOTIFY` is one more statement per completion (sent after it, on a
    /// task of its own), and PostgreSQL serializes the commits of transactions that notify.
    /// Turn it on where duplicates wait across instances, and announce or not alike on every
    /// instance of the table. An announcement lost (the listening connection dropped and
    /// reconnecting, more than 64 on their way at once) only makes a waiter wait for its next
    /// ask.
    pub fn notify(mut self, on: bool) -> Self {
        self.options.notify = on;
        self
    }
}

/// The channel of `table`: `idem_` and 16 hex digits of a hash of its schema-qualified name,
/// the same for every instance on the table (whether it names the table with its schema or
/// through its `search_path`, before or after the table exists) and for no other table.
async fn channel(pool: &PgPool, table: &str) -> String {
    let qualified: sqlx::Result<String> = sqlx::query_scalar(
        "SELECT COALESCE( \
           (SELECT n.nspname || '.' || c.relname FROM pg_class c \
              JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)), \
           CASE WHEN strpos($1, '.') > 0 THEN $1 ELSE current_schema() || '.' || $1 END)",
    )
    .bind(table)
    .fetch_one(pool)
    .await;
    let name = qualified.unwrap_or_else(|e| {
        tracing::warn!(target: "idem", table, error = %e, "could not resolve the records table's schema for its announcement channel; using its name as written, which instances naming it otherwise will not share");
        table.to_owned()
    });
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("idem_{hex}")
}

/// Announcements on `table`'s channel: sent through `pool`, heard on a connection of their
/// own (a listening connection is held for as long as the store lives, and taken from the
/// store's pool it would starve a small one).
pub(super) async fn changes(pool: &PgPool, table: &str) -> Changes {
    let channel = channel(pool, table).await;
    let (publish_pool, publish_channel) = (pool.clone(), channel.clone());
    let hear_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(pool.connect_options().as_ref().clone());
    Changes::across(
        move |id| {
            let pool = publish_pool.clone();
            let channel = publish_channel.clone();
            Box::pin(async move {
                let sent = sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(&channel)
                    .bind(format!("{id:016x}"))
                    .execute(&pool)
                    .await;
                if let Err(e) = sent {
                    tracing::debug!(target: "idem", error = %e, "could not announce the end of a claim with NOTIFY; duplicates waiting in other instances find it at their next ask");
                }
            })
        },
        move |hearing| {
            let (pool, channel) = (hear_pool.clone(), channel.clone());
            Box::pin(async move {
                match listen(&pool, &channel, hearing).await {
                    Err(e) => e.to_string(),
                    Ok(never) => match never {},
                }
            })
        },
    )
}

/// One listening connection, until it fails.
async fn listen(pool: &PgPool, channel: &str, hearing: &Hearing) -> sqlx::Result<Infallible> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    loop {
        let heard = listener.recv().await?;
        if let Ok(id) = u64::from_str_radix(heard.payload(), 16) {
            hearing.heard(id);
        }
    }
}
