//! One call: its sends, lookups and waits, until a definite answer or the end of its bound.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{
    CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING,
};
use http::{Extensions, HeaderMap, Method, StatusCode, Version};
use reqwest::{Request, Response, ResponseBuilderExt, Url};
use reqwest_middleware::Next;
use tokio::time::Instant;

use super::outcome::{Answer, Attempts, Error, Last, Refusal};
use super::retry::{Retry, retry_after};
use super::{Attempt, Lookup};
use crate::error::codes;
use crate::http::IDEMPOTENCY_KEY;
use crate::key::Key;

/// A call under way.
pub(super) struct Call {
    key: Key,
    retry: Retry,
    lookup: Option<Lookup>,
    started: Instant,
    sent: u32,
    lookups: u32,
    backoffs: u32,
}

/// The next request of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The request itself.
    Send,
    /// The lookup by key.
    Ask,
}

/// How long to wait before the next request.
enum Wait {
    /// Not at all: the last answer says what to do next.
    Now,
    /// What the server said (`Retry-After`), else a backoff.
    Told(Option<Duration>),
}

/// Why a call that goes on would stop, if its bound ran out now.
enum Unfinished {
    /// The server still runs the request: [`Error::StillRunning`].
    Running(Option<Duration>),
    /// Anything else: [`Error::GaveUp`].
    Other(Last),
}

/// What one request came back with.
enum Seen {
    /// The call's answer.
    Answer(Response, Answer),
    /// The call's refusal.
    Refused(Refusal),
    /// Not the end: what to do next, after how long, and what to say if the bound runs out.
    Again {
        step: Step,
        wait: Wait,
        unfinished: Unfinished,
    },
}

impl Call {
    pub(super) fn new(key: Key, retry: Retry, lookup: Option<Lookup>) -> Call {
        Call {
            key,
            retry,
            lookup,
            started: Instant::now(),
            sent: 0,
            lookups: 0,
            backoffs: 0,
        }
    }

    /// Sends `req` (its key set, its body known to clone) until it has a definite answer.
    pub(super) async fn run(
        mut self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> Result<Response, Error> {
        let mut step = Step::Send;
        loop {
            let request = self.request(&req, step)?;
            match step {
                Step::Send => self.sent += 1,
                Step::Ask => self.lookups += 1,
            }
            extensions.insert(Attempt {
                key: self.key.clone(),
                number: self.sent + self.lookups,
                lookup: step == Step::Ask,
            });
            let result = next.clone().run(request, &mut *extensions).await;
            let (then, wait, unfinished) = match self.see(result, step).await {
                Seen::Answer(mut response, answer) => {
                    response.extensions_mut().insert(answer);
                    response.extensions_mut().insert(self.attempts());
                    return Ok(response);
                }
                Seen::Refused(refusal) => {
                    return Err(Error::Refused {
                        refusal: Box::new(refusal),
                        attempts: self.attempts(),
                    });
                }
                Seen::Again {
                    step,
                    wait,
                    unfinished,
                } => (step, wait, unfinished),
            };
            let wait = match wait {
                Wait::Now => Duration::ZERO,
                Wait::Told(Some(after)) => after,
                Wait::Told(None) => {
                    self.backoffs += 1;
                    self.retry.delay(self.backoffs - 1)
                }
            };
            if self.sent + self.lookups >= self.retry.attempts()
                || self.started.elapsed() + wait >= self.retry.elapsed()
            {
                return Err(self.give_up(unfinished));
            }
            tracing::debug!(
                target: "idem",
                key = %self.key,
                next = ?then,
                wait_ms = wait.as_millis() as u64,
                "idempotent call goes on"
            );
            tokio::time::sleep(wait).await;
            step = then;
        }
    }

    fn attempts(&self) -> Attempts {
        Attempts {
            key: self.key.clone(),
            sent: self.sent,
            lookups: self.lookups,
            elapsed: self.started.elapsed(),
        }
    }

    fn give_up(&self, unfinished: Unfinished) -> Error {
        let attempts = self.attempts();
        tracing::warn!(target: "idem", key = %self.key, sent = attempts.sent, lookups = attempts.lookups, "idempotent call gave up without a definite answer");
        match unfinished {
            Unfinished::Running(retry_after) => Error::StillRunning {
                retry_after,
                attempts,
            },
            Unfinished::Other(last) => Error::GaveUp { last, attempts },
        }
    }

    /// The next request: a copy of the request, or its lookup; neither may outlive the call's
    /// bound on time.
    fn request(&self, req: &Request, step: Step) -> Result<Request, Error> {
        let left = self.retry.elapsed().saturating_sub(self.started.elapsed());
        let timeout = req.timeout().map_or(left, |t| (*t).min(left));
        let mut request = match (step, &self.lookup) {
            (Step::Ask, Some(lookup)) => {
                let mut ask = Request::new(Method::GET, lookup.url(req.url(), &self.key)?);
                *ask.version_mut() = req.version();
                // Asked as the same principal: every header but the key and the body's.
                let about_body = [
                    CONTENT_TYPE,
                    CONTENT_LENGTH,
                    CONTENT_ENCODING,
                    TRANSFER_ENCODING,
                ];
                for (name, value) in req.headers() {
                    if *name != IDEMPOTENCY_KEY && !about_body.contains(name) {
                        ask.headers_mut().append(name.clone(), value.clone());
                    }
                }
                ask
            }
            _ => req.try_clone().ok_or(Error::NotReplayable)?,
        };
        *request.timeout_mut() = Some(timeout);
        Ok(request)
    }

    /// What `result`, the answer to a request of `step`, means for the call.
    async fn see(&self, result: reqwest_middleware::Result<Response>, step: Step) -> Seen {
        let read = match result {
            Ok(response) => Read::whole(response).await.map_err(Into::into),
            Err(e) => Err(e),
        };
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                // Nothing reached the server when the connection was refused: send the same
                // thing again. Otherwise the request may have run: ask, when there is a lookup.
                let unreached =
                    matches!(&e, reqwest_middleware::Error::Reqwest(r) if r.is_connect());
                let (step, wait) = match step {
                    Step::Send if !unreached && self.lookup.is_some() => (Step::Ask, Wait::Now),
                    step => (step, Wait::Told(None)),
                };
                return Seen::Again {
                    step,
                    wait,
                    unfinished: Unfinished::Other(Last::Transport(e)),
                };
            }
        };
        let replayed = crate::http::is_replayed(&read.headers);
        if step == Step::Ask && !replayed {
            read.lookup_answer()
        } else {
            // A send's answer, or the stored answer a lookup gave.
            let answer = if replayed || step == Step::Ask {
                Answer::Replayed
            } else {
                Answer::First
            };
            read.answer(answer)
        }
    }
}

/// A response read whole, so that an answer cut off mid-body is a lost answer, not a broken
/// one handed to the caller.
struct Read {
    status: StatusCode,
    version: Version,
    url: Url,
    headers: HeaderMap,
    extensions: Extensions,
    body: Bytes,
    /// `Retry-After`, read when the response came.
    retry_after: Option<Duration>,
    /// The problem+json `code` and `detail`, when the body is a problem.
    code: Option<String>,
    detail: Option<String>,
}

#[derive(serde::Deserialize)]
struct ProblemFields {
    code: Option<String>,
    detail: Option<String>,
}

impl Read {
    async fn whole(response: Response) -> reqwest::Result<Read> {
        let status = response.status();
        let version = response.version();
        let url = response.url().clone();
        let headers = response.headers().clone();
        let extensions = response.extensions().clone();
        let body = response.bytes().await?;
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| retry_after(v, SystemTime::now()));
        let problem = if status.is_client_error() || status.is_server_error() {
            serde_json::from_slice::<ProblemFields>(&body).ok()
        } else {
            None
        };
        let (code, detail) = problem.map_or((None, None), |p| (p.code, p.detail));
        Ok(Read {
            status,
            version,
            url,
            headers,
            extensions,
            body,
            retry_after,
            code,
            detail,
        })
    }

    /// `Retry-After` where it is honoured: on 409, 429 and 503.
    fn told(&self) -> Wait {
        match self.status.as_u16() {
            409 | 429 | 503 => Wait::Told(self.retry_after),
            _ => Wait::Told(None),
        }
    }

    /// A status that may change if the same request comes again later.
    fn busy(&self) -> bool {
        match self.status.as_u16() {
            408 | 425 | 429 => true,
            501 | 505 => false,
            _ => self.status.is_server_error(),
        }
    }

    fn last(&self) -> Last {
        Last::Status {
            status: self.status,
            code: self.code.clone(),
            retry_after: self.retry_after,
        }
    }

    /// What the answer to the request itself (or the stored answer a lookup gave) means.
    fn answer(self, answer: Answer) -> Seen {
        let running = self.status == StatusCode::CONFLICT
            && (matches!(
                self.code.as_deref(),
                Some(codes::REQUEST_IN_PROGRESS | codes::REQUEST_SUPERSEDED)
            ) || self.retry_after.is_some());
        if running {
            Seen::Again {
                step: Step::Send,
                wait: self.told(),
                unfinished: Unfinished::Running(self.retry_after),
            }
        } else if self.busy() {
            Seen::Again {
                step: Step::Send,
                wait: self.told(),
                unfinished: Unfinished::Other(self.last()),
            }
        } else if self.status.is_client_error() || self.status.is_server_error() {
            Seen::Refused(self.refusal())
        } else {
            Seen::Answer(self.into_response(), answer)
        }
    }

    /// What a lookup's own answer (not a stored one) means.
    fn lookup_answer(self) -> Seen {
        let (step, wait, unfinished) = match self.status {
            s if s.is_success() => return Seen::Answer(self.into_response(), Answer::Replayed),
            StatusCode::NOT_FOUND => (Step::Send, Wait::Now, Unfinished::Other(self.last())),
            // Still running: wait, then send it again with its key (see the module's docs).
            StatusCode::CONFLICT => (
                Step::Send,
                self.told(),
                Unfinished::Running(self.retry_after),
            ),
            _ if self.busy() => (Step::Ask, self.told(), Unfinished::Other(self.last())),
            _ => {
                // The lookup cannot say (a route that is not there, a refusal of its own):
                // whether the request ran is still unknown, and only sending it with its key
                // finds out safely.
                tracing::warn!(target: "idem", status = %self.status, url = %self.url, "the lookup by key gave no answer; sending the request again with its key");
                (Step::Send, Wait::Now, Unfinished::Other(self.last()))
            }
        };
        Seen::Again {
            step,
            wait,
            unfinished,
        }
    }

    fn refusal(self) -> Refusal {
        Refusal {
            status: self.status,
            code: self.code,
            detail: self.detail,
            headers: self.headers,
            body: self.body,
        }
    }

    fn into_response(self) -> Response {
        let mut response = http::Response::new(reqwest::Body::from(self.body));
        *response.status_mut() = self.status;
        *response.version_mut() = self.version;
        *response.headers_mut() = self.headers;
        *response.extensions_mut() = self.extensions;
        // The response's URL rides in an extension only reqwest's builder can make.
        if let Ok(with_url) = http::Response::builder().url(self.url).body(()) {
            response
                .extensions_mut()
                .extend(with_url.into_parts().0.extensions);
        }
        Response::from(response)
    }
}
