//! What idem says to other software over HTTP (and gRPC, which is HTTP/2), written once and
//! independent of any web framework: the axum integration ([`axum`](crate::axum)), the guard for
//! any `http` service ([`tower`](crate::tower), tonic's servers among them), the client
//! ([`client`](crate::client)) and the OpenAPI contract ([`openapi`](crate::openapi)) all speak
//! through it, so a request, a replay and a refusal read the same whichever one a service uses.
//!
//! - The headers: [`IDEMPOTENCY_KEY`] (the request's key, the IETF draft's header) and
//!   [`IDEMPOTENT_REPLAYED`] (on an answer replayed from a record).
//! - Reading the key: [`key_in`], with the [`KeyPolicy`] a service sets.
//! - Marking a replay: [`mark_replayed`] (the header, and `Cache-Control: no-store`), read back
//!   by [`is_replayed`].
//! - Refusals: RFC 9457 problem details, [`Problem`]: idem's errors ([`Problem::from_error`]:
//!   the status ([`Error::status`]), the code ([`Error::code`]), the
//!   `application/problem+json` body and the `Retry-After` seconds of each [`Error`]) and an
//!   application's own; as a gRPC status for a gRPC call ([`is_grpc`],
//!   [`Problem::into_grpc`]).
//!
//! ```
//! use idem::http::Problem;
//! use idem::Error;
//!
//! let p = Problem::from_error(&Error::KeyReused);
//! assert_eq!(p.status().as_u16(), 422);
//! assert_eq!(
//!     &p.body()[..],
//!     &br#"{"type":"about:blank","title":"Unprocessable Entity","status":422,"code":"KEY_REUSED_WITH_DIFFERENT_BODY","detail":"the idempotency key was already used for a different request"}"#[..]
//! );
//! assert_eq!(p.retry_after_seconds(), None);
//! ```

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde_json::{Map, Value};

use crate::error::{Error, KeyError, Result, whole_seconds};
use crate::key::{Key, KeyPolicy};

/// `Idempotency-Key`, the request header of the IETF draft: where the key is read by default.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// `Idempotent-Replayed: true` marks an answer that was replayed, not computed.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// The idempotency key a request carries in `header`, checked with `policy`: a missing header
/// is [`KeyError::Missing`], and a value that is not a key the policy accepts its own
/// [`KeyError`] (bytes that are not text among them), each answered 400
/// `INVALID_IDEMPOTENCY_KEY`.
///
/// ```
/// use idem::http::{key_in, IDEMPOTENCY_KEY};
/// use idem::KeyPolicy;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert(IDEMPOTENCY_KEY, "k-1".parse().unwrap());
/// assert_eq!(key_in(&headers, &IDEMPOTENCY_KEY, KeyPolicy::DEFAULT).unwrap().as_str(), "k-1");
/// assert!(key_in(&headers, &IDEMPOTENCY_KEY, KeyPolicy::Uuid).is_err());
/// ```
pub fn key_in(headers: &HeaderMap, header: &HeaderName, policy: KeyPolicy) -> Result<Key> {
    let value = headers
        .get(header)
        .ok_or(Error::InvalidKey(KeyError::Missing))?;
    Key::parse_bytes(value.as_bytes(), policy)
}

/// Marks an answer as a replay: `Idempotent-Replayed: true`, and `Cache-Control: no-store`
/// (replacing a stored one), for it is one caller's stored answer, never something a cache on
/// the way may keep and share.
pub fn mark_replayed(headers: &mut HeaderMap) {
    headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// Whether an answer is marked as a replay ([`mark_replayed`]).
pub fn is_replayed(headers: &HeaderMap) -> bool {
    headers
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
}

/// Whether a request is a gRPC call: its content type is `application/grpc` (or a subtype,
/// `application/grpc+proto`), whose refusals are answered with [`Problem::into_grpc`].
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// The media type of a problem detail.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem detail, and what any framework needs to send it: its status, its
/// `application/problem+json` body and its `Retry-After`.
///
/// The body's members come in the order the RFC lists them (`type`, `title`, `status`), then
/// idem's `code` and `detail`, then any extension members ([`Problem::with`]). With the `axum`
/// feature it is an `IntoResponse`; elsewhere [`Problem::into_http`] makes it an `http`
/// response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    status: StatusCode,
    code: String,
    detail: String,
    extra: Map<String, Value>,
    retry_after: Option<u64>,
}

/// The body's members, in order.
#[derive(serde::Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    code: &'a str,
    detail: &'a str,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

impl Problem {
    /// A problem with a machine-readable `code` and a human-readable `detail`.
    pub fn new(status: StatusCode, code: impl Into<String>, detail: impl Into<String>) -> Self {
        Problem {
            status,
            code: code.into(),
            detail: detail.into(),
            extra: Map::new(),
            retry_after: None,
        }
    }

    /// The answer for `error`: its status and code ([`Error::status`], [`Error::code`]), a
    /// detail that says what went wrong without repeating what a store's driver said, and
    /// `Retry-After` when retrying can succeed. Server errors are logged.
    pub fn from_error(error: &Error) -> Self {
        let status =
            StatusCode::from_u16(error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(target: "idem", error = %error, "idempotency guard failed");
        }
        // Internal errors say what kind of failure it was, not what the store said.
        let detail = match error {
            Error::Unavailable(_) => {
                "the idempotency store is unavailable; retry with the same key".to_owned()
            }
            // A stored answer that cannot be read names its record, for the log only.
            Error::Store(_) | Error::Decode(_) | Error::Config(_) | Error::NoDefaultStore => {
                "the idempotency guard failed".to_owned()
            }
            other => other.to_string(),
        };
        Problem {
            retry_after: error.retry_after().map(whole_seconds),
            ..Problem::new(status, error.code(), detail)
        }
    }

    /// Adds an extension member, such as `"currentVersion": 7`. The names of the members
    /// [`Problem::new`] sets (`type`, `title`, `status`, `code`, `detail`) are ignored: the body
    /// never carries a member twice, and its `status` is always the response's.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        const STANDARD: [&str; 5] = ["type", "title", "status", "code", "detail"];
        if !STANDARD.contains(&name) {
            self.extra.insert(name.to_owned(), value.into());
        }
        self
    }

    /// Sets `Retry-After`, in seconds.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The HTTP status, also the body's `status` member.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The human-readable detail.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The `Retry-After` header, in seconds, when the client should try again.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
    }

    /// The `application/problem+json` body.
    pub fn body(&self) -> Bytes {
        let body = Body {
            kind: "about:blank",
            title: self.status.canonical_reason().unwrap_or("Error"),
            status: self.status.as_u16(),
            code: &self.code,
            detail: &self.detail,
            extra: &self.extra,
        };
        // Serializing strings, a number and JSON values into a Vec cannot fail.
        serde_json::to_vec(&body).unwrap_or_default().into()
    }

    /// The problem as an `http` response, with `Content-Type: application/problem+json` and
    /// `Retry-After` when set.
    ///
    /// The response carries the problem in its extensions too, so that a layer in front can
    /// answer it in another protocol ([`Problem::into_grpc`]).
    pub fn into_http<B: From<Bytes>>(self) -> Response<B> {
        let mut resp = Response::new(B::from(self.body()));
        *resp.status_mut() = self.status;
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        resp.extensions_mut().insert(self);
        resp
    }

    /// The gRPC status code a gRPC client gets for this problem, from its HTTP status: 400
    /// `INVALID_ARGUMENT` (3: a malformed or missing key), 401 `UNAUTHENTICATED` (16), 403
    /// `PERMISSION_DENIED` (7), 404 `NOT_FOUND` (5), 409 `ABORTED` (10: the request is in
    /// progress, parked, superseded, or its answer was not kept; it did not run again), 413 and
    /// 429 `RESOURCE_EXHAUSTED` (8), 422 `FAILED_PRECONDITION` (9: the key was used for another
    /// request), 503 `UNAVAILABLE` (14), any other 5xx `INTERNAL` (13), else `UNKNOWN` (2).
    pub fn grpc_code(&self) -> u32 {
        match self.status.as_u16() {
            400 => 3,
            401 => 16,
            403 => 7,
            404 => 5,
            409 => 10,
            413 | 429 => 8,
            422 => 9,
            503 => 14,
            500..=599 => 13,
            _ => 2,
        }
    }

    /// The problem as a gRPC answer: a trailers-only response (HTTP 200, no message) whose
    /// `grpc-status` is [`Problem::grpc_code`] and whose `grpc-message` is `CODE: detail`,
    /// percent-encoded as gRPC asks; `idempotency-error` holds the problem code alone, and
    /// `grpc-retry-pushback-ms` the `Retry-After` in milliseconds, when there is one (gRPC's
    /// own retry hint).
    pub fn into_grpc<B: From<Bytes>>(self) -> Response<B> {
        let mut resp = Response::new(B::from(Bytes::new()));
        let headers = resp.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(self.grpc_code()));
        let message = grpc_percent_encode(&format!("{}: {}", self.code, self.detail));
        if let Ok(message) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", message);
        }
        if let Ok(code) = HeaderValue::from_str(&self.code) {
            headers.insert("idempotency-error", code);
        }
        if let Some(secs) = self.retry_after {
            headers.insert(
                "grpc-retry-pushback-ms",
                HeaderValue::from(secs.saturating_mul(1000)),
            );
        }
        resp
    }
}

/// `grpc-message` is percent-encoded: every byte outside printable ASCII, and `%` itself.
fn grpc_percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_replay_is_marked_uncacheable_and_read_back() {
        let mut headers = HeaderMap::new();
        assert!(!is_replayed(&headers));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("max-age=600"));
        mark_replayed(&mut headers);
        assert!(is_replayed(&headers));
        assert_eq!(
            headers[CACHE_CONTROL], "no-store",
            "a stored Cache-Control gives way"
        );
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("false"));
        assert!(!is_replayed(&headers));
    }

    #[test]
    fn the_key_is_read_as_its_policy_says() {
        let mut headers = HeaderMap::new();
        let missing = key_in(&headers, &IDEMPOTENCY_KEY, KeyPolicy::DEFAULT);
        assert!(matches!(missing, Err(Error::InvalidKey(KeyError::Missing))));
        headers.insert(IDEMPOTENCY_KEY, HeaderValue::from_bytes(b"k\xff").unwrap());
        let not_text = key_in(&headers, &IDEMPOTENCY_KEY, KeyPolicy::DEFAULT);
        assert!(
            matches!(not_text, Err(Error::InvalidKey(_))),
            "{not_text:?}"
        );
        let other = HeaderName::from_static("x-request-key");
        headers.insert(other.clone(), HeaderValue::from_static("k-1"));
        assert_eq!(
            key_in(&headers, &other, KeyPolicy::DEFAULT)
                .unwrap()
                .as_str(),
            "k-1"
        );
    }

    #[test]
    fn grpc_calls_are_told_by_their_content_type() {
        let with = |ct: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            is_grpc(&headers)
        };
        assert!(with("application/grpc"));
        assert!(with("application/grpc+proto"));
        assert!(with("application/grpc; charset=utf-8"));
        assert!(!with("application/grpc-web"));
        assert!(!with("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn in_progress_carries_retry_after_in_whole_seconds() {
        let p = Problem::from_error(&Error::InProgress {
            retry_after: Duration::from_millis(2_100),
        });
        assert_eq!(p.status(), StatusCode::CONFLICT);
        assert_eq!(p.retry_after_seconds(), Some(3));
        let resp: Response<Bytes> = p.into_http();
        assert_eq!(resp.headers()[RETRY_AFTER], "3");
        assert_eq!(resp.headers()[CONTENT_TYPE], PROBLEM_JSON);
        let body: serde_json::Value = serde_json::from_slice(resp.body()).unwrap();
        assert_eq!(body["code"], "REQUEST_IN_PROGRESS");
        assert_eq!(body["status"], 409);
    }

    #[test]
    fn a_grpc_answer_is_trailers_only_with_its_code_and_an_encoded_message() {
        let p = Problem::from_error(&Error::InProgress {
            retry_after: Duration::from_millis(2_100),
        });
        assert_eq!(p.grpc_code(), 10);
        let resp: Response<Bytes> = p.into_grpc();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.body().is_empty());
        assert_eq!(resp.headers()["grpc-status"], "10");
        assert_eq!(resp.headers()["grpc-retry-pushback-ms"], "3000");
        assert_eq!(resp.headers()["idempotency-error"], "REQUEST_IN_PROGRESS");
        let p = Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "X", "déjà 100%");
        assert_eq!(p.grpc_code(), 9);
        let resp: Response<Bytes> = p.into_grpc();
        assert_eq!(resp.headers()["grpc-message"], "X: d%C3%A9j%C3%A0 100%25");
        assert!(resp.headers().get("grpc-retry-pushback-ms").is_none());
    }

    #[test]
    fn internal_errors_do_not_leak_the_driver_message() {
        let p = Problem::from_error(&Error::Unavailable("10.0.0.7:5432 refused".into()));
        assert_eq!(p.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(p.retry_after_seconds(), Some(1));
        let body = p.body();
        let text = std::str::from_utf8(&body).unwrap();
        assert!(text.contains("IDEMPOTENCY_STORE_UNAVAILABLE"), "{text}");
        assert!(!text.contains("10.0.0.7"), "{text}");
    }

    #[test]
    fn extension_members_never_repeat_a_standard_one() {
        // Found by fuzzing (fuzz target `problem`): `with("status", …)` wrote a second
        // `status` member, which most JSON readers take over the first.
        let p = Problem::new(StatusCode::CONFLICT, "STALE_VERSION", "read it again")
            .with("status", 500)
            .with("type", "https://example.com/x")
            .with("currentVersion", 7);
        assert_eq!(
            &p.body()[..],
            br#"{"type":"about:blank","title":"Conflict","status":409,"code":"STALE_VERSION","detail":"read it again","currentVersion":7}"#
        );
    }
}
