use idem::{Created, Error};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

// `user_id` is NOT NULL with no default.
#[idem::create_once(table = "orders", unique = "order_no", returning = Order, migrations = "migrations/mysql")]
pub async fn insert_order(db: &sqlx::MySqlPool, order_no: &str, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
