//! A resumable consumer ([`Consumer::resumable`]): each message is stored with the claims its
//! handler takes, and a completer given the handler ([`Completer::consumer`]) runs it again with
//! the stored message once a claim is due: what finishes a message whose outcome was unknown
//! after its broker stopped delivering it.
//!
//! The stored message is what a handler reads of a [`Message`] besides its key and consumer
//! (the record's key and the completer's registration): its subject and its payload, as
//! `idemmsg1 <subject length>\n<subject><payload>`, decoded strictly.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::{Consumer, Handler, Message};
use crate::completer::{Completer, ResumeFn, Resumption};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::flow::RetryHint;
use crate::record::{Policy, RequestCap, StoredRequest};
use crate::store::Store;

const MAGIC: &[u8] = b"idemmsg1 ";

/// The stored request of `msg` for the consumer whose resume name is `name`: its subject and
/// payload, within `cap`.
pub(super) fn stored(name: &str, msg: &Message, cap: RequestCap) -> Result<StoredRequest> {
    let head = format!("{}\n", msg.subject.len());
    let len = MAGIC.len() + head.len() + msg.subject.len() + msg.payload.len();
    // Refused by its size before it is copied: a message too large to store is refused whole.
    cap.admit(len)?;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(msg.subject.as_bytes());
    out.extend_from_slice(&msg.payload);
    StoredRequest::within(name, out, cap)
}

/// The subject and payload of a stored message, read exactly.
fn decode(bytes: &Bytes) -> Result<(String, Bytes)> {
    let bad = |why: &str| Error::Decode(format!("a stored message {why}"));
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("that does not start with `idemmsg1 `"))?;
    let end = rest
        .iter()
        .position(|&b| b == b'\n')
        .filter(|&end| end > 0 && end <= 10)
        .ok_or_else(|| bad("without the length of its subject"))?;
    let digits = &rest[..end];
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad("whose subject length is not a number"));
    }
    let len: usize = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| bad("whose subject length is not a number"))?;
    let start = MAGIC.len() + end + 1;
    let subject = bytes
        .get(start..start + len)
        .ok_or_else(|| bad("shorter than its subject"))?;
    let subject = std::str::from_utf8(subject)
        .map_err(|_| bad("whose subject is not UTF-8"))?
        .to_owned();
    Ok((subject, bytes.slice(start + len..)))
}

/// What the completer needs of a consumer to run its handler again.
struct Redelivery<H> {
    consumer: String,
    policy: Policy,
    handler: H,
}

impl<H> Redelivery<H> {
    /// Runs the handler on the stored message, as the runner would on a delivery: in the
    /// consumer's context (its policy, the remaining lease as the retry hint) with the message
    /// as the request its guarded calls store. The completer's claim and claim watch come from
    /// the context the completer runs this in.
    async fn run<M>(&self, r: Resumption) -> std::result::Result<(), String>
    where
        H: Handler<M>,
    {
        let (subject, payload) = decode(r.payload()).map_err(|e| e.to_string())?;
        let msg = Message {
            key: r.key().clone(),
            payload,
            consumer: self.consumer.clone(),
            subject,
            delivered: r.last_attempt().saturating_add(1),
        };
        Context::current()
            .policy(self.policy)
            .retry_hint(RetryHint::REMAINING_LEASE)
            .resumable(r.request().clone())
            .scope(self.handler.call(msg))
            .await
            .map_err(|e| e.to_string())
    }
}

impl<S: Store + Clone> Completer<S> {
    /// Registers `consumer`'s handler as the resume function of its resumable messages
    /// ([`Consumer::resumable`]): once a claim the handler left unfinished is due (its outcome
    /// was unknown and nobody delivered the message again within the resume delay, or its
    /// process died), the completer takes it over and runs `handler` with the stored message
    /// (the same key, subject and payload; [`Message::delivered`] is the attempt it runs as)
    /// in the consumer's context. The handler's guarded call of that record runs under the
    /// completer's claim as the next attempt, with the same
    /// [`downstream_key`](crate::ClaimInfo::downstream_key); its answer is stored, so a later
    /// delivery of the message (a redelivery, a re-driven dead letter) is a replay, acked.
    ///
    /// `handler` is the one the consumer runs ([`Consumer::run`]): a closure calling
    /// `#[idempotent]` functions, or [`Consumer::guarded`]'s. The registration's name is the
    /// consumer's scope (`consumer:<name>`), which the completer checks when it starts.
    ///
    /// Every attempt counts toward [`Completer::max_attempts`], the broker's deliveries
    /// included: a message that was delivered as often as the consumer's delivery limit
    /// ([`Consumer::max_deliveries`], 20 by default) before its broker gave up is parked at
    /// once by a completer with fewer attempts (8 by default), for an operator. For the
    /// completer to go on where the broker stopped, give it more attempts than the delivery
    /// limit (a warning says so when it starts).
    ///
    /// ```
    /// use idem::completer::Completer;
    /// use idem::consumer::{Consumer, HandlerError, Message};
    /// use idem::MemoryStore;
    ///
    /// let store = MemoryStore::new();
    /// let consumer = Consumer::new("fulfilment", store.clone())?
    ///     .resumable()
    ///     .max_deliveries(5);
    /// let handler = consumer.guarded(|msg: Message, claim: idem::ClaimInfo| async move {
    ///     // Ship the order with claim.downstream_key("ship"): a repeated call is
    ///     // deduplicated by the warehouse.
    ///     Ok::<_, HandlerError>(msg.payload.len())
    /// });
    /// let completer = Completer::new(store)
    ///     .consumer(&consumer, handler.clone())
    ///     .max_attempts(8);
    /// // consumer.run(deliveries, handler, 16) and completer.start() run side by side.
    /// # drop(completer);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn consumer<S2, M, H>(self, consumer: &Consumer<S2>, handler: H) -> Self
    where
        H: Handler<M> + 'static,
        M: 'static,
    {
        let redelivery = Arc::new(Redelivery {
            consumer: consumer.name.clone(),
            policy: consumer.policy,
            handler,
        });
        let resume: ResumeFn = Arc::new(move |r| {
            let redelivery = Arc::clone(&redelivery);
            Box::pin(async move { redelivery.run(r).await })
        });
        self.resume_fn(consumer.scope.clone(), resume, consumer.max_deliveries)
    }
}

impl<H> fmt::Debug for Redelivery<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redelivery")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Key;

    fn msg(subject: &str, payload: &'static [u8]) -> Message {
        Message {
            key: Key::parse("m-1").unwrap(),
            payload: Bytes::from_static(payload),
            consumer: "c".into(),
            subject: subject.into(),
            delivered: 1,
        }
    }

    #[test]
    fn a_message_is_stored_and_read_back_exactly() {
        for (subject, payload) in [
            ("orders.paid", &b"{\"order\":1}"[..]),
            ("", &b""[..]),
            ("a\nb", &b"\n\x00\xff"[..]),
        ] {
            let m = Message {
                subject: subject.into(),
                payload: Bytes::copy_from_slice(payload),
                ..msg("x", b"")
            };
            let stored = stored("consumer:c", &m, RequestCap::DEFAULT).unwrap();
            assert_eq!(stored.name(), "consumer:c");
            let (s, p) = decode(stored.payload()).unwrap();
            assert_eq!((s.as_str(), &p[..]), (subject, payload));
        }
        for bad in [
            &b""[..],
            b"idemmsg1 ",
            b"idemmsg1 x\nab",
            b"idemmsg1 5\nab",
            b"idemmsg1 \nab",
            b"idemmsg2 1\nab",
            b"idemmsg1 99999999999\nab",
        ] {
            assert!(decode(&Bytes::from_static(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_message_past_the_cap_is_refused_whole() {
        let cap = RequestCap::new(64).unwrap();
        let fits = msg("s", &[b'x'; 40]);
        assert!(stored("consumer:c", &fits, cap).is_ok());
        let past = msg("s", &[b'x'; 64]);
        match stored("consumer:c", &past, cap) {
            Err(Error::RequestTooLarge { len, max: 64 }) => assert!(len > 64),
            other => panic!("{other:?}"),
        }
    }
}
