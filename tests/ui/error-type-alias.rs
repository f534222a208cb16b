use idem::idempotent;

#[derive(Debug)]
pub enum AppError {
    NotFound,
}

pub type AppResult<T> = Result<T, AppError>;

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> AppResult<u64> {
    Err(AppError::NotFound)
}

fn main() {}
