use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String, #[idem(ignore)] trace_id: u64) -> Result<u64, Error> {
    Ok(trace_id)
}

fn main() {}
