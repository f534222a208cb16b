//! Instructions per guarded call on the memory store, for `benches/instructions.sh`: a count
//! that does not move with the machine's load, unlike a timing.
//!
//! ```text
//! guard_instructions fresh N        N first calls, each with a new key
//! guard_instructions replay N       N replays of one completed call
//! guard_instructions handwritten N  N first calls through the runtime's calls written by hand
//!                                   (`begin`, `Guard::complete`), as the macro's are
//! ```

use idem::{
    Begun, Error, Fingerprinter, Key, MemoryStore, Policy, ScopeBuilder, StoredResponse, idempotent,
};

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(store))]
async fn create(store: &MemoryStore, sku: u32, key: &str) -> Result<u32, idem::Error> {
    Ok(sku)
}

/// What the macro expands `create` to, written against the public runtime API.
async fn handwritten(store: &MemoryStore, sku: u32, key: &str) -> Result<u32, Error> {
    let key = Key::parse(key)?;
    let mut scope = ScopeBuilder::with_capacity(32);
    scope.literal("order:").value(&sku);
    let scope = scope.finish()?;
    let mut fp = Fingerprinter::new();
    fp.add(&sku)?;
    match idem::begin(store, scope, key, fp.finish(), Policy::DEFAULT).await? {
        Begun::Replay(stored) => {
            serde_json::from_slice(&stored.body).map_err(|e| Error::Decode(e.to_string()))
        }
        Begun::Claimed(guard) => {
            let out = sku;
            let bytes = serde_json::to_vec(&out).map_err(|e| Error::Encode(e.to_string()))?;
            guard.complete(&StoredResponse::ok(bytes)).await?;
            Ok(out)
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().expect("fresh, replay or handwritten");
    let n: usize = args.next().expect("N").parse().expect("N");
    let keys: Vec<String> = (0..n).map(|i| format!("key-{i}")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = MemoryStore::new();
        create(&store, 1, "warm").await.unwrap();
        match mode.as_str() {
            "fresh" => {
                for k in &keys {
                    std::hint::black_box(create(&store, 1, k).await.unwrap());
                }
            }
            "handwritten" => {
                for k in &keys {
                    std::hint::black_box(handwritten(&store, 1, k).await.unwrap());
                }
            }
            "replay" => {
                for _ in 0..n {
                    std::hint::black_box(create(&store, 1, "warm").await.unwrap());
                }
            }
            other => panic!("unknown mode {other:?}: fresh, replay or handwritten"),
        }
    });
}
