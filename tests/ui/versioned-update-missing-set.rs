use idem::{Error, Versioned};

#[idem::versioned_update(table = "user_profile", key = "user_id")]
async fn touch(db: &sqlx::PgPool, user_id: i64, version: i64) -> Result<Versioned, Error>;

fn main() {}
