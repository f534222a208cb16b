//! The body the guard hands on: the buffered bytes of a guarded request or answer, or the
//! original stream of one that passes through.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;

use crate::error::BoxError;

pin_project! {
    /// A request body as the inner service sees it, and an answer's body as the client gets it:
    /// the buffered bytes (and trailers) of a guarded exchange, a replay or a problem, or the
    /// original body of one that passes through unguarded.
    pub struct GuardBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes>, trailers: Option<HeaderMap> },
        Inner { #[pin] body: B },
        // What was read of an answer too large or too slow to keep, then the rest of it.
        Rest { prefix: Option<Bytes>, body: Pin<Box<B>> },
        Failed { error: Option<BoxError> },
    }
}

impl<B> GuardBody<B> {
    /// Buffered bytes.
    pub fn full(data: Bytes) -> Self {
        GuardBody::buffered(data, None)
    }

    /// Buffered bytes, then trailers.
    pub(crate) fn buffered(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        GuardBody {
            kind: Kind::Full {
                data: Some(data).filter(|d| !d.is_empty()),
                trailers,
            },
        }
    }

    /// The original body, streamed through.
    pub fn inner(body: B) -> Self {
        GuardBody {
            kind: Kind::Inner { body },
        }
    }

    /// `prefix` (what the guard read of the body before it stopped), then the rest of `body`.
    pub(crate) fn rest(prefix: Bytes, body: Pin<Box<B>>) -> Self {
        GuardBody {
            kind: Kind::Rest {
                prefix: Some(prefix).filter(|p| !p.is_empty()),
                body,
            },
        }
    }

    /// A body that fails with `error` when read: an answer whose body failed while the guard
    /// read it ends for the client as it would have without the guard.
    pub(crate) fn failed(error: BoxError) -> Self {
        GuardBody {
            kind: Kind::Failed { error: Some(error) },
        }
    }
}

impl<B> From<Bytes> for GuardBody<B> {
    fn from(data: Bytes) -> Self {
        GuardBody::full(data)
    }
}

impl<B> fmt::Debug for GuardBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Full { .. } => "buffered",
            Kind::Inner { .. } | Kind::Rest { .. } => "streamed",
            Kind::Failed { .. } => "failed",
        };
        f.debug_tuple("GuardBody").field(&kind).finish()
    }
}

impl<B> Body for GuardBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { data, trailers } => Poll::Ready(match data.take() {
                Some(d) => Some(Ok(Frame::data(d))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
            KindProj::Inner { body } => match body.poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(
                    // `Bytes` hands itself over without a copy.
                    frame.map_data(|mut d| d.copy_to_bytes(d.remaining())),
                ))),
            },
            KindProj::Rest { prefix, body } => {
                if let Some(p) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(p))));
                }
                match body.as_mut().poll_frame(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(None) => Poll::Ready(None),
                    Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                    Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(
                        frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
                    ))),
                }
            }
            KindProj::Failed { error } => Poll::Ready(error.take().map(Err)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Rest { prefix, body } => prefix.is_none() && body.is_end_stream(),
            Kind::Failed { error } => error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { body } => body.size_hint(),
            Kind::Rest { prefix, body } => {
                let before = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let rest = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + before);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + before);
                }
                hint
            }
            Kind::Failed { .. } => SizeHint::default(),
        }
    }
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// It is longer than the limit.
    TooLarge,
    /// Its stream failed.
    Failed(BoxError),
}

impl ReadError {
    /// The error, as a body reports it.
    pub(crate) fn into_error(self) -> BoxError {
        match self {
            ReadError::TooLarge => "the body is longer than the limit".into(),
            ReadError::Failed(e) => e,
        }
    }
}

/// An answer's body as the guard read it.
pub(crate) enum Answered<B> {
    /// Whole, with its trailers.
    Whole(Bytes, Option<HeaderMap>),
    /// Longer than the limit: what was read, and the rest, still to stream.
    Over(Bytes, Pin<Box<B>>),
}

/// Reads an answer's `body` whole, with its trailers, unless it passes `limit` bytes: then
/// stops, and hands back what it read and the rest of the stream, never buffering more.
pub(crate) async fn read_answer<B>(body: B, limit: usize) -> Result<Answered<B>, ReadError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut read = BytesMut::new();
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Failed(e.into()))?;
        match frame.into_data() {
            Ok(mut data) => {
                let data = data.copy_to_bytes(data.remaining());
                if read.is_empty() && data.len() <= limit && body.is_end_stream() {
                    // One chunk, the common case, is kept as it came.
                    return Ok(Answered::Whole(data, None));
                }
                read.extend_from_slice(&data);
                if read.len() > limit {
                    return Ok(Answered::Over(read.freeze(), body));
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(t),
                        None => trailers = Some(t),
                    }
                }
            }
        }
    }
    Ok(Answered::Whole(read.freeze(), trailers))
}

/// Reads `body` whole, with its trailers, refusing it as soon as it passes `limit` bytes.
pub(crate) async fn read<B>(
    body: B,
    limit: Option<usize>,
) -> Result<(Bytes, Option<HeaderMap>), ReadError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    let mut len = 0usize;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Failed(e.into()))?;
        match frame.into_data() {
            Ok(mut data) => {
                len = len.saturating_add(data.remaining());
                if limit.is_some_and(|limit| len > limit) {
                    return Err(ReadError::TooLarge);
                }
                let data = data.copy_to_bytes(data.remaining());
                // One chunk, the common case, is kept as it came; more are joined.
                match (&mut first, &mut rest) {
                    (None, _) => first = Some(data),
                    (Some(f), None) => {
                        let mut joined = BytesMut::with_capacity(f.len() + data.len());
                        joined.extend_from_slice(f);
                        joined.extend_from_slice(&data);
                        rest = Some(joined);
                    }
                    (Some(_), Some(joined)) => joined.extend_from_slice(&data),
                }
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(t),
                        None => trailers = Some(t),
                    }
                }
            }
        }
    }
    let data = match (first, rest) {
        (_, Some(joined)) => joined.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    };
    Ok((data, trailers))
}
