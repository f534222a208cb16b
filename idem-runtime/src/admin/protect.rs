//! What keeps the admin view from releasing a claim its operator did not mean to release,
//! however it is mounted (behind a bearer token, a login proxy's cookie, or on a port only
//! operators reach):
//!
//! - **Another site's request is refused.** A browser says where a request comes from:
//!   `Sec-Fetch-Site` (every current browser), else `Origin`. A release whose `Sec-Fetch-Site`
//!   is anything but `same-origin` or `none` (typed or bookmarked), or, without it, whose
//!   `Origin` is not the address the request was sent to, is refused (403). A request that
//!   says neither comes from a program, not from a page another site served.
//! - **A release form carries its token.** Each record page's form holds an HMAC-SHA256, keyed
//!   by a secret of the view's own, of what it releases: the scope, the key and the fence the
//!   page showed. A form without it, or with one written for another record, another fence or
//!   by another secret, is refused (403): only a page the view served can release.
//! - **No page may frame the view** (`X-Frame-Options: DENY`, `frame-ancestors 'none'`), so a
//!   click on another site cannot land on its button; the pages load nothing but their own
//!   inline style (`default-src 'none'`), send no referrer, and are never cached.

use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, Uri, header};
use axum::response::Response;
use hmac::{KeyInit as _, Mac as _};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The headers every answer of the view carries.
const SECURE_HEADERS: [(header::HeaderName, &str); 5] = [
    (header::X_FRAME_OPTIONS, "DENY"),
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
    ),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "no-referrer"),
    // Pages show stored answers: nothing on the way may keep them.
    (header::CACHE_CONTROL, "no-store"),
];

/// Adds [`SECURE_HEADERS`] to an answer of the view.
pub(super) async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in SECURE_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Why a request is refused as sent by another site's page, or `None` when it is not.
pub(super) fn cross_site(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" | b"none" => None,
            _ => Some(format!(
                "the browser says it came from another site (Sec-Fetch-Site: {})",
                String::from_utf8_lossy(site.as_bytes())
            )),
        };
    }
    let origin = text(header::ORIGIN)?;
    let host = text(header::HOST).or_else(|| uri.authority().map(|a| a.as_str()));
    match host {
        Some(host) if same_origin(origin, host) => None,
        _ => Some(format!(
            "the browser says it came from another site (Origin: {origin}, sent to {})",
            host.unwrap_or("an address it does not name")
        )),
    }
}

/// Whether `origin` (`https://ops.example:8443`) names `host` (a `Host` header), a default
/// port written or not; `null` and anything else that is not an HTTP origin names nothing.
fn same_origin(origin: &str, host: &str) -> bool {
    let (authority, default_port) = if let Some(rest) = origin.strip_prefix("https://") {
        (rest, ":443")
    } else if let Some(rest) = origin.strip_prefix("http://") {
        (rest, ":80")
    } else {
        return false;
    };
    let bare = |a: &'_ str| {
        a.strip_suffix(default_port)
            .unwrap_or(a)
            .to_ascii_lowercase()
    };
    bare(authority) == bare(host)
}

/// The secret release forms are signed with: drawn from the operating system for each view,
/// or given ([`Admin::form_secret`](super::Admin::form_secret)) so that several instances
/// accept each other's forms. `None` when the system had no randomness to give: releasing is
/// then refused.
#[derive(Clone)]
pub(super) struct FormKey(Option<Arc<[u8]>>);

impl fmt::Debug for FormKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "FormKey(..)"
        } else {
            "FormKey(none)"
        })
    }
}

impl FormKey {
    /// A secret of 32 random bytes.
    pub(super) fn random() -> FormKey {
        let mut secret = [0u8; 32];
        match getrandom::fill(&mut secret) {
            Ok(()) => FormKey(Some(secret.into())),
            Err(e) => {
                tracing::error!(target: "idem", error = %e, "the admin view has no secret for its release forms (the system gave no randomness): releasing is refused until Admin::form_secret sets one");
                FormKey(None)
            }
        }
    }

    /// `secret` (none when it is empty).
    pub(super) fn given(secret: &[u8]) -> FormKey {
        FormKey((!secret.is_empty()).then(|| secret.into()))
    }

    fn mac(&self, action: Action, scope: &str, key: &str, fence: u64) -> Option<HmacSha256> {
        let secret = self.0.as_deref()?;
        let mut mac = HmacSha256::new_from_slice(secret).ok()?;
        // The action first: a release form's token never retries, nor the other way round.
        // Lengths next, so that no two (scope, key) pairs are written the same.
        mac.update(match action {
            Action::Release => b"idem admin release v1\0".as_slice(),
            Action::Retry => b"idem admin retry v1\0".as_slice(),
        });
        for part in [scope, key] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(&fence.to_be_bytes());
        Some(mac)
    }

    /// The token of the form that does `action` to `(scope, key)` at `fence`, in hex; `None`
    /// without a secret.
    pub(super) fn token(
        &self,
        action: Action,
        scope: &str,
        key: &str,
        fence: u64,
    ) -> Option<String> {
        let tag = self.mac(action, scope, key, fence)?.finalize().into_bytes();
        Some(super::hex(&tag))
    }

    /// Whether `token` is the token of `action` on `(scope, key)` at `fence`; compared in
    /// constant time.
    pub(super) fn admits(
        &self,
        action: Action,
        scope: &str,
        key: &str,
        fence: u64,
        token: &str,
    ) -> bool {
        let Some(tag) = unhex(token) else {
            return false;
        };
        self.mac(action, scope, key, fence)
            .is_some_and(|mac| mac.verify_slice(&tag).is_ok())
    }
}

/// What a signed form does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Releases a claim (`/release`).
    Release,
    /// Retries parked work (`/retry`).
    Retry,
}

impl Action {
    /// The action, as a page names it: `release`, `retry`.
    pub(super) fn noun(self) -> &'static str {
        match self {
            Action::Release => "release",
            Action::Retry => "retry",
        }
    }

    /// What it did: `released`, `retried`.
    pub(super) fn done(self) -> &'static str {
        match self {
            Action::Release => "released",
            Action::Retry => "retried",
        }
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    header::HeaderName::from_static(n),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn only_the_views_own_origin_or_a_program_may_post() {
        let uri = Uri::from_static("/admin/release");
        let allowed: &[&[(&str, &str)]] = &[
            &[],
            &[("sec-fetch-site", "same-origin")],
            &[("sec-fetch-site", "none")],
            &[
                ("origin", "http://ops.example:3000"),
                ("host", "ops.example:3000"),
            ],
            &[
                ("origin", "https://OPS.example"),
                ("host", "ops.example:443"),
            ],
            &[("origin", "http://ops.example"), ("host", "ops.example")],
        ];
        for h in allowed {
            assert_eq!(cross_site(&headers(h), &uri), None, "{h:?}");
        }
        let refused: &[&[(&str, &str)]] = &[
            &[("sec-fetch-site", "cross-site")],
            &[("sec-fetch-site", "same-site")],
            &[("sec-fetch-site", "same-origin, cross-site")],
            &[("origin", "null"), ("host", "ops.example")],
            &[
                ("origin", "http://ops.example.attacker"),
                ("host", "ops.example"),
            ],
            &[
                ("origin", "http://ops.example:3001"),
                ("host", "ops.example:3000"),
            ],
            &[
                ("origin", "https://ops.example"),
                ("host", "ops.example:80"),
            ],
            &[("origin", "http://ops.example")],
        ];
        for h in refused {
            assert!(cross_site(&headers(h), &uri).is_some(), "{h:?}");
        }
    }

    #[test]
    fn a_token_admits_only_its_record_fence_and_secret() {
        let key = FormKey::random();
        let token = key.token(Action::Release, "refund:1", "k", 7).unwrap();
        assert_eq!(token.len(), 64);
        assert!(key.admits(Action::Release, "refund:1", "k", 7, &token));
        assert!(key.admits(Action::Release, "refund:1", "k", 7, &token.to_uppercase()));
        for (scope, k, fence) in [
            ("refund:1", "k", 8),
            ("refund:1", "j", 7),
            ("refund:", "1k", 7),
        ] {
            assert!(
                !key.admits(Action::Release, scope, k, fence, &token),
                "{scope} {k} {fence}"
            );
        }
        assert!(!FormKey::random().admits(Action::Release, "refund:1", "k", 7, &token));
        assert!(!key.admits(Action::Release, "refund:1", "k", 7, ""));
        assert!(!key.admits(Action::Release, "refund:1", "k", 7, "zz"));
        assert!(!key.admits(Action::Release, "refund:1", "k", 7, "é"));
        // A release's token does not retry, and a retry's does not release.
        assert!(!key.admits(Action::Retry, "refund:1", "k", 7, &token));
        let retry = key.token(Action::Retry, "refund:1", "k", 7).unwrap();
        assert!(key.admits(Action::Retry, "refund:1", "k", 7, &retry));
        assert!(!key.admits(Action::Release, "refund:1", "k", 7, &retry));
        let given = FormKey::given(b"a shared secret");
        assert_eq!(
            given.token(Action::Release, "s", "k", 1),
            FormKey::given(b"a shared secret").token(Action::Release, "s", "k", 1)
        );
        let none = FormKey::given(b"");
        assert_eq!(none.token(Action::Release, "s", "k", 1), None);
        assert!(!none.admits(Action::Release, "s", "k", 1, &token));
    }
}
