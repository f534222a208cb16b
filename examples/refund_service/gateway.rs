//! A payment gateway simulator that honours idempotency keys, as real gateways (Stripe,
//! Square) do, and records the money it moves.
//!
//! Its ledger is a table in the service's database (`gateway_moves`, one row per key, unique on
//! the key): a restart keeps it, as a real gateway would, so a replayed refund after a restart
//! still finds its one money move.

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
