//! A payment gateway simulator that honours idempotency keys, as real gateways (Stripe,
//! Square) do, and counts the money it moves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

#[derive(Default)]
struct Ledger {
    by_key: HashMap<String, MoneyMove>,
    moves: Vec<MoneyMove>,
}

/// The gateway: a refund with a key it has seen returns the first refund and moves nothing.
#[derive(Clone, Default)]
pub struct Gateway {
    ledger: Arc<Mutex<Ledger>>,
}

impl Gateway {
    /// Refunds `amount_cents` for `order_no`, once per `idempotency_key`.
    pub async fn refund(
        &self,
        idempotency_key: &str,
        order_no: &str,
        amount_cents: i64,
    ) -> MoneyMove {
        // A network call would be here; the lock stands for the gateway's own unique index.
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = ledger.by_key.get(idempotency_key) {
            return seen.clone();
        }
        let id = format!("re_{:06}", ledger.moves.len() + 1);
        let m = MoneyMove {
            id,
            idempotency_key: idempotency_key.to_owned(),
            order_no: order_no.to_owned(),
            amount_cents,
        };
        ledger.by_key.insert(idempotency_key.to_owned(), m.clone());
        ledger.moves.push(m.clone());
        m
    }

    /// Every money move so far.
    pub fn moves(&self) -> Vec<MoneyMove> {
        self.ledger
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .moves
            .clone()
    }
}
