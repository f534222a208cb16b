//! What an idempotent call ended with, typed: an answer (the first, or a replay), still
//! running, refused; what it took; and the errors that are none of these.

use std::fmt;
use std::io;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use reqwest::Response;

use crate::error::KeyError;
use crate::key::Key;

/// What a call took: its key, the requests it made and how long it ran. Attached to an
/// answer's response (`response.extensions().get::<Attempts>()`) and carried by every outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempts {
    pub(super) key: Key,
    pub(super) sent: u32,
    pub(super) lookups: u32,
    pub(super) elapsed: Duration,
}

impl Attempts {
    /// The idempotency key every request of the call carried.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// How many times the request was sent.
    pub fn sent(&self) -> u32 {
        self.sent
    }

    /// How many times the server was asked by key whether the request had happened.
    pub fn lookups(&self) -> u32 {
        self.lookups
    }

    /// From the first request to the end of the call.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

/// Whose answer a response is. Attached to the response of every answered call
/// (`response.extensions().get::<Answer>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The server ran the request for this call, and this is its answer.
    First,
    /// The server had run the request before (an attempt of this call whose answer was lost,
    /// or another caller with the same key): its stored answer, marked `Idempotent-Replayed:
    /// true`, or the lookup's answer after a timeout.
    Replayed,
}

/// The server's refusal of a request: a status that says the request, as sent, will never
/// succeed (400, 422 and the other 4xx but 408, 425, 429 and a 409 that asks to wait; 501,
/// 505), with its problem+json `code` and `detail` when it had them. Never retried: it is a bug
/// in the caller or a state of the server's resource, to be fixed rather than repeated.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub(super) status: StatusCode,
    pub(super) code: Option<String>,
    pub(super) detail: Option<String>,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
}

impl Refusal {
    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem code (`"KEY_REUSED_WITH_DIFFERENT_BODY"`, `"INVALID_IDEMPOTENCY_KEY"`, or the
    /// service's own), when the body was a problem with one: compare it with
    /// [`codes`](crate::error::codes).
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The problem's `detail`, when it had one.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// The response's headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The response's body, whole.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.status)?;
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        if let Some(detail) = &self.detail {
            write!(f, ": {detail}")?;
        }
        Ok(())
    }
}

/// How a call ended, when it ended with something the server said.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The server ran the request for this call: its answer, body read whole.
    First(Response),
    /// The server had run it before: its stored answer ([`Answer::Replayed`]), body read whole.
    Replayed(Response),
    /// The call gave up while the server still ran the request (409): its key is kept (by the
    /// [`PendingKeys`](super::PendingKeys) of its [`Operation`](super::Operation)), and sending
    /// it again later with the same key gets its answer. `retry_after` is when the server last
    /// said to come back.
    StillRunning {
        /// The last `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The server refused the request; it was not retried.
    Refused(Refusal),
}

/// A call's outcome and what it took.
#[derive(Debug)]
pub struct Sent {
    /// How it ended.
    pub outcome: Outcome,
    /// Its key and its requests.
    pub attempts: Attempts,
}

impl Sent {
    /// The outcome of a call made through a client with the [`Idempotency`](super::Idempotency)
    /// middleware: an answer, still running or refused, or the [`Error`] it ended with.
    pub fn from_result(result: reqwest_middleware::Result<Response>) -> Result<Sent, Error> {
        match result {
            Ok(response) => {
                let answered = response.extensions();
                let (Some(answer), Some(attempts)) = (
                    answered.get::<Answer>(),
                    answered.get::<Attempts>().cloned(),
                ) else {
                    return Err(Error::NotGuarded);
                };
                let outcome = match answer {
                    Answer::First => Outcome::First(response),
                    Answer::Replayed => Outcome::Replayed(response),
                };
                Ok(Sent { outcome, attempts })
            }
            Err(reqwest_middleware::Error::Middleware(e)) => match e.downcast::<Error>() {
                Ok(Error::Refused { refusal, attempts }) => Ok(Sent {
                    outcome: Outcome::Refused(*refusal),
                    attempts,
                }),
                Ok(Error::StillRunning {
                    retry_after,
                    attempts,
                }) => Ok(Sent {
                    outcome: Outcome::StillRunning { retry_after },
                    attempts,
                }),
                Ok(other) => Err(other),
                Err(e) => Err(Error::Transport(reqwest_middleware::Error::Middleware(e))),
            },
            Err(e) => Err(Error::Transport(e)),
        }
    }
}

/// Sends `request` and types its outcome: [`Sent::from_result`] of `request.send()`.
pub async fn send(request: reqwest_middleware::RequestBuilder) -> Result<Sent, Error> {
    Sent::from_result(request.send().await)
}

/// What was last seen when a call gave up without a definite answer.
#[derive(Debug)]
#[non_exhaustive]
pub enum Last {
    /// A status that may change on a retry (408, 425, 429, 5xx; a lookup's 404), with its
    /// problem code and `Retry-After` when it had them.
    Status {
        /// The status.
        status: StatusCode,
        /// The problem code.
        code: Option<String>,
        /// The `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// No answer: a timeout, a dropped connection, a refused connection.
    Transport(reqwest_middleware::Error),
}

impl fmt::Display for Last {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Last::Status { status, code, .. } => {
                write!(f, "{status}")?;
                if let Some(code) = code {
                    write!(f, " {code}")?;
                }
                Ok(())
            }
            Last::Transport(e) => write!(f, "{e}"),
        }
    }
}

/// Why a call through the [`Idempotency`](super::Idempotency) middleware did not end with an
/// answer. [`Error::Refused`] and [`Error::StillRunning`] are outcomes, which
/// [`Sent::from_result`] turns into [`Outcome`]s; the middleware returns them as errors because
/// a plain `send()` has no other way to say them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request's `Idempotency-Key` breaks the key policy the server applies (the
    /// middleware's [`KeyPolicy`](crate::KeyPolicy)). Nothing was sent.
    #[error("the request's idempotency key is refused before sending: {0}")]
    InvalidKey(#[source] KeyError),

    /// The request's body is a stream, which cannot be sent a second time: a retry would send
    /// another request under the same key. Nothing was sent; give the body as bytes.
    #[error(
        "the request's body is a stream and cannot be sent again on a retry: give it as bytes (a String, a Vec<u8>, .json(…))"
    )]
    NotReplayable,

    /// The lookup's URL could not be made from its template and the request's URL.
    #[error("the lookup by key is misconfigured: {0}")]
    Lookup(String),

    /// A key could not be made (the system's random source failed) or kept (the
    /// [`PendingKeys`](super::PendingKeys) store failed). Nothing was sent.
    #[error("the idempotency key could not be made or kept: {0}")]
    Keys(#[source] io::Error),

    /// The server refused the request ([`Outcome::Refused`]).
    #[error("the server refused the request: {refusal}")]
    Refused {
        /// The refusal.
        refusal: Box<Refusal>,
        /// What the call took.
        attempts: Attempts,
    },

    /// The call gave up while the server still ran the request ([`Outcome::StillRunning`]).
    #[error(
        "the request with idempotency key {} is still running; gave up after {} requests", attempts.key, attempts.sent + attempts.lookups
    )]
    StillRunning {
        /// The last `Retry-After`.
        retry_after: Option<Duration>,
        /// What the call took.
        attempts: Attempts,
    },

    /// The bound on attempts or time ran out without a definite answer. Whether the server ran
    /// the request is unknown: its key is kept (by the [`PendingKeys`](super::PendingKeys) of
    /// its [`Operation`](super::Operation)), and sending it again with the same key is safe.
    #[error(
        "no definite answer for idempotency key {} after {} requests in {:?}: last {last}", attempts.key, attempts.sent + attempts.lookups, attempts.elapsed
    )]
    GaveUp {
        /// What was seen last.
        last: Last,
        /// What the call took.
        attempts: Attempts,
    },

    /// A request the middleware did not guard (sent through a client without it, or one it
    /// passes through: a `GET` without a key) has no outcome of its own.
    #[error("the request did not go through the idempotency middleware")]
    NotGuarded,

    /// An error of reqwest or of another middleware, for a request the middleware did not
    /// guard.
    #[error(transparent)]
    Transport(reqwest_middleware::Error),
}
