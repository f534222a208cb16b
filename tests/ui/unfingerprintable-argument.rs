use idem::{idempotent, Error};

pub struct RefundRequest {
    pub cents: u64,
}

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String, req: RefundRequest) -> Result<u64, Error> {
    Ok(req.cents)
}

fn main() {}
