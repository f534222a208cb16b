use std::rc::Rc;

use idem::{idempotent, Error};

#[idempotent(scope = "refund:<order_no>", key = key, on_cancel = "finish")]
async fn refund(order_no: String, key: String) -> Result<u64, Error> {
    let count = Rc::new(order_no.len() as u64);
    tokio::task::yield_now().await;
    Ok(*count)
}

fn main() {}
