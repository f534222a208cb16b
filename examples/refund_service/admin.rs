//! idem's admin view under `/admin`, for operators only: every request must carry
//! `Authorization: Bearer <token>` with the token from `ADMIN_TOKEN`. Anything else is a 401
//! problem+json answer, whatever `X-User-Id` says: the demo users are not operators.
//!
//! A bearer token rather than a cookie or HTTP Basic: a browser never attaches it on its own.
//! The view does not count on it: a release must come from its own page (a signed form, for
//! the fence the page showed, and never from another site), so a proxy that adds the header
//! after its own login is as safe. Reach the view with curl (`/admin/api/…` answers JSON), or
//! through such a proxy.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use idem::Store;
use idem::admin::Admin;
use idem::axum::Problem;

/// The variable that holds the operators' token.
pub const ADMIN_TOKEN_VAR: &str = "ADMIN_TOKEN";

/// The token used when `ADMIN_TOKEN` is not set: for development only, since anyone who reads
/// this file knows it.
pub const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

/// The token an operator's requests must carry.
#[derive(Clone)]
pub struct AdminToken(Arc<str>);

impl AdminToken {
    /// `ADMIN_TOKEN`, or the development default when it is unset or empty.
    pub fn from_env() -> AdminToken {
        match std::env::var(ADMIN_TOKEN_VAR) {
            Ok(t) if !t.is_empty() => AdminToken(t.into()),
            _ => AdminToken(DEV_ADMIN_TOKEN.into()),
        }
    }

    /// Whether this is the development default.
    pub fn is_dev(&self) -> bool {
        &*self.0 == DEV_ADMIN_TOKEN
    }

    /// Whether `authorization` is `Bearer <this token>`; compared in constant time.
    fn admits(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(given) = authorization.and_then(|v| v.as_bytes().strip_prefix(b"Bearer ")) else {
            return false;
        };
        let want = self.0.as_bytes();
        given.len() == want.len()
            && given
                .iter()
                .zip(want)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

/// The admin view of `store` with releases allowed, behind the operators' token: to nest under
/// `/admin`.
pub fn router<S: Store + Clone>(store: S, token: AdminToken) -> Router {
    Admin::new(store)
        .allow_release(true)
        .router()
        .layer(middleware::from_fn_with_state(token, operators_only))
}

async fn operators_only(State(token): State<AdminToken>, request: Request, next: Next) -> Response {
    if token.admits(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    let mut response = Problem::new(
        StatusCode::UNAUTHORIZED,
        "ADMIN_TOKEN_REQUIRED",
        "the admin view is for operators: send Authorization: Bearer <the ADMIN_TOKEN the service was started with>",
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"admin\""),
    );
    response
}
