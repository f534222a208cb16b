use idem::{idempotent, Error};

#[derive(serde::Serialize)]
pub struct User {
    pub id: u64,
}

#[idempotent(scope = "order:<user.idd>", key = key)]
async fn order(user: &User, key: String) -> Result<u64, Error> {
    Ok(user.id)
}

fn main() {}
