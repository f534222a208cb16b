use idem::{idempotent, Error, MemoryStore, SqliteStore};

static STORE: std::sync::LazyLock<MemoryStore> = std::sync::LazyLock::new(MemoryStore::new);

// A transactional call rolls back when cut off: nothing is left to resume.
#[idempotent(scope = "refund:<order_no>", key = key, store = store, transaction = tx, resumable)]
async fn in_a_transaction(store: &SqliteStore, order_no: String, key: String) -> Result<u64, Error> {
    let _ = tx;
    Ok(1)
}

// A fail-closed claim is never taken over, so no completer could resume it.
#[idempotent(scope = "refund:<order_no>", key = key, store = *STORE, on_expired_lease = "fail_closed", resumable)]
async fn fail_closed(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

// The resume name is stored with every claim: printable ASCII only.
#[idempotent(scope = "refund:<order_no>", key = key, store = *STORE, resumable = "refund\tnow")]
async fn bad_name(order_no: String, key: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
