use idem::{Created, Error};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

// NULLs never conflict: with `None` every call would insert another order.
#[idem::create_once(table = "orders", unique = "order_no", returning = Order)]
async fn insert_order(db: &sqlx::PgPool, order_no: Option<String>, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
