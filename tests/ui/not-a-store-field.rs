use idem::{idempotent, Error};

pub struct Config {
    pub retries: u32,
}

pub struct App {
    pub idem: Config,
}

impl App {
    #[idempotent(scope = "refund:<order_no>", key = key, store = self.idem)]
    async fn refund(&self, order_no: String, key: String) -> Result<u32, Error> {
        Ok(1)
    }
}

fn main() {}
