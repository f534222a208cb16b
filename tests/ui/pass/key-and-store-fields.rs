//! `store = app.idem` leaves `app` out of the fingerprint (application state is not part of the
//! request); `fingerprint(…)` takes fields of arguments.

use idem::{idempotent, Error, MemoryStore};

pub struct App {
    pub idem: MemoryStore,
}

#[derive(serde::Serialize)]
pub struct RefundReq {
    pub cents: u64,
    pub note: String,
}

#[idempotent(scope = "refund:<order_no>", key = key, store = app.idem)]
async fn refund(app: &App, order_no: String, key: String, cents: u64) -> Result<u64, Error> {
    Ok(cents)
}

#[idempotent(scope = "refund:<order_no>", key = key, store = app.idem, fingerprint(order_no, req.cents))]
async fn refund_req(app: &App, order_no: String, key: String, req: RefundReq) -> Result<u64, Error> {
    Ok(req.cents)
}

#[tokio::main]
async fn main() {
    let app = App { idem: MemoryStore::new() };
    assert_eq!(refund(&app, "A1".into(), "k1".into(), 5).await.unwrap(), 5);
    let req = |note: &str| RefundReq { cents: 7, note: note.into() };
    assert_eq!(refund_req(&app, "A1".into(), "k2".into(), req("a")).await.unwrap(), 7);
    // The note is not part of the fingerprint: the same request, replayed.
    assert_eq!(refund_req(&app, "A1".into(), "k2".into(), req("b")).await.unwrap(), 7);
}
