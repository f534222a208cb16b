use idem::{Error, Versioned};

#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname")]
async fn rename(db: &sqlx::PgPool, user_id: i64, nickname: &str, version: &str) -> Result<Versioned, Error>;

fn main() {}
