//! Every macro reaches idem through a re-exported path when told where it is.

use idem::{Created, Error, Transition, Versioned};

mod deps {
    pub use ::idem;
}

idem::state_machine! {
    #[idem(crate = "crate::deps::idem")]
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
    }
    Pending -> Paid;
}

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

#[idem::state_transition(
    table = "orders",
    key = "order_no",
    from = "PENDING",
    to = "PAID",
    machine = OrderStatus,
    crate = "crate::deps::idem",
)]
pub async fn mark_paid(db: &sqlx::SqlitePool, order_no: &str) -> Result<Transition<(), OrderStatus>, Error>;

#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname", crate = "crate::deps::idem")]
pub async fn rename(db: &sqlx::SqlitePool, user_id: i64, nickname: &str, version: i64) -> Result<Versioned, Error>;

#[idem::create_once(table = "orders", unique = "order_no", returning = Order, crate = "crate::deps::idem")]
pub async fn insert_order(db: &sqlx::SqlitePool, order_no: &str) -> Result<Created<Order>, Error>;

pub struct User {
    pub id: u64,
}

fn main() {
    let user = User { id: 7 };
    let scope = idem::scope!("order:<user.id>", crate = "crate::deps::idem").unwrap();
    assert_eq!(scope, "order:7");
    assert_eq!(OrderStatus::Pending.as_str(), "PENDING");
}
