use idem::{idempotent, Error};

// "1-2" + "3" and "1" + "2-3" would render the same scope.
#[idempotent(scope = "order:<user>-<cart>", key = key)]
async fn order(user: String, cart: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
