//! What a guarded function may return: values that can be stored once and replayed exactly.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::record::StoredResponse;

/// Markers that keep the implementations of [`Replay`] apart (see [`Replay`]).
pub mod marker {
    /// Any `Serialize + DeserializeOwned` value, stored as JSON.
    #[derive(Debug)]
    pub enum Serde {}
    /// A type with its own [`ReplayBytes`](super::ReplayBytes) encoding.
    #[derive(Debug)]
    pub enum Bytes {}
    /// A response type of the HTTP integration.
    #[derive(Debug)]
    pub enum Http {}
    /// [`Idempotent`](super::Idempotent) around a replayable value.
    #[derive(Debug)]
    pub struct Wrapped<M>(std::marker::PhantomData<M>);
}

/// A value that can be stored when first returned and rebuilt, byte for byte, on replay.
///
/// Implemented for every `Serialize + DeserializeOwned` type (stored as JSON), for every
/// [`ReplayBytes`] type (your own encoding), for [`Idempotent<T>`], and under the `axum` feature for `Json<T>` and `(StatusCode, Json<T>)`.
/// The type parameter `M` is a marker that lets these implementations coexist; it is always
/// inferred, never written.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be replayed: an #[idempotent] function's `Ok` type must be storable",
    label = "cannot be stored and replayed",
    note = "derive `serde::Serialize` and `serde::Deserialize` for it, implement `idem::replay::ReplayBytes` for an encoding of your own, or return `axum::Json<T>` / `(StatusCode, axum::Json<T>)` (feature `axum`)"
)]
pub trait Replay<M = marker::Serde>: Sized {
    /// Encodes the first response for storage.
    fn encode(&self) -> Result<StoredResponse, Error>;
    /// Rebuilds the response from what was stored.
    fn decode(stored: StoredResponse) -> Result<Self, Error>;
}

impl<T: Serialize + DeserializeOwned> Replay<marker::Serde> for T {
    #[inline]
    fn encode(&self) -> Result<StoredResponse, Error> {
        serde_json::to_vec(self)
            .map(StoredResponse::ok)
            .map_err(|e| Error::Encode(e.to_string()))
    }

    fn decode(stored: StoredResponse) -> Result<Self, Error> {
        serde_json::from_slice(&stored.body).map_err(|e| Error::Decode(e.to_string()))
    }
}

/// What an HTTP answer of the `axum` feature (`Json<T>`, `(StatusCode, Json<T>)`) can carry:
/// any `Serialize + DeserializeOwned` type, stored as its JSON body.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be replayed inside `Json<…>`: the body of a stored answer must be storable",
    label = "cannot be stored and replayed as a JSON body",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait JsonBody: Serialize + DeserializeOwned {}

// Not looked through in diagnostics: a type lacking both derives is one error, this trait's.
#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned> JsonBody for T {}

/// A replay encoding of your own, for `Ok` types that are not serde types (a protobuf message,
/// a type from a crate without serde support).
///
/// Implement this or derive serde, not both: with both, the compiler cannot tell which encoding
/// to use.
///
/// ```
/// use idem::{Error, replay::ReplayBytes};
///
/// struct Receipt(u64);
///
/// impl ReplayBytes for Receipt {
///     fn to_replay_bytes(&self) -> Result<Vec<u8>, Error> {
///         Ok(self.0.to_be_bytes().to_vec())
///     }
///     fn from_replay_bytes(bytes: &[u8]) -> Result<Self, Error> {
///         let b: [u8; 8] = bytes.try_into().map_err(|_| Error::Decode("8 bytes expected".into()))?;
///         Ok(Receipt(u64::from_be_bytes(b)))
///     }
/// }
/// ```
pub trait ReplayBytes: Sized {
    /// Encodes the value for storage.
    fn to_replay_bytes(&self) -> Result<Vec<u8>, Error>;
    /// Decodes a stored value.
    fn from_replay_bytes(bytes: &[u8]) -> Result<Self, Error>;
}

impl<T: ReplayBytes> Replay<marker::Bytes> for T {
    fn encode(&self) -> Result<StoredResponse, Error> {
        self.to_replay_bytes().map(StoredResponse::ok)
    }

    fn decode(stored: StoredResponse) -> Result<Self, Error> {
        T::from_replay_bytes(&stored.body)
    }
}

/// A result that says whether it was computed now or replayed.
///
/// Return `Result<Idempotent<T>, E>` from an `#[idempotent]` function when the caller needs to
/// know. It stores and replays exactly like `T`.
///
/// ```
/// use idem::Idempotent;
/// let first = Idempotent::Fresh(7);
/// assert!(!first.is_replay());
/// assert_eq!(first.into_inner(), 7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Idempotent<T> {
    /// The body ran and produced this.
    Fresh(T),
    /// The body did not run: this is the stored response of an earlier run.
    Replayed(T),
}

impl<T> Idempotent<T> {
    /// Whether this is a replay.
    pub fn is_replay(&self) -> bool {
        matches!(self, Idempotent::Replayed(_))
    }

    /// The value, however it came.
    pub fn into_inner(self) -> T {
        match self {
            Idempotent::Fresh(v) | Idempotent::Replayed(v) => v,
        }
    }

    /// A reference to the value.
    pub fn get(&self) -> &T {
        match self {
            Idempotent::Fresh(v) | Idempotent::Replayed(v) => v,
        }
    }
}

impl<T> std::ops::Deref for Idempotent<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.get()
    }
}

impl<T: Replay<M>, M> Replay<marker::Wrapped<M>> for Idempotent<T> {
    fn encode(&self) -> Result<StoredResponse, Error> {
        self.get().encode()
    }

    fn decode(stored: StoredResponse) -> Result<Self, Error> {
        T::decode(stored).map(Idempotent::Replayed)
    }
}

/// An error type whose final errors are stored and replayed like successes.
///
/// By default an error releases the claim so a retry runs the body again: only successes are
/// worth replaying. Some errors are answers, though (a declined card, an order that cannot be
/// refunded): with `on_error = "store_final"` on `#[idempotent]`, errors for which
/// [`FinalError::is_final`] is true are stored and every retry gets the same error back.
pub trait FinalError: Serialize + DeserializeOwned {
    /// Whether this error is a final answer rather than a failure worth retrying.
    fn is_final(&self) -> bool;
}

pub(crate) fn encode_final<E: FinalError>(err: &E) -> Result<StoredResponse, Error> {
    let mut stored = err.encode()?;
    stored.is_error = true;
    Ok(stored)
}

pub(crate) fn decode_final<E: FinalError>(stored: StoredResponse) -> Result<E, Error> {
    E::decode(stored)
}

/// The replay marker of an `Ok` type, as a value: what generated code fixes the marker with
/// ([`ErrorOps::replayed_as`](crate::flow::ErrorOps::replayed_as)).
#[derive(Debug)]
pub struct Shape<M>(pub(crate) std::marker::PhantomData<fn() -> M>);
