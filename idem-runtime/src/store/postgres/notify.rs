//! Announcements across instances on PostgreSQL: `NOTIFY` on a channel of the table, heard by
//! one `LISTEN`ing connection per store ([`SqlStoreBuilder::notify`]).

use std::convert::Infallible;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgListener, PgPool};

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
    /// of the table (`idem_` and the table's object id), whose payload names the
    /// claim by 16 hex digits of a hash of its scope and key; from the first waiting duplicate
    /// on, the store keeps one connection of its pool `LISTEN`ing on it. Off by default: a
    /// `NOTIFY` is one more statement per completion, and PostgreSQL serializes the commits of
    /// transactions that notify. Turn it on where duplicates wait across instances, and
    /// announce or not alike on every instance of the table. An announcement lost (the
    /// listening connection dropped and reconnecting) only makes a waiter wait for its next
    /// ask.
    pub fn notify(mut self, on: bool) -> Self {
        self.options.notify = on;
        self
    }
}

/// The channel of `table`: `idem_` and its object id, which no other table of the database
/// shares, whatever schema each is in (or, before the table exists, 16 hex digits of a hash of
/// its name as written).
async fn channel(pool: &PgPool, table: &str) -> String {
    let oid: Option<i64> = sqlx::query_scalar("SELECT to_regclass($1)::oid::int8")
        .bind(table)
        .fetch_one(pool)
        .await
        .ok()
        .flatten();
    match oid {
        Some(oid) => format!("idem_{oid}"),
        None => {
            let digest = Sha256::digest(table.as_bytes());
            let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
            format!("idem_{hex}")
        }
    }
}

/// Announcements on `table`'s channel, through `pool`.
pub(super) async fn changes(pool: &PgPool, table: &str) -> Changes {
    let channel = channel(pool, table).await;
    let (publish_pool, publish_channel) = (pool.clone(), channel.clone());
    let hear_pool = pool.clone();
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
        move |hearing| match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(hear(hear_pool.clone(), channel.clone(), hearing));
            }
            // Outside a runtime nobody can wait: the next listener, in one, starts it.
            Err(_) => drop(hearing),
        },
    )
}

/// Listens on `channel` until the store is gone, handing every claim heard to this process's
/// waiters; reconnects after a failure.
async fn hear(pool: PgPool, channel: String, hearing: Hearing) {
    loop {
        let failed = tokio::select! {
            () = hearing.gone() => return,
            Err(e) = listen(&pool, &channel, &hearing) => e,
        };
        tracing::debug!(target: "idem", error = %failed, "the connection listening for claims ended elsewhere failed; listening again in a second");
        tokio::select! {
            () = hearing.gone() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
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
