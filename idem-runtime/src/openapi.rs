//! The idempotency contract of guarded handlers, written into an OpenAPI document (feature
//! `utoipa`).
//!
//! The IETF Idempotency-Key draft asks each API to publish its idempotency rules: which header
//! carries the key, what it may hold, which answers mean what, how long a key is kept. idem knows
//! all of it when the handler is compiled: every `#[idempotent]` function registers its
//! [`Contract`] (its name, scope template, lease, retention, wait), and [`Idempotency`], a
//! [`utoipa::Modify`], writes it into each operation of a document whose operation id is a
//! guarded function's name (utoipa's default: the handler's name). For each such operation:
//!
//! - the key header (`Idempotency-Key`, or [`Idempotency::header`]), required, with what the
//!   [`KeyPolicy`] accepts;
//! - the refusals as `application/problem+json`, each with its problem code: 400
//!   `INVALID_IDEMPOTENCY_KEY`, 409 `REQUEST_IN_PROGRESS` with `Retry-After` (and the other 409
//!   codes), 422 `KEY_REUSED_WITH_DIFFERENT_BODY`;
//! - on every success answer, the `Idempotent-Replayed` header, which a replay carries;
//! - `x-idempotency`: the header, the scope, and the lease, retention and wait in seconds, or
//!   `null` where the attribute sets none (then the call's context or [`Policy::DEFAULT`] says).
//!
//! ```
//! use idem::openapi::Idempotency;
//! use idem::{idempotent, MemoryStore};
//! use utoipa::{Modify as _, OpenApi};
//!
//! #[utoipa::path(post, path = "/refunds", responses((status = 201, description = "refunded")))]
//! #[idempotent(scope = "refund", key = key, store = store, retain = "48h")]
//! async fn issue_refund(store: &MemoryStore, key: &str) -> Result<u64, idem::Error> {
//!     Ok(1)
//! }
//!
//! #[derive(OpenApi)]
//! #[openapi(paths(issue_refund))]
//! struct Api;
//!
//! let mut doc = Api::openapi();
//! Idempotency::new().modify(&mut doc);
//! let op = doc.paths.paths["/refunds"].post.as_ref().unwrap();
//! assert_eq!(op.parameters.as_ref().unwrap()[0].name, "Idempotency-Key");
//! assert!(op.responses.responses.contains_key("409"));
//! let contract = &op.extensions.as_ref().unwrap()["x-idempotency"];
//! assert_eq!(contract["retentionSeconds"], 48 * 3600);
//! //! ```

use std::time::Duration;

use http::HeaderName;
use serde_json::json;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{Content, Header, OpenApi, RefOr, Required, Response, Schema};

use crate::error::{Error, KeyError};
use crate::http::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::key::KeyPolicy;
use crate::record::Policy;

/// What one `#[idempotent]` function promises, as its attribute says it: registered by the
/// function itself when the `utoipa` feature is on, read with [`contracts`] and [`contract`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contract {
    /// The function's name: what utoipa makes its operation id.
    pub function: &'static str,
    /// The module it is declared in (`module_path!()`).
    pub module: &'static str,
    /// The scope template, as written (`"refund:<order_no>"`).
    pub scope: &'static str,
    /// The attribute's `lease`, if it sets one.
    pub lease: Option<Duration>,
    /// The attribute's `retain`, if it sets one.
    pub retain: Option<Duration>,
    /// The attribute's `wait`, if it sets one.
    pub wait: Option<Duration>,
    /// Whether the call is transactional (`transaction = …`).
    pub transactional: bool,
}

impl Contract {
    #[doc(hidden)]
    pub const fn new(
        function: &'static str,
        module: &'static str,
        scope: &'static str,
        lease_ms: Option<u64>,
        retain_ms: Option<u64>,
        wait_ms: Option<u64>,
        transactional: bool,
    ) -> Contract {
        const fn ms(v: Option<u64>) -> Option<Duration> {
            match v {
                Some(ms) => Some(Duration::from_millis(ms)),
                None => None,
            }
        }
        Contract {
            function,
            module,
            scope,
            lease: ms(lease_ms),
            retain: ms(retain_ms),
            wait: ms(wait_ms),
            transactional,
        }
    }
}

inventory::collect!(Contract);

#[doc(hidden)]
pub use inventory::submit as __submit;

/// Every guarded function's contract linked into this program.
pub fn contracts() -> impl Iterator<Item = &'static Contract> {
    inventory::iter::<Contract>.into_iter()
}

/// The contract of the guarded function named `function`, when exactly one has that name. Two
/// functions of one name in different modules are told apart by [`Contract::module`], through
/// [`contracts`]; [`Idempotency`] documents neither, and says so in the log.
pub fn contract(function: &str) -> Option<&'static Contract> {
    let mut found = contracts().filter(|c| c.function == function);
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Writes the guarded operations' idempotency contract into an OpenAPI document; see the
/// [module](self) documentation.
#[derive(Debug, Clone)]
pub struct Idempotency {
    header: HeaderName,
    key_policy: KeyPolicy,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency::new()
    }
}

impl Idempotency {
    /// The defaults of idem's HTTP integrations: `Idempotency-Key`, [`KeyPolicy::DEFAULT`].
    pub fn new() -> Idempotency {
        Idempotency {
            header: IDEMPOTENCY_KEY,
            key_policy: KeyPolicy::DEFAULT,
        }
    }

    /// The header that carries the key, as the service's layer reads it.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// The keys the service accepts, as its layer checks them.
    pub fn key_policy(mut self, policy: KeyPolicy) -> Self {
        self.key_policy = policy;
        self
    }

    /// Writes `contract` into `op`: the key header, the refusals, the replay marker and
    /// `x-idempotency`. Done by [`Modify`](utoipa::Modify) for every guarded operation; call it
    /// for an operation whose id is not its function's name.
    pub fn document(&self, op: &mut Operation, contract: &Contract) {
        let header = self.header.as_str();
        let parameters = op.parameters.get_or_insert_with(Vec::new);
        if !parameters
            .iter()
            .any(|p| p.parameter_in == ParameterIn::Header && p.name.eq_ignore_ascii_case(header))
        {
            parameters.push(
                ParameterBuilder::new()
                    .name(display_header(header))
                    .parameter_in(ParameterIn::Header)
                    .required(Required::True)
                    .description(Some(format!(
                        "The idempotency key: one per logical operation, the same on every retry of it. {}",
                        self.accepts()
                    )))
                    .schema(Some(self.key_schema()))
                    .build(),
            );
        }
        for (status, response) in op.responses.responses.iter_mut() {
            if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
                response.headers.insert(
                    display_header(IDEMPOTENT_REPLAYED.as_str()),
                    described(
                        Header::new(string()),
                        "`true` on an answer replayed from the first request's record, byte for byte: the request did not run again.",
                    ),
                );
            }
        }
        // The statuses and codes as idem answers them (`Error::status`, `Error::code`), from
        // each refusal a guarded call can meet: grouped by status, in order.
        let refused = [
            Error::InvalidKey(KeyError::Missing),
            Error::InProgress {
                retry_after: Duration::from_secs(1),
            },
            Error::Parked,
            Error::AnswerNotKept { len: None, max: 0 },
            Error::FenceLost { fence: 0 },
            Error::KeyReused,
        ];
        let mut refusals: Vec<(String, &str, Vec<&str>, bool)> = Vec::new();
        for error in &refused {
            let status = error.status().to_string();
            let retry_after = error.retry_after().is_some();
            match refusals.iter_mut().find(|r| r.0 == status) {
                Some(r) => {
                    r.2.push(error.code());
                    r.3 |= retry_after;
                }
                None => {
                    let description = refusal_description(error.status());
                    refusals.push((status, description, vec![error.code()], retry_after));
                }
            }
        }
        for (status, description, codes, retry_after) in refusals {
            let mut response = Response::new(description);
            response.content.insert(
                "application/problem+json".to_owned(),
                Content::new(Some(problem(&codes))),
            );
            if retry_after {
                response.headers.insert(
                    "Retry-After".to_owned(),
                    described(
                        Header::new(integer()),
                        "Seconds to wait before sending the request again, with the same key.",
                    ),
                );
            }
            op.responses
                .responses
                .entry(status)
                .or_insert(RefOr::T(response));
        }
        let seconds = |d: Option<Duration>| d.map(|d| d.as_secs());
        let default = Policy::DEFAULT;
        op.extensions.get_or_insert_with(Default::default).insert(
            "x-idempotency".to_owned(),
            json!({
                "header": display_header(header),
                "scope": contract.scope,
                "leaseSeconds": seconds(contract.lease),
                "retentionSeconds": seconds(contract.retain),
                "waitSeconds": seconds(contract.wait),
                "defaultLeaseSeconds": default.lease.as_secs(),
                "defaultRetentionSeconds": default.retain.as_secs(),
                "transactional": contract.transactional,
            }),
        );
    }

    /// What the key policy accepts, in words.
    fn accepts(&self) -> String {
        match self.key_policy {
            KeyPolicy::VisibleAscii { max_len } => {
                format!("1 to {max_len} bytes of visible ASCII (0x21 to 0x7E).")
            }
            KeyPolicy::Uuid => "A UUID in its 36-character hyphenated form.".to_owned(),
        }
    }

    fn key_schema(&self) -> ObjectBuilder {
        let object = ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1));
        match self.key_policy {
            KeyPolicy::VisibleAscii { max_len } => object.max_length(Some(max_len)),
            KeyPolicy::Uuid => object.min_length(Some(36)).max_length(Some(36)),
        }
    }
}

impl utoipa::Modify for Idempotency {
    fn modify(&self, openapi: &mut OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
                &mut item.options,
                &mut item.head,
                &mut item.trace,
            ]
            .into_iter()
            .flatten()
            {
                let Some(id) = op.operation_id.as_deref() else {
                    continue;
                };
                match contract(id) {
                    Some(contract) => self.document(op, contract),
                    None if contracts().any(|c| c.function == id) => {
                        let modules: Vec<_> = contracts()
                            .filter(|c| c.function == id)
                            .map(|c| c.module)
                            .collect();
                        tracing::warn!(
                            target: "idem",
                            operation = id,
                            ?modules,
                            "several guarded functions have this operation's id as their name: its idempotency contract is not written; give the operations ids of their own, or write it with Idempotency::document"
                        );
                    }
                    None => {}
                }
            }
        }
    }
}

/// `idempotency-key` as documents write it: `Idempotency-Key`.
fn display_header(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

fn described(mut header: Header, description: &str) -> Header {
    header.description = Some(description.to_owned());
    header
}

fn string() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .build()
        .into()
}

fn integer() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .build()
        .into()
}

/// A problem+json body whose `code` is one of `codes`.
fn problem(codes: &[&str]) -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("type", string())
        .property("title", string())
        .property("status", integer())
        .property(
            "code",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(codes.iter().copied())),
        )
        .property("detail", string())
        .required("status")
        .required("code")
        .build()
        .into()
}

/// What a refusal's status means to the client, as its operation documents it.
fn refusal_description(status: u16) -> &'static str {
    match status {
        400 => "The idempotency key is missing or malformed.",
        409 => {
            "The request with this key is still running (try again after `Retry-After`), its work was parked for an operator, its answer was too large to keep, or a newer attempt took it over. It did not run again."
        }
        422 => {
            "The key was used before with another request body: send a new key for a new request."
        }
        _ => "The idempotency guard refused the request.",
    }
}
