use async_trait::async_trait;
use idem::{idempotent, Error, MemoryStore};

#[async_trait]
pub trait Payments {
    async fn refund(&self, order_no: String, key: String) -> Result<u64, Error>;
}

pub struct Gateway {
    pub idem: MemoryStore,
}

#[async_trait]
impl Payments for Gateway {
    #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem)]
    async fn refund(&self, order_no: String, key: String) -> Result<u64, Error> {
        Ok(order_no.len() as u64)
    }
}

fn main() {}
