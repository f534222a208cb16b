use idem::idempotent;

#[idempotent(scope = "refund:<order_no>", key = key)]
async fn refund(order_no: String, key: String) -> u64 {
    1
}

fn main() {}
