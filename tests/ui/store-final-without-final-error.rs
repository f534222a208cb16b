use idem::{idempotent, Error};

#[derive(Debug)]
pub struct PayError(String);

impl From<Error> for PayError {
    fn from(e: Error) -> Self {
        PayError(e.to_string())
    }
}

#[idempotent(scope = "pay:<order_no>", key = key, on_error = "store_final")]
async fn pay(order_no: String, key: String) -> Result<u64, PayError> {
    Ok(1)
}

fn main() {}
