use idem::{Error, Versioned};

// The update bumps the version itself.
#[idem::versioned_update(table = "user_profile", key = "user_id", set = "nickname, version")]
async fn rename(db: &sqlx::PgPool, user_id: i64, nickname: &str, version: i64) -> Result<Versioned, Error>;

fn main() {}
