use idem::{idempotent, Error};

pub struct Config {
    pub retries: u32,
}

#[idempotent(scope = "refund:<order_no>", key = key, store = config)]
async fn refund(config: &Config, order_no: String, key: String) -> Result<u32, Error> {
    Ok(config.retries)
}

fn main() {}
