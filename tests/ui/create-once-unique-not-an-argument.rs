use idem::{Created, Error};

#[derive(sqlx::FromRow)]
pub struct Order {
    pub id: i64,
}

#[idem::create_once(table = "orders", unique = "order_no", returning = Order)]
async fn insert_order(db: &sqlx::PgPool, user_id: i64, amount_cents: i64) -> Result<Created<Order>, Error>;

fn main() {}
