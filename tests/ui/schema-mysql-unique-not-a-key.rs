use idem::{Created, Error};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

// MySQL says a number is taken only with a duplicate key: `user_id` has none.
#[idem::create_once(table = "orders", unique = "user_id", returning = Order, migrations = "migrations/mysql")]
pub async fn insert_order(db: &sqlx::MySqlPool, order_no: &str, user_id: i64, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
