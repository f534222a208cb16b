use axum::Json;
use idem::{idempotent, Error};

#[idempotent(scope = "decode:<id>", key = key)]
async fn decode<T: Default>(id: u64, key: String) -> Result<T, Error> {
    Ok(T::default())
}

#[idempotent(scope = "encode:<id>", key = key)]
async fn encode<T>(id: u64, key: String, answer: T) -> Result<Json<T>, Error>
where
    T: serde::Serialize + Send,
{
    Ok(Json(answer))
}

fn main() {}
