//! `#[idempotent]` on a trait's default method, and on a method of an `impl` whose trait asks
//! for a `Send` future.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Error, MemoryStore};

trait Payments {
    fn idem(&self) -> &MemoryStore;
    fn runs(&self) -> &AtomicU32;

    #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem())]
    async fn refund(&self, order_no: String, key: String) -> Result<u32, Error> {
        Ok(self.runs().fetch_add(1, Ordering::SeqCst) + 1)
    }
}

trait Captures {
    fn capture(&self, order_no: String, key: String) -> impl Future<Output = Result<u32, Error>> + Send;
}

pub struct Gateway {
    pub idem: MemoryStore,
    pub runs: AtomicU32,
}

impl Payments for Gateway {
    fn idem(&self) -> &MemoryStore {
        &self.idem
    }

    fn runs(&self) -> &AtomicU32 {
        &self.runs
    }
}

impl Captures for Gateway {
    #[idempotent(scope = "capture:<order_no>", key = key, store = self.idem)]
    async fn capture(&self, order_no: String, key: String) -> Result<u32, Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[tokio::main]
async fn main() {
    let gateway = Gateway { idem: MemoryStore::new(), runs: AtomicU32::new(0) };
    for _ in 0..2 {
        assert_eq!(gateway.refund("A1".into(), "k".into()).await.unwrap(), 1);
        assert_eq!(assert_send(gateway.capture("A1".into(), "k".into())).await.unwrap(), 2);
    }
    assert_eq!(gateway.runs.load(Ordering::SeqCst), 2);
}
