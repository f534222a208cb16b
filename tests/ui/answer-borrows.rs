use std::borrow::Cow;

use axum::Json;
use idem::{idempotent, Error, MemoryStore};
use serde::{Deserialize, Serialize};

pub struct Names {
    pub idem: MemoryStore,
    pub name: String,
}

impl Names {
    #[idempotent(scope = "name:<id>", key = key, store = self.idem)]
    async fn name(&self, id: u64, key: String) -> Result<&str, Error> {
        Ok(&self.name)
    }
}

#[idempotent(scope = "label:<id>", key = key)]
async fn label<'a>(id: u64, key: String, fallback: &'a str) -> Result<Cow<'a, str>, Error> {
    Ok(Cow::Borrowed(fallback))
}

#[derive(Serialize, Deserialize)]
pub struct Order<'a> {
    pub sku: &'a str,
}

#[idempotent(scope = "order:<sku>", key = key)]
async fn order<'a>(sku: &'a str, key: String) -> Result<Order<'a>, Error> {
    Ok(Order { sku })
}

#[idempotent(scope = "order-json:<sku>", key = key)]
async fn order_json<'a>(sku: &'a str, key: String) -> Result<Json<Order<'a>>, Error> {
    Ok(Json(Order { sku }))
}

fn main() {}
