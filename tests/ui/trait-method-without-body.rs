use idem::{idempotent, Error};

pub trait Payments {
    #[idempotent(scope = "refund:<order_no>", key = key)]
    async fn refund(&self, order_no: String, key: String) -> Result<u64, Error>;
}

fn main() {}
