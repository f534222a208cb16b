use idem::{idempotent, Error};

// A store built inside the attribute is built again on every call: a new, empty memory store
// each time, so every call is a first call and a retry runs the body again.
#[idempotent(scope = "refund:<order_no>", key = key, store = idem::MemoryStore::new())]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

// The same with a struct literal and with a builder chain.
pub struct Config {
    pub capacity: usize,
}

#[idempotent(scope = "charge:<order_no>", key = key, store = idem::SqliteStore::builder().connect("sqlite::memory:").await?)]
async fn charge(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

#[idempotent(scope = "ship:<order_no>", key = key, store = &Config { capacity: 1 })]
async fn ship(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
