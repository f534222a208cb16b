use idem::{Error, Versioned};

// `revision` is a VARCHAR column.
#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname", version = "revision", migrations = "migrations/mysql")]
pub async fn rename(db: &sqlx::MySqlPool, user_id: i64, nickname: &str, revision: i64) -> Result<Versioned, Error>;

fn main() {}
