use idem::{idempotent, Error};

#[derive(serde::Serialize)]
pub struct RefundReq {
    pub cents: u64,
    pub note: String,
}

#[idempotent(scope = "refund:<order_no>", key = key, skip(req.note))]
async fn refund(order_no: String, key: String, req: RefundReq) -> Result<u64, Error> {
    Ok(req.cents)
}

fn main() {}
