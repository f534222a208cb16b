//! A payment gateway simulator that honours idempotency keys, as real gateways (Stripe,
//! Square) do, and records the money it moves.
//!
//! Its ledger is a table in the service's database (`gateway_moves`, one row per key, unique on
//! the key): a restart keeps it, as a real gateway would, so a replayed refund after a restart
//! still finds its one money move.
//!
//! Two failures can be asked for with the demo header `X-Demo-Gateway`: `decline` (the gateway
//! refuses; no money moves) and `lose-answer` (the money moves, but the answer never arrives,
//! like a timeout after the gateway did its work).

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::Serialize;

/// One movement of money.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MoneyMove {
    pub id: String,
    pub idempotency_key: String,
    pub order_no: String,
    pub amount_cents: i64,
}

/// A row of `gateway_moves`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MoveRow {
    pub seq: i64,
    pub idempotency_key: String,
    pub order_no: String,
    pub amount_cents: i64,
}

impl From<MoveRow> for MoneyMove {
    fn from(r: MoveRow) -> MoneyMove {
        MoneyMove {
            id: format!("re_{:06}", r.seq),
            idempotency_key: r.idempotency_key,
            order_no: r.order_no,
            amount_cents: r.amount_cents,
        }
    }
}

/// How the simulated gateway behaves for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GatewayMode {
    /// Moves the money (once per key) and answers.
    #[default]
    Normal,
    /// Refuses: no money moves.
    Decline,
    /// Moves the money (once per key), then the answer is lost.
    LoseAnswer,
}

/// Why the gateway did not answer with a money move.
#[derive(Debug)]
pub enum GatewayError {
    /// It refused: no money moved.
    Declined,
    /// Its answer was lost: the money may have moved. Only a call with the same key can tell.
    AnswerLost,
    /// Its ledger could not be written.
    Store(idem::Error),
}

impl From<idem::Error> for GatewayError {
    fn from(e: idem::Error) -> Self {
        GatewayError::Store(e)
    }
}

/// The `X-Demo-Gateway` header: absent for a gateway that works, `decline` or `lose-answer`
/// to watch the refund handle a refusal or a lost answer. Anything else is 400.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoGateway(pub GatewayMode);

impl<S: Send + Sync> FromRequestParts<S> for DemoGateway {
    type Rejection = crate::app::AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.headers.get("x-demo-gateway").map(|v| v.as_bytes()) {
            None => Ok(DemoGateway(GatewayMode::Normal)),
            Some(b"decline") => Ok(DemoGateway(GatewayMode::Decline)),
            Some(b"lose-answer") => Ok(DemoGateway(GatewayMode::LoseAnswer)),
            Some(_) => Err(crate::app::AppError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_DEMO_GATEWAY",
                "X-Demo-Gateway is `decline` or `lose-answer`",
            )),
        }
    }
}
