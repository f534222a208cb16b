//! Micro-benchmarks of the guard on the memory store, side by side in one run:
//!
//! - `unguarded`: the body alone;
//! - `macro`: the same body under `#[idempotent]` (claim + complete, a fresh key each call);
//! - `handwritten`: the same runtime calls written by hand (`begin`, `Guard::complete`);
//! - `replay`: a call whose key is already completed;
//! - `peer_idempotent_0_3`: the `idempotent` crate's memory store, `try_insert` then `complete`,
//!   on the same workload.
//!
//! `cargo bench --bench guard`. BENCHMARKS.md holds the figures and what they mean.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use idem::{
    Begun, Error, Fingerprinter, Key, ManualClock, MemoryStore, Policy, ScopeBuilder, Store,
    StoredResponse, idempotent,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Refund {
    order_no: String,
    cents: u64,
}

#[inline(never)]
async fn body(order_no: String, cents: u64) -> Result<Refund, Error> {
    Ok(Refund {
        order_no: black_box(order_no),
        cents,
    })
}

#[idempotent(scope = "refund:<order_no>", key = key, store = store)]
async fn guarded(
    store: &MemoryStore,
    order_no: String,
    key: &str,
    cents: u64,
) -> Result<Refund, Error> {
    body(order_no, cents).await
}

/// What the macro expands to, written against the public runtime API.
async fn handwritten(
    store: &MemoryStore,
    order_no: String,
    key: &str,
    cents: u64,
) -> Result<Refund, Error> {
    let key = Key::parse(key)?;
    let mut scope = ScopeBuilder::with_capacity(32);
    scope.literal("refund:").value(&order_no);
    let scope = scope.finish()?;
    let mut fp = Fingerprinter::new();
    fp.add(&order_no)?;
    fp.add(&cents)?;
    match idem::begin(store, scope, key, fp.finish(), Policy::DEFAULT).await? {
        Begun::Replay(stored) => {
            serde_json::from_slice(&stored.body).map_err(|e| Error::Decode(e.to_string()))
        }
        Begun::Claimed(guard) => {
            let out = body(order_no, cents).await?;
            let bytes = serde_json::to_vec(&out).map_err(|e| Error::Encode(e.to_string()))?;
            guard.complete(&StoredResponse::ok(bytes)).await?;
            Ok(out)
        }
    }
}

async fn peer(
    store: &idempotent::store::memory::MemoryStore,
    order_no: String,
    key: &str,
    cents: u64,
) -> Result<Refund, Error> {
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::{IdempotencyStore, InsertResult};
    let key = idempotent::IdempotencyKey::new(key).map_err(|e| Error::Encode(e.to_string()))?;
    // The peer fingerprints the request's bytes: give it the same arguments, serialized.
    let request =
        serde_json::to_vec(&(&order_no, cents)).map_err(|e| Error::Encode(e.to_string()))?;
    let fp = DefaultFingerprintStrategy.compute("refund", &request);
    let entry = idempotent::IdempotencyEntry::new(fp, Duration::from_secs(86_400));
    match store.try_insert(&key, entry.clone()).await {
        Ok(InsertResult::Claimed { fencing_token }) => {
            let out = body(order_no, cents).await?;
            let bytes = serde_json::to_vec(&out).map_err(|e| Error::Encode(e.to_string()))?;
            let response = idempotent::CachedResponse {
                status_code: 200,
                metadata: idempotent::Metadata::default(),
                body: bytes.into(),
            };
            let _ = store
                .complete(&key, entry.complete(response), fencing_token)
                .await;
            Ok(out)
        }
        _ => Err(Error::KeyReused),
    }
}

/// Keys are used in chunks: after each chunk the store is emptied (outside the timing), so it
/// stays at a steady size, as a store with retention does, instead of growing for ever.
const CHUNK: usize = 10_000;

fn keys() -> Vec<String> {
    (0..CHUNK).map(|i| format!("bench-key-{i:012}")).collect()
}

/// Times `iters` claim-and-complete calls of `$call` (an async fn taking the store and a key),
/// CHUNK fresh keys at a time.
macro_rules! chunked {
    ($rt:expr, $iters:expr, $keys:expr, $call:ident) => {{
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        chunked!($rt, $iters, $keys, $call, store, clock)
    }};
    ($rt:expr, $iters:expr, $keys:expr, $call:ident, $store:expr, $clock:expr) => {{
        let store = &$store;
        $rt.block_on(async {
            let mut total = Duration::ZERO;
            let mut left = $iters as usize;
            while left > 0 {
                let n = left.min(CHUNK);
                let start = Instant::now();
                for k in &$keys[..n] {
                    black_box($call(store, "ORD-1".to_owned(), k, 250).await.unwrap());
                }
                total += start.elapsed();
                left -= n;
                $clock.advance(Duration::from_secs(2 * 86_400));
                store.purge_expired().await.unwrap();
            }
            total
        })
    }};
}

fn guard(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys = keys();
    let mut g = c.benchmark_group("memory");
    g.measurement_time(Duration::from_secs(5));

    g.bench_function("unguarded", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(body("ORD-1".to_owned(), 250).await.unwrap());
                }
                start.elapsed()
            })
        })
    });

    g.bench_function("macro", |b| {
        b.iter_custom(|iters| chunked!(rt, iters, keys, guarded))
    });
    g.bench_function("handwritten", |b| {
        b.iter_custom(|iters| chunked!(rt, iters, keys, handwritten))
    });

    g.bench_function("replay", |b| {
        let store = MemoryStore::new();
        rt.block_on(guarded(&store, "ORD-1".to_owned(), "done", 250))
            .unwrap();
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        guarded(&store, "ORD-1".to_owned(), "done", 250)
                            .await
                            .unwrap(),
                    );
                }
                start.elapsed()
            })
        })
    });

    g.bench_function("peer_idempotent_0_3", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let n = left.min(CHUNK);
                    let store = idempotent::store::memory::MemoryStore::new(
                        1024,
                        Duration::from_secs(3600),
                    );
                    let start = Instant::now();
                    for k in &keys[..n] {
                        black_box(peer(&store, "ORD-1".to_owned(), k, 250).await.unwrap());
                    }
                    total += start.elapsed();
                    left -= n;
                }
                total
            })
        })
    });
    g.finish();
}

/// The ratios, measured side by side: rounds of 10,000 calls of each variant in turn, so that
/// whatever else the machine does affects them alike; the median round of each is reported.
fn side_by_side() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let keys = keys();
    let peer_store = rt.block_on(async {
        idempotent::store::memory::MemoryStore::new(1024, Duration::from_secs(3600))
    });
    let replay_store = MemoryStore::new();
    rt.block_on(guarded(&replay_store, "ORD-1".to_owned(), "done", 250))
        .unwrap();
    let n = CHUNK as u64;
    // One store per variant for the whole run, emptied after each chunk: both reach the same
    // steady state, and neither pays for fresh pages the other reuses.
    let (macro_clock, hand_clock) = (ManualClock::new(), ManualClock::new());
    let macro_store = MemoryStore::with_clock(macro_clock.clone());
    let hand_store = MemoryStore::with_clock(hand_clock.clone());
    let mut runs: [Vec<f64>; 5] = Default::default();
    for round in 0..30 {
        let per_call = |d: Duration| d.as_nanos() as f64 / n as f64;
        runs[0].push(per_call(rt.block_on(async {
            let start = Instant::now();
            for _ in 0..n {
                black_box(body("ORD-1".to_owned(), 250).await.unwrap());
            }
            start.elapsed()
        })));
        // Alternate which of the two goes first.
        if round % 2 == 0 {
            runs[1].push(per_call(chunked!(
                rt,
                n,
                keys,
                guarded,
                macro_store,
                macro_clock
            )));
            runs[2].push(per_call(chunked!(
                rt,
                n,
                keys,
                handwritten,
                hand_store,
                hand_clock
            )));
        } else {
            runs[2].push(per_call(chunked!(
                rt,
                n,
                keys,
                handwritten,
                hand_store,
                hand_clock
            )));
            runs[1].push(per_call(chunked!(
                rt,
                n,
                keys,
                guarded,
                macro_store,
                macro_clock
            )));
        }
        runs[3].push(per_call(rt.block_on(async {
            let start = Instant::now();
            for _ in 0..n {
                black_box(
                    guarded(&replay_store, "ORD-1".to_owned(), "done", 250)
                        .await
                        .unwrap(),
                );
            }
            start.elapsed()
        })));
        // The peer keeps every record: give it fresh keys each round.
        let round_keys: Vec<String> = keys.iter().map(|k| format!("{k}-{round}")).collect();
        runs[4].push(per_call(rt.block_on(async {
            let start = Instant::now();
            for k in &round_keys {
                black_box(peer(&peer_store, "ORD-1".to_owned(), k, 250).await.unwrap());
            }
            start.elapsed()
        })));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let [u, m, h, r, p] = runs.each_mut().map(median);
    println!(
        "SIDE_BY_SIDE memory ns_per_call unguarded={u:.0} macro={m:.0} handwritten={h:.0} replay={r:.0} peer_idempotent_0_3={p:.0}"
    );
    println!(
        "SIDE_BY_SIDE memory guard_adds_ns={:.0} macro_over_handwritten={:.3} peer_over_macro={:.2}",
        m - u,
        m / h,
        p / m
    );
}

criterion_group!(benches, guard);

fn main() {
    side_by_side();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
