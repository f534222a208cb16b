use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String, note: impl std::fmt::Display) -> Result<u64, Error> {
    Ok(note.to_string().len() as u64)
}

#[idempotent(scope = "capture:<order_no>", key = key)]
async fn capture<N: std::fmt::Display + Clone>(order_no: String, key: String, note: &N) -> Result<u64, Error> {
    Ok(note.to_string().len() as u64)
}

fn main() {}
