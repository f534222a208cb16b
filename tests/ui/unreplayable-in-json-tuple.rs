use axum::http::StatusCode;
use axum::Json;
use idem::{idempotent, Error};

pub struct Receipt {
    pub cents: u64,
}

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> Result<(StatusCode, Json<Receipt>), Error> {
    Ok((StatusCode::CREATED, Json(Receipt { cents: 1 })))
}

#[idempotent(scope = "capture:<order_no>", key = key)]
async fn capture(order_no: String, key: String) -> Result<Json<Receipt>, Error> {
    Ok(Json(Receipt { cents: 1 }))
}

fn main() {}
