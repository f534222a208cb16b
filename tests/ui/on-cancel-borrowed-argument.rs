use idem::{idempotent, Error, MemoryStore};

#[idempotent(scope = "refund:<order_no>", key = key, on_cancel = "finish")]
async fn refund(order_no: &str, key: String) -> Result<u64, Error> {
    Ok(order_no.len() as u64)
}

struct Payments {
    idem: MemoryStore,
}

impl Payments {
    #[idempotent(scope = "capture:<order_no>", key = key, store = self.idem, on_cancel = "finish")]
    async fn capture(&self, order_no: String, key: String) -> Result<u64, Error> {
        Ok(order_no.len() as u64)
    }
}

fn main() {}
