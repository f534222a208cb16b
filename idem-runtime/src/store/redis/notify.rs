//! Announcements across instances on Redis: `PUBLISH` on a channel of the prefix, heard by one
//! subscribed connection per store ([`RedisStoreBuilder::notify`]).

use futures_util::StreamExt as _;

use super::{Conn, RedisStoreBuilder};
use crate::store::changes::{Changes, Hearing};

impl RedisStoreBuilder {
    /// Whether the store announces each claim it ends to other instances on the same prefix
    /// (default: no). A duplicate waiting for a running request
    /// ([`Policy::wait`](crate::Policy::wait)) then replays its answer as soon as another
    /// instance stores it, instead of at its next ask (they come 5 ms apart at first, 250 ms
    /// apart at most). Within one instance this is always so.
    ///
    /// Each completion, release, suspension or park is followed by a `PUBLISH` on the channel
    /// `<prefix>changes`, whose message names the claim by 16 hex digits of a hash of its scope
    /// and key; from the first waiting duplicate on, the store keeps one more connection
    /// subscribed to it (on a cluster, to the first node given: a cluster passes every
    /// `PUBLISH` to all its nodes). Off by default: it is one more command per completion, and
    /// on a cluster every message crosses the cluster bus. Turn it on alike on every instance
    /// of the prefix. An announcement lost (the subscribed connection dropped and
    /// reconnecting) only makes a waiter wait for its next ask.
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = on;
        self
    }
}

/// Announcements on `<prefix>changes`: published through `conn`, heard through a connection of
/// its own to `url`.
pub(super) fn changes(conn: Conn, url: String, prefix: &str) -> Changes {
    let channel = format!("{prefix}changes");
    let publish_channel = channel.clone();
    Changes::across(
        move |id| {
            let conn = conn.clone();
            let channel = publish_channel.clone();
            Box::pin(async move {
                let mut cmd = redis::cmd("PUBLISH");
                cmd.arg(&channel).arg(format!("{id:016x}"));
                let sent = match conn {
                    Conn::Standalone(mut c) => cmd.query_async::<()>(&mut c).await,
                    Conn::Cluster(mut c) => cmd.query_async::<()>(&mut c).await,
                };
                if let Err(e) = sent {
                    tracing::debug!(target: "idem", error = %e, "could not announce the end of a claim with PUBLISH; duplicates waiting in other instances find it at their next ask");
                }
            })
        },
        move |hearing| {
            let (url, channel) = (url.clone(), channel.clone());
            Box::pin(async move { listen(&url, &channel, hearing).await })
        },
    )
}

/// One subscribed connection, until it fails or ends.
async fn listen(url: &str, channel: &str, hearing: &Hearing) -> String {
    let subscribed = async {
        let client = redis::Client::open(url)?;
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    let mut messages = match subscribed.await {
        Ok(pubsub) => pubsub.into_on_message(),
        Err(e) => return e.to_string(),
    };
    while let Some(message) = messages.next().await {
        if let Ok(id) =
            u64::from_str_radix(&String::from_utf8_lossy(message.get_payload_bytes()), 16)
        {
            hearing.heard(id);
        }
    }
    "the subscription ended".to_owned()
}
