//! What `#[async_trait]` on an `impl` block makes of an `async fn` before `#[idempotent]` on
//! the method sees it.

use std::future::Future;
use std::pin::Pin;

use idem::{idempotent, Error, MemoryStore};

pub trait Payments {
    fn refund<'a>(&'a self, order_no: String, key: String) -> Pin<Box<dyn Future<Output = Result<u64, Error>> + Send + 'a>>;
}

pub struct Gateway {
    pub idem: MemoryStore,
}

impl Payments for Gateway {
    #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem)]
    fn refund<'a>(&'a self, order_no: String, key: String) -> Pin<Box<dyn Future<Output = Result<u64, Error>> + Send + 'a>> {
        Box::pin(async move {
            let __self = self;
            let __ret: Result<u64, Error> = { Ok(order_no.len() as u64) };
            __ret
        })
    }
}

fn main() {}
