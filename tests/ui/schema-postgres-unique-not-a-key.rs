use idem::{Created, Error};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

// `ON CONFLICT (user_id)` needs a unique constraint on it.
#[idem::create_once(table = "orders", unique = "user_id", returning = Order, migrations = "migrations/pg")]
pub async fn insert_order(db: &sqlx::PgPool, order_no: &str, user_id: i64, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
