use idem::{idempotent, Error};

pub struct Charge {
    pub order_no: String,
    pub amount: f32,
}

// A field's type is not written in the signature: the float is found by its type.
#[idempotent(scope = "charge:<req.amount>", key = key, skip(req))]
async fn charge(req: Charge, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
