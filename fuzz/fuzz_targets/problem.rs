//! The problem+json error path: every `idem::Error` variant, with fuzzed contents, through
//! `Problem::from_error`, `into_http` and axum's `IntoResponse`, and `Problem` with
//! fuzzed statuses, codes, details and extension members.
//!
//! Properties: the HTTP status is `Error::status`, the body is JSON with the members `type`,
//! `title`, `status`, `code`, `detail` in that order and `code` = `Error::code`; the content type
//! is `application/problem+json`; `Retry-After` is there exactly when the error is retryable, in
//! whole seconds, at least one, rounded up; a store's message never reaches the client.

#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use axum::response::IntoResponse;
use bytes::Bytes;
use http::StatusCode;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use idem::http::{PROBLEM_JSON, Problem};
use idem::{Error, KeyError};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[derive(Arbitrary, Debug)]
enum FuzzKeyError {
    Missing,
    Empty,
    TooLong { len: usize, max: usize },
    InvalidByte { index: usize },
    NotUuid,
}

#[derive(Arbitrary, Debug)]
enum FuzzError {
    InvalidKey(FuzzKeyError),
    InvalidScope { len: usize, max: usize },
    InProgress { secs: u64, nanos: u32 },
    KeyReused,
    FenceLost { fence: u64 },
    Encode(String),
    Decode(String),
    Unavailable(String),
    Store(String),
    NoDefaultStore,
    Config(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    error: FuzzError,
    status: u16,
    code: String,
    detail: String,
    extra: Vec<(String, String)>,
    retry_after: Option<u64>,
}

fn build(e: &FuzzError) -> Error {
    match e {
        FuzzError::InvalidKey(k) => Error::InvalidKey(match k {
            FuzzKeyError::Missing => KeyError::Missing,
            FuzzKeyError::Empty => KeyError::Empty,
            FuzzKeyError::TooLong { len, max } => KeyError::TooLong {
                len: *len,
                max: *max,
            },
            FuzzKeyError::InvalidByte { index } => KeyError::InvalidByte { index: *index },
            FuzzKeyError::NotUuid => KeyError::NotUuid,
        }),
        FuzzError::InvalidScope { len, max } => Error::InvalidScope {
            len: *len,
            max: *max,
        },
        FuzzError::InProgress { secs, nanos } => Error::InProgress {
            retry_after: Duration::new(*secs, nanos % 1_000_000_000),
        },
        FuzzError::KeyReused => Error::KeyReused,
        FuzzError::FenceLost { fence } => Error::FenceLost { fence: *fence },
        FuzzError::Encode(s) => Error::Encode(s.clone()),
        FuzzError::Decode(s) => Error::Decode(s.clone()),
        FuzzError::Unavailable(s) => Error::Unavailable(s.clone().into()),
        FuzzError::Store(s) => Error::Store(s.clone().into()),
        FuzzError::NoDefaultStore => Error::NoDefaultStore,
        FuzzError::Config(s) => Error::Config(s.clone()),
    }
}

/// Seconds rounded up, at least one, saturating at `u64::MAX`.
fn whole_seconds(d: Duration) -> u64 {
    let up = d.as_nanos().div_ceil(1_000_000_000);
    u64::try_from(up).unwrap_or(u64::MAX).max(1)
}

/// The body as ordered members.
fn members(body: &[u8]) -> Vec<(String, Value)> {
    // serde_json's `Map` keeps insertion order only with `preserve_order`; read the object's
    // keys in order with a deserializer visitor instead.
    use serde::de::{Deserializer, MapAccess, Visitor};
    struct Ordered;
    impl<'de> Visitor<'de> for Ordered {
        type Value = Vec<(String, Value)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = m.next_entry::<String, Value>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let out = de
        .deserialize_map(Ordered)
        .expect("a problem body is a JSON object");
    de.end().expect("nothing after the object");
    out
}

fn check_members(body: &[u8], status: StatusCode, code: &str) -> Vec<(String, Value)> {
    let m = members(body);
    let names: Vec<&str> = m.iter().take(5).map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        ["type", "title", "status", "code", "detail"],
        "{m:?}"
    );
    assert_eq!(m[0].1, "about:blank");
    assert_eq!(m[1].1, status.canonical_reason().unwrap_or("Error"));
    assert_eq!(m[2].1, status.as_u16());
    assert_eq!(m[3].1, code);
    m
}

fn check_error(err: &Error, internal: Option<&str>) {
    let status = StatusCode::from_u16(err.status()).unwrap();
    assert!(matches!(err.status(), 400 | 409 | 422 | 500 | 503));
    let p = Problem::from_error(err);
    assert_eq!(p.status(), status);
    let m = check_members(&p.body(), status, err.code());
    assert_eq!(m.len(), 5);
    let detail = m[4].1.as_str().expect("detail is a string");
    if let Some(secret) = internal {
        // What a store's driver said stays in the log.
        assert!(
            detail == "the idempotency store is unavailable; retry with the same key"
                || detail == "the idempotency guard failed",
            "{detail:?} ({secret:?})"
        );
    } else {
        assert_eq!(detail, err.to_string());
    }
    assert_eq!(p.retry_after_seconds(), err.retry_after().map(whole_seconds));
    assert_eq!(p.retry_after_seconds().is_some(), err.is_retryable());

    for resp in [p.clone().into_http::<Bytes>(), {
        let (parts, body) = build_axum(err).into_parts();
        http::Response::from_parts(parts, body)
    }] {
        assert_eq!(resp.status(), status);
        assert_eq!(resp.headers()[CONTENT_TYPE], PROBLEM_JSON);
        assert_eq!(&resp.body()[..], &p.body()[..]);
        match p.retry_after_seconds() {
            Some(secs) => assert_eq!(resp.headers()[RETRY_AFTER], secs.to_string().as_str()),
            None => assert!(!resp.headers().contains_key(RETRY_AFTER)),
        }
    }
}

/// axum's rendering of the error, with its body read.
fn build_axum(err: &Error) -> http::Response<Bytes> {
    let resp = rebuild(err).into_response();
    let (parts, body) = resp.into_parts();
    let bytes = ready(axum::body::to_bytes(body, usize::MAX)).expect("a buffered body");
    http::Response::from_parts(parts, bytes)
}

/// `Error` is not `Clone`: the same error again.
fn rebuild(err: &Error) -> Error {
    match err {
        Error::InvalidKey(k) => Error::InvalidKey(k.clone()),
        Error::InvalidScope { len, max } => Error::InvalidScope {
            len: *len,
            max: *max,
        },
        Error::InProgress { retry_after } => Error::InProgress {
            retry_after: *retry_after,
        },
        Error::KeyReused => Error::KeyReused,
        Error::FenceLost { fence } => Error::FenceLost { fence: *fence },
        Error::Encode(s) => Error::Encode(s.clone()),
        Error::Decode(s) => Error::Decode(s.clone()),
        Error::Unavailable(e) => Error::Unavailable(e.to_string().into()),
        Error::Store(e) => Error::Store(e.to_string().into()),
        Error::NoDefaultStore => Error::NoDefaultStore,
        Error::Config(s) => Error::Config(s.clone()),
        other => panic!("a new error variant to fuzz: {other:?}"),
    }
}

fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("a buffered body waited"),
    }
}

fuzz_target!(|input: Input| {
    let err = build(&input.error);
    let internal = match &input.error {
        FuzzError::Unavailable(s)
        | FuzzError::Store(s)
        | FuzzError::Decode(s)
        | FuzzError::Config(s) => Some(s.as_str()),
        FuzzError::NoDefaultStore => Some(""),
        _ => None,
    };
    check_error(&err, internal);

    // Problems the application builds itself, with any status.
    let Ok(status) = StatusCode::from_u16(input.status) else {
        return;
    };
    let mut problem = Problem::new(status, input.code.clone(), input.detail.clone());
    let mut extra = serde_json::Map::new();
    for (k, v) in &input.extra {
        problem = problem.with(k, v.clone());
        extra.insert(k.clone(), Value::from(v.clone()));
    }
    if let Some(secs) = input.retry_after {
        problem = problem.retry_after(secs);
    }
    let resp = problem.into_response();
    assert_eq!(resp.status(), status);
    assert_eq!(resp.headers()[CONTENT_TYPE], PROBLEM_JSON);
    match input.retry_after {
        Some(secs) => assert_eq!(resp.headers()[RETRY_AFTER], secs.to_string().as_str()),
        None => assert!(!resp.headers().contains_key(RETRY_AFTER)),
    }
    let body = ready(axum::body::to_bytes(resp.into_body(), usize::MAX)).unwrap();
    let m = check_members(&body, status, &input.code);
    assert_eq!(m[4].1, input.detail.as_str());
    // Extension members follow; one named like a standard member is not a second copy of it.
    let standard = ["type", "title", "status", "code", "detail"];
    let rest: serde_json::Map<String, Value> = m[5..].iter().cloned().collect();
    let want: serde_json::Map<String, Value> = extra
        .into_iter()
        .filter(|(k, _)| !standard.contains(&k.as_str()))
        .collect();
    assert_eq!(rest, want);
});
