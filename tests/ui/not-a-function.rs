use idem::idempotent;

#[idempotent(scope = "refund", key = key)]
struct Refund {
    cents: u64,
}

fn main() {}
