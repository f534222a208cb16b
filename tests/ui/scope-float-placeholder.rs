use idem::{idempotent, Error};

// A float is no identity: 0.1 + 0.2 renders as 0.30000000000000004, not 0.3.
#[idempotent(scope = "charge:<order_no>:<amount>", key = key)]
async fn charge(order_no: String, amount: f64, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
