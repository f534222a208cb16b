use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<impl serde::Serialize, Error> {
    Ok(1)
}

fn main() {}
