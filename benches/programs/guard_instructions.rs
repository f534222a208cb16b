//! Instructions per guarded call on the memory store, for `benches/instructions.sh`: a count
//! that does not move with the machine's load, unlike a timing.
//!
//! ```text
//! guard_instructions fresh N     N first calls, each with a new key
//! guard_instructions replay N    N replays of one completed call
//! ```

use idem::{MemoryStore, idempotent};

#[idempotent(scope = "order:<sku>", key = key, store = store, skip(store))]
async fn create(store: &MemoryStore, sku: u32, key: &str) -> Result<u32, idem::Error> {
    Ok(sku)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().expect("fresh or replay");
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
            "replay" => {
                for _ in 0..n {
                    std::hint::black_box(create(&store, 1, "warm").await.unwrap());
                }
            }
            other => panic!("unknown mode {other:?}: fresh or replay"),
        }
    });
}
