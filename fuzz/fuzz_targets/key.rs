//! Key parsing: `Key::parse_with` under every policy, and the HTTP extractor that reads the
//! `Idempotency-Key` header, against an independent statement of the rules.
//!
//! Input: one byte choosing the policy (and a `max_len` for the visible-ASCII one), the rest the
//! raw key bytes.

#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use axum::extract::FromRequestParts;
use http::{HeaderValue, Request};
use idem::axum::IdempotencyKey;
use idem::{Error, Key, KeyError, KeyPolicy, ToKey};
use libfuzzer_sys::fuzz_target;

/// What the policy should answer, written without looking at idem's code.
fn expected(raw: &[u8], policy: KeyPolicy) -> Result<(), KeyError> {
    if raw.is_empty() {
        return Err(KeyError::Empty);
    }
    match policy {
        KeyPolicy::VisibleAscii { max_len } => {
            if raw.len() > max_len {
                return Err(KeyError::TooLong {
                    len: raw.len(),
                    max: max_len,
                });
            }
            match raw.iter().position(|b| !(0x21..=0x7E).contains(b)) {
                Some(index) => Err(KeyError::InvalidByte { index }),
                None => Ok(()),
            }
        }
        KeyPolicy::Uuid => {
            let ok = raw.len() == 36
                && raw.iter().enumerate().all(|(i, b)| {
                    if [8, 13, 18, 23].contains(&i) {
                        *b == b'-'
                    } else {
                        matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F')
                    }
                });
            if ok { Ok(()) } else { Err(KeyError::NotUuid) }
        }
        _ => unreachable!("only the two policies are fuzzed"),
    }
}

/// Polls a future that never waits (the extractor reads headers only).
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the key extractor waited"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, raw)) = data.split_first() else {
        return;
    };
    let policy = match selector % 4 {
        0 => KeyPolicy::Uuid,
        1 => KeyPolicy::DEFAULT,
        _ => KeyPolicy::VisibleAscii {
            max_len: usize::from(selector / 4),
        },
    };

    // The library's own string type: only UTF-8 reaches `Key::parse_with`.
    if let Ok(text) = std::str::from_utf8(raw) {
        let want = expected(raw, policy);
        assert_eq!(policy.check(text), want, "check({text:?}, {policy:?})");
        match Key::parse_with(text, policy) {
            Ok(key) => {
                assert!(want.is_ok());
                // The key is kept exactly as sent.
                assert_eq!(key.as_str(), text);
                assert_eq!(key.to_string(), text);
                assert_eq!(AsRef::<str>::as_ref(&key), text);
                assert_eq!(key.to_key().unwrap(), key);
                assert_eq!(Some(&key).to_key().unwrap(), key);
            }
            Err(Error::InvalidKey(e)) => {
                assert_eq!(Err(e.clone()), want);
                let err = Error::InvalidKey(e);
                assert_eq!(err.status(), 400);
                assert_eq!(err.code(), "INVALID_IDEMPOTENCY_KEY");
                assert!(!err.to_string().is_empty());
            }
            Err(other) => panic!("parse_with({text:?}) gave {other:?}"),
        }
        // The default policy is what `parse`, `FromStr` and `ToKey for str` use.
        let default = expected(raw, KeyPolicy::DEFAULT);
        assert_eq!(Key::parse(text).is_ok(), default.is_ok());
        assert_eq!(text.parse::<Key>().is_ok(), default.is_ok());
        assert_eq!(text.to_key().is_ok(), default.is_ok());
    }

    // The HTTP extractor sees the header's bytes, UTF-8 or not, with the default policy.
    if let Ok(value) = HeaderValue::from_bytes(raw) {
        let (mut parts, ()) = Request::builder()
            .header("idempotency-key", value)
            .body(())
            .unwrap()
            .into_parts();
        let got = ready(IdempotencyKey::from_request_parts(&mut parts, &()));
        match (got, expected(raw, KeyPolicy::DEFAULT)) {
            (Ok(key), Ok(())) => assert_eq!(key.as_str().as_bytes(), raw),
            (Err(Error::InvalidKey(e)), Err(want)) => assert_eq!(e, want, "header {raw:?}"),
            (got, want) => panic!("header {raw:?}: got {got:?}, want {want:?}"),
        }
    }
});
