use idem::{Created, Error};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

// `user_id` is an INTEGER column.
#[idem::create_once(table = "orders", unique = "order_no", returning = Order, migrations = "migrations/sqlite")]
pub async fn insert_order(db: &sqlx::SqlitePool, order_no: &str, user_id: String, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
