//! The client side of an idempotent API: [`Idempotency`], a [`reqwest_middleware`] middleware
//! that sends a request until it has a definite answer without ever having the server do it
//! twice.
//!
//! - **One key per logical operation.** The request's `Idempotency-Key` when the caller set one
//!   (checked by the rules the server applies, [`KeyPolicy`]), else a new random UUID, kept
//!   across every retry of the call. A call that names its [`Operation`] keeps its key until the
//!   operation has a definite answer, in [`PendingKeys`]: in memory ([`MemoryKeys`], the
//!   default), or in files ([`FileKeys`]) so that a client restarted mid-operation sends it
//!   again with the same key.
//! - **Bounded retries** ([`Retry`]): exponential backoff with full jitter, a bound on the
//!   requests and on the time a call takes; `Retry-After` (seconds or an HTTP-date) honoured on
//!   409, 429 and 503, within the bound.
//! - **Never a retry of a refusal.** 400, 422 and the other 4xx are a bug in the caller (or a
//!   state of the resource), surfaced with their problem code ([`Refusal::code`]:
//!   `INVALID_IDEMPOTENCY_KEY`, `KEY_REUSED_WITH_DIFFERENT_BODY`, …).
//! - **Ask before sending again.** After a timeout or a dropped connection the outcome is
//!   unknown: with a [`Lookup`] (such as `GET /api/orders/by-key/{key}`) the call asks the server
//!   by key first. An answer (200) is taken; 404 (nothing known) means send it again with the
//!   same key; 409 (still running) means wait `Retry-After`, then send it again with the same
//!   key, which the server answers 409 while the first attempt runs, replays once it is done, and
//!   takes over when its holder died (a lookup only reports on such a claim, so asking again
//!   would wait on it forever). Without a lookup the call sends the request again at once with
//!   the same key, which is as safe against a server that dedupes by key.
//! - **The outcome typed** ([`Outcome`], through [`send`] or [`Sent::from_result`]): the first
//!   answer, a replay, still running, refused, with the [`Attempts`] made.
//! - **A body sent twice is the same body.** A request whose body is a stream cannot be cloned
//!   for a retry: [`Error::NotReplayable`], and nothing is sent.
//!
//! The middleware guards `POST` and `PATCH` requests, and any request that carries an
//! `Idempotency-Key` or an [`Operation`]; other requests pass through it untouched. Middleware
//! added after it (closer to the network) runs once per request it makes, and finds the
//! request's [`Attempt`] in the extensions.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use idem::client::reqwest_middleware::ClientBuilder;
//! use idem::client::{Idempotency, Lookup, Operation, Outcome, Retry};
//!
//! # async fn checkout() -> Result<(), Box<dyn std::error::Error>> {
//! let client = ClientBuilder::new(idem::client::reqwest::Client::new())
//!     .with(
//!         Idempotency::new()
//!             .retry(Retry::DEFAULT.max_elapsed(Duration::from_secs(30)))
//!             .lookup(Lookup::new("/api/orders/by-key/{key}")?),
//!     )
//!     .build();
//! let request = client
//!     .post("http://127.0.0.1:3000/api/orders")
//!     .header("Content-Type", "application/json")
//!     .body(r#"{"skuId": 9001, "qty": 2}"#)
//!     .timeout(Duration::from_secs(2))
//!     // One checkout, one key: sending it again (a second click) reuses the key.
//!     .with_extension(Operation::new("cart-7f3a"));
//! let sent = idem::client::send(request).await?;
//! match sent.outcome {
//!     Outcome::First(answer) | Outcome::Replayed(answer) => println!("{}", answer.text().await?),
//!     Outcome::StillRunning { retry_after } => println!("still running; ask again in {retry_after:?}"),
//!     Outcome::Refused(refusal) => println!("refused: {refusal}"),
//!     _ => {}
//! }
//! println!("key {}: sent {} times", sent.attempts.key(), sent.attempts.sent());
//! # Ok(())
//! # }
//! ```
//!
//! reqwest comes without default features here: turn on TLS (and the rest) in your own
//! dependency on reqwest 0.13, or use the one re-exported as [`reqwest`].

mod call;
mod keys;
mod outcome;
mod retry;

use std::sync::Arc;

use http::{HeaderValue, Method};
use reqwest::{Request, Response, Url};
use reqwest_middleware::{Middleware, Next};

pub use self::keys::{FileKeys, MemoryKeys, PendingKeys};
pub use self::outcome::{Answer, Attempts, Error, Last, Outcome, Refusal, Sent, send};
pub use self::retry::{Retry, retry_after};
/// The extensions a middleware is handed with each request (where it finds the [`Attempt`]).
pub use http::Extensions;
/// The reqwest the middleware is built for: use it (or the same version) for the client.
pub use reqwest;
/// The middleware crate: build the client with its `ClientBuilder`.
pub use reqwest_middleware;

use crate::http::IDEMPOTENCY_KEY;
use crate::key::{Key, KeyPolicy};

/// The middleware: see the [module](self) documentation.
///
/// Built once and shared by every request of a client (`ClientBuilder::with`); what one call
/// needs of its own (an [`Operation`], a [`Lookup`], a [`Retry`]) rides on the request as an
/// extension (`.with_extension(…)`) and overrides the middleware's.
#[derive(Debug, Clone)]
pub struct Idempotency {
    retry: Retry,
    lookup: Option<Lookup>,
    policy: KeyPolicy,
    keys: Arc<dyn PendingKeys>,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency::new()
    }
}

impl Idempotency {
    /// [`Retry::DEFAULT`], no lookup, [`KeyPolicy::DEFAULT`], keys of operations in memory.
    pub fn new() -> Self {
        Idempotency {
            retry: Retry::DEFAULT,
            lookup: None,
            policy: KeyPolicy::DEFAULT,
            keys: Arc::new(MemoryKeys::new()),
        }
    }

    /// How calls retry.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// How calls ask the server by key after a timeout or a dropped connection.
    pub fn lookup(mut self, lookup: Lookup) -> Self {
        self.lookup = Some(lookup);
        self
    }

    /// The keys the server accepts (the policy of its guard, such as [`KeyPolicy::Uuid`]): a key
    /// the caller sets is checked against it before anything is sent. Generated keys are UUIDs,
    /// which every policy accepts.
    pub fn key_policy(mut self, policy: KeyPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Where the keys of named operations are kept until they have a definite answer.
    pub fn pending_keys(mut self, keys: impl PendingKeys) -> Self {
        self.keys = Arc::new(keys);
        self
    }

    /// The key of a call: the one the request carries, checked; else its operation's, kept;
    /// else a new one.
    async fn key(&self, req: &Request, operation: Option<&Operation>) -> Result<Key, Error> {
        if let Some(given) = req.headers().get(IDEMPOTENCY_KEY) {
            return Key::read_bytes(given.as_bytes(), self.policy).map_err(Error::InvalidKey);
        }
        let fresh = keys::generate().map_err(Error::Keys)?;
        let Some(operation) = operation else {
            return Ok(fresh);
        };
        let (store, name) = (self.keys.clone(), operation.0.clone());
        let kept = tokio::task::spawn_blocking(move || store.keep(&name, &fresh))
            .await
            .map_err(|e| Error::Keys(std::io::Error::other(e)))?
            .map_err(Error::Keys)?;
        // A file written by hand, or under a laxer policy, is checked like a caller's key.
        self.policy
            .check(kept.as_str())
            .map_err(Error::InvalidKey)?;
        Ok(kept)
    }

    /// Forgets an operation's key once its call had a definite answer. The answer stands if
    /// that fails: a key left behind makes a later send of the operation a replay of it.
    async fn forget(&self, operation: &Operation, key: Key) {
        let (store, name) = (self.keys.clone(), operation.0.clone());
        let forgotten = tokio::task::spawn_blocking(move || store.forget(&name, &key)).await;
        if !matches!(forgotten, Ok(Ok(()))) {
            tracing::warn!(target: "idem", operation = %operation.0, "could not forget the key of an operation that has its answer");
        }
    }
}

#[async_trait::async_trait]
impl Middleware for Idempotency {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let operation = extensions.get::<Operation>().cloned();
        let guarded = matches!(*req.method(), Method::POST | Method::PATCH)
            || req.headers().contains_key(IDEMPOTENCY_KEY)
            || operation.is_some();
        if !guarded {
            return next.run(req, extensions).await;
        }
        let retry = extensions.get::<Retry>().copied().unwrap_or(self.retry);
        let lookup = extensions.get::<Lookup>().or(self.lookup.as_ref()).cloned();
        let mut req = req;
        if req.try_clone().is_none() {
            return Err(reqwest_middleware::Error::middleware(Error::NotReplayable));
        }
        let key = self
            .key(&req, operation.as_ref())
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        req.headers_mut()
            .insert(IDEMPOTENCY_KEY, header_value(&key));
        let ended = call::Call::new(key.clone(), retry, lookup)
            .run(req, extensions, next)
            .await;
        let definite = match &ended {
            Ok(_) => true,
            Err(e) => matches!(e, Error::Refused { .. }),
        };
        if let Some(operation) = &operation
            && definite
        {
            self.forget(operation, key).await;
        }
        ended.map_err(reqwest_middleware::Error::middleware)
    }
}

/// The header value of a key: a key is visible ASCII, which every header value may hold.
fn header_value(key: &Key) -> HeaderValue {
    HeaderValue::from_str(key.as_str()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The name of one logical operation (a checkout, a payment), set on its request as an
/// extension: every send of it, in this process or (with [`FileKeys`]) after a restart, carries
/// one key until it has a definite answer.
///
/// A request that sets its own `Idempotency-Key` keeps that key itself; an operation names the
/// calls whose key the middleware makes and keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation(Arc<str>);

impl Operation {
    /// The operation named `name` (a cart id, "refund of ORD-7"): unique among the client's
    /// operations, the same each time the same operation is sent.
    pub fn new(name: impl Into<String>) -> Self {
        Operation(name.into().into())
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }
}

/// Where to ask the server by key whether a request happened: a URL template whose `{key}` is
/// replaced with the key (percent-encoded), absolute or relative to the request's URL.
///
/// The lookup is a `GET` with the request's headers but its key and those that describe its
/// body, so that it is asked as the same principal (the server scopes keys per caller). It is
/// read as idem's `lookup` answers: the stored answer (with `Idempotent-Replayed: true`) or any
/// other 2xx is the call's answer, 404 says no request with the key is known, 409 that it is
/// still running; anything else says nothing, and the request is sent again with its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    template: Arc<str>,
}

/// The placeholder of a lookup's template.
const KEY_PLACEHOLDER: &str = "{key}";

impl Lookup {
    /// The lookup at `template`, such as `"/api/orders/by-key/{key}"`; an error when it has no
    /// `{key}`.
    pub fn new(template: &str) -> Result<Lookup, Error> {
        if !template.contains(KEY_PLACEHOLDER) {
            return Err(Error::Lookup(format!(
                "the template {template:?} has no {KEY_PLACEHOLDER}"
            )));
        }
        Ok(Lookup {
            template: template.into(),
        })
    }

    /// The template.
    pub fn template(&self) -> &str {
        &self.template
    }

    /// The lookup's URL for `key`, from the request's URL `base`.
    fn url(&self, base: &Url, key: &Key) -> Result<Url, Error> {
        let filled = self.template.replace(KEY_PLACEHOLDER, &percent_encode(key));
        // Absolute when it parses as such; else relative to the request's URL.
        Url::parse(&filled)
            .or_else(|_| base.join(&filled))
            .map_err(|e| Error::Lookup(format!("{filled:?} is not a URL: {e}")))
    }
}

/// A key as one path segment or query value: everything but RFC 3986's unreserved characters
/// percent-encoded (a key may hold `/`, `?`, `#` or `%`).
fn percent_encode(key: &Key) -> String {
    let mut out = String::with_capacity(key.as_str().len());
    for b in key.as_str().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One request of a call, in the extensions that middleware after [`Idempotency`] (closer to
/// the network) sees: its key, its number in the call, and whether it is a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    key: Key,
    number: u32,
    lookup: bool,
}

impl Attempt {
    /// The call's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Which request of the call this is, from 1, sends and lookups counted together.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Whether this request is the lookup by key rather than the request itself.
    pub fn is_lookup(&self) -> bool {
        self.lookup
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_one_path_segment_in_a_lookup() {
        let lookup = Lookup::new("/api/orders/by-key/{key}").unwrap();
        let base = Url::parse("http://127.0.0.1:3000/api/orders?x=1").unwrap();
        let key = Key::parse("a/b?c#d%e~f").unwrap();
        assert_eq!(
            lookup.url(&base, &key).unwrap().as_str(),
            "http://127.0.0.1:3000/api/orders/by-key/a%2Fb%3Fc%23d%25e~f"
        );
        let absolute = Lookup::new("http://other:8080/k/{key}").unwrap();
        assert_eq!(absolute.url(&base, &key).unwrap().host_str(), Some("other"));
        assert!(matches!(Lookup::new("/by-key"), Err(Error::Lookup(_))));
    }
}
