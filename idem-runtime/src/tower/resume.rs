//! A resumable route's request sent again by a completer: [`resend`] rebuilds the stored
//! request and calls the guarded service with it, under the completer's claim.
//!
//! The guard learns that a request is a completer's re-send from an extension only this module
//! can build (`Resumed`): it carries the record's own scope, key and fingerprint, so that the
//! guard takes the claim the completer handed over without finding the principal again (it
//! may have come from a header that was not stored) and without reading the key header. A
//! client cannot send an extension, and no code outside idem can build this one.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Uri};

use super::envelope::StoredHttpRequest;
use crate::completer::Resumption;
use crate::error::{BoxError, Error};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::record::StoredRequest;

/// What a completer's re-sent request carries in its extensions: the record it finishes.
#[derive(Debug, Clone)]
pub(super) struct Resumed {
    pub(super) scope: String,
    pub(super) key: Key,
    pub(super) fingerprint: Fingerprint,
    pub(super) request: StoredRequest,
    /// Set by the guard that takes the request: a re-send that reached no guard is an error.
    taken: Arc<AtomicBool>,
}

impl Resumed {
    /// Marks the resumption taken by a guard.
    pub(super) fn take(&self) {
        self.taken.store(true, Ordering::Release);
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A resume function for [`Completer::resume`](crate::completer::Completer::resume) that sends
/// a resumable route's stored request ([`GuardLayer::resumable`](super::GuardLayer::resumable))
/// through `service` again: the request is rebuilt from its envelope (method, path and query,
/// the stored headers, the body; its body type `B` built from the bytes) and `service` is
/// called with it, in the completer's context.
///
/// `service` is the guarded one, the [`GuardService`](super::GuardService) (or a router with
/// the layer inside it, as `Router::layer` puts it): the guard finds the resumption in the
/// request and takes the claim the completer holds, with the record's own scope, key and
/// fingerprint, whatever the principal and route functions would find in the rebuilt request.
/// The inner service runs as the next attempt (its [`ClaimInfo`](crate::ClaimInfo): the same
/// [`downstream_key`](crate::ClaimInfo::downstream_key), the attempt number, the recovery
/// point), and its answer is stored as any other, so the client's later retry replays it byte
/// for byte. How the call ended (stored, released, kept unknown) is the completer's to learn, as
/// for `#[idempotent(resumable)]`.
///
/// Give it the guarded service below whatever authenticates: the completer's request carries
/// only the headers the route stored (no `Authorization` or `Cookie` unless named), and it is
/// trusted as the client's original request was when it was admitted. The function answers
/// the guarded service's response; it fails with [`Error::Decode`] when the stored request is
/// not an HTTP request envelope, with the service's error when the service fails, and with
/// [`Error::Config`] when the request reached no idem guard (the service given is not the
/// guarded one): the completer then keeps the claim and tries again later, then parks it.
///
/// ```
/// use std::convert::Infallible;
///
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use idem::completer::Completer;
/// use idem::tower::{resend, GuardBody, GuardLayer};
/// use idem::MemoryStore;
/// use tower::{service_fn, Layer};
///
/// async fn refund(_req: Request<GuardBody<Full<Bytes>>>) -> Result<Response<Full<Bytes>>, Infallible> {
///     Ok(Response::new(Full::from("refunded")))
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = MemoryStore::new();
/// let guarded = GuardLayer::new(store.clone())
///     .principal(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned()))
///     .resumable("refunds")
///     .layer(service_fn(refund));
/// // The service serves clients; the completer sends what they left unfinished again.
/// let running = Completer::new(store)
///     .resume("refunds", resend::<Full<Bytes>, _>(guarded.clone()))
///     .start()?;
/// # drop(running);
/// # Ok::<(), idem::Error>(())
/// # }).unwrap();
/// ```
pub fn resend<B, S>(
    service: S,
) -> impl Fn(Resumption) -> BoxFuture<Result<S::Response, BoxError>> + Send + Sync + 'static
where
    B: From<Bytes> + Send + 'static,
    S: tower_service::Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
{
    // Cloned for each resumption: the clone is polled ready and called, as tower wants.
    let service = Mutex::new(service);
    move |resumption: Resumption| {
        let mut service = service.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move {
            let (req, taken) = rebuild::<B>(&resumption)?;
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            let resp = service.call(req).await.map_err(Into::into)?;
            if !taken.load(Ordering::Acquire) {
                return Err(Error::Config(format!(
                    "the re-sent request of {:?} reached no idem guard: give resend the guarded service (GuardLayer::layer's), not the service inside it",
                    resumption.request().name()
                ))
                .into());
            }
            Ok(resp)
        })
    }
}

/// The stored request as an `http::Request`, carrying the resumption.
fn rebuild<B: From<Bytes>>(
    resumption: &Resumption,
) -> Result<(Request<B>, Arc<AtomicBool>), Error> {
    let stored = StoredHttpRequest::decode(resumption.payload()).map_err(|e| {
        Error::Decode(format!(
            "the stored request of {:?} (scope {:?}): {e}",
            resumption.request().name(),
            resumption.scope()
        ))
    })?;
    let StoredHttpRequest {
        method,
        target,
        headers,
        body,
    } = stored;
    let mut req = Request::new(B::from(body));
    *req.method_mut() = method;
    *req.uri_mut() = Uri::from(target);
    *req.headers_mut() = headers;
    let taken = Arc::new(AtomicBool::new(false));
    req.extensions_mut().insert(Resumed {
        scope: resumption.scope().to_owned(),
        key: resumption.key().clone(),
        fingerprint: *resumption.fingerprint(),
        request: resumption.request().clone(),
        taken: Arc::clone(&taken),
    });
    Ok((req, taken))
}
