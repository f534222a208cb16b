use idem::{idempotent, Error, MemoryStore};

static STORE: std::sync::LazyLock<MemoryStore> = std::sync::LazyLock::new(MemoryStore::new);

// A size needs its unit.
#[idempotent(scope = "upload:<id>", key = key, store = *STORE, resumable, max_request = "65536")]
async fn no_unit(id: u32, key: String, body: String) -> Result<u64, Error> {
    Ok(1)
}

// Nothing can be stored under a cap of zero.
#[idempotent(scope = "upload:<id>", key = key, store = *STORE, resumable, max_request = "0KiB")]
async fn zero(id: u32, key: String, body: String) -> Result<u64, Error> {
    Ok(1)
}

// Past the largest cap, 1 MiB.
#[idempotent(scope = "upload:<id>", key = key, store = *STORE, resumable, max_request = "2MiB")]
async fn too_large(id: u32, key: String, body: String) -> Result<u64, Error> {
    Ok(1)
}

// Only a resumable call stores its request.
#[idempotent(scope = "upload:<id>", key = key, store = *STORE, max_request = "16KiB")]
async fn not_resumable(id: u32, key: String, body: String) -> Result<u64, Error> {
    Ok(1)
}

fn main() {}
