use idem::{Error, Versioned};

// `revision` is a TEXT column.
#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname", version = "revision", migrations = "migrations/sqlite")]
pub async fn rename(db: &sqlx::SqlitePool, user_id: i64, nickname: &str, revision: i64) -> Result<Versioned, Error>;

fn main() {}
