use idem::idempotent;

#[derive(Debug)]
pub enum AppError {
    NotFound,
}

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<u64, AppError> {
    Err(AppError::NotFound)
}

fn main() {}
