//! The begin script against `lifecycle::decide`: every combination of what an existing record
//! can hold is written into Redis, begun through the script, and the script's answer must be the
//! rule's answer.
//!
//! Needs a server: `IDEM_REDIS_URL=redis://127.0.0.1:6379`. Without it the test says it was
//! skipped, unless `IDEM_REQUIRE_REDIS=1` (CI), where it fails. (The integration tests' helper
//! in `tests/common` is the same rule; this crate cannot reach it.)

use std::time::Duration;

use redis::AsyncCommands;

use super::*;
use crate::lifecycle::{Decision, Seen, SeenState, decide};
use crate::record::Policy;

fn redis_url(test: &str) -> Option<String> {
    match std::env::var("IDEM_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("IDEM_REQUIRE_REDIS").as_deref() == Ok("1") {
                panic!("{test}: IDEM_REQUIRE_REDIS=1 but IDEM_REDIS_URL is not set");
            }
            eprintln!("SKIPPED {test}: needs Redis; set IDEM_REDIS_URL=redis://… to run it");
            None
        }
    }
}

fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("idem-unit:{}:{nanos}:", std::process::id())
}

async fn server_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// What the script answered, as a decision of the rule.
fn as_decision(outcome: &BeginOutcome) -> Decision {
    match outcome {
        BeginOutcome::Claimed(c) => Decision::Claim {
            reclaim: c.reclaimed,
            keep_recovery_point: c.recovery_point.as_deref() == Some(&b"step-2"[..]),
        },
        BeginOutcome::Replay(_) => Decision::Replay,
        BeginOutcome::InProgress { retry_after } => Decision::InProgress(*retry_after),
        BeginOutcome::KeyReused => Decision::KeyReused,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_script_decides_every_row_as_lifecycle_decide() {
    let Some(url) =
        redis_url("store::redis::tests::begin_script_decides_every_row_as_lifecycle_decide")
    else {
        return;
    };
    let store = RedisStore::builder()
        .prefix(unique_prefix())
        .connect(&url)
        .await
        .unwrap();
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mine = Fingerprint::of("the request").unwrap();
    let other = Fingerprint::of("another request").unwrap();
    // A short retention: a failed run leaves nothing behind for long.
    let reclaim = Policy::DEFAULT
        .lease(Duration::from_secs(30))
        .retain(Duration::from_secs(60));
    let fail_closed = reclaim.expired_lease(ExpiredLease::FailClosed);

    let mut rows = 0;
    let mut names = Vec::new();
    for state in [
        SeenState::InProgress,
        SeenState::Completed,
        SeenState::Released,
    ] {
        for same_fingerprint in [true, false] {
            for expired in [false, true] {
                for lease_left_ms in [1500i64, 0, -5] {
                    for policy in [&reclaim, &fail_closed] {
                        rows += 1;
                        let key = format!("k-{rows}");
                        let name = store.record_key("decide", &key);
                        names.push(name.clone());
                        let now = server_now_ms(&mut raw).await;
                        let state_text = match state {
                            SeenState::InProgress => "in_progress",
                            SeenState::Completed => "completed",
                            SeenState::Released => "released",
                        };
                        let fence = 1_000u64;
                        let (status, error) = match state {
                            SeenState::Completed => ("201", "0"),
                            _ => ("-", "-"),
                        };
                        let mut fields: Vec<(&str, Vec<u8>)> = vec![
                            (
                                "meta",
                                format!(
                                    "1 {state_text} {fence} {} {status} {error}",
                                    now + lease_left_ms
                                )
                                .into_bytes(),
                            ),
                            ("scope", b"decide".to_vec()),
                            ("key", key.clone().into_bytes()),
                            ("fp", mine.as_bytes().to_vec()),
                        ];
                        match state {
                            SeenState::Completed => fields.push(("body", b"{\"done\":1}".to_vec())),
                            _ => fields.push(("recovery", b"step-2".to_vec())),
                        }
                        let _: () = raw.hset_multiple(&name, &fields).await.unwrap();
                        if expired {
                            // Retention is the key's expiry: an expired record is a key that
                            // Redis no longer has.
                            let _: () = raw.pexpire(&name, 1).await.unwrap();
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        } else {
                            let _: () = raw.pexpire(&name, 30_000).await.unwrap();
                        }

                        let fp = if same_fingerprint { &mine } else { &other };
                        let outcome = store
                            .begin(BeginRequest {
                                scope: "decide",
                                key: &key,
                                fingerprint: fp,
                                policy,
                            })
                            .await
                            .unwrap();
                        let seen = Seen {
                            state,
                            same_fingerprint,
                            expired,
                            lease_left_ms,
                        };
                        let expected = decide(seen, policy);
                        let got = as_decision(&outcome);
                        let what = format!("{seen:?} under {:?}", policy.expired_lease);
                        match (expected, got) {
                            // The script reads the clock a moment after the record was
                            // written: the remaining lease may be a little shorter.
                            (Decision::InProgress(want), Decision::InProgress(have)) => {
                                assert!(
                                    have <= want && want - have < Duration::from_millis(300),
                                    "{what}: in progress for {have:?}, the rule says {want:?}"
                                );
                            }
                            (want, have) => assert_eq!(have, want, "{what}"),
                        }
                        match outcome {
                            BeginOutcome::Claimed(c) if expired => {
                                assert!(c.fence > fence, "{what}: the fence still grows");
                            }
                            BeginOutcome::Claimed(c) => {
                                assert_eq!(c.fence, fence + 1, "{what}: a take-over adds one");
                                let written: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                                    .arg(&name)
                                    .arg(&["meta", "fp", "body"])
                                    .query_async(&mut raw)
                                    .await
                                    .unwrap();
                                let meta = String::from_utf8(written[0].clone().unwrap()).unwrap();
                                assert!(meta.starts_with("1 in_progress 1001 "), "{what}: {meta}");
                                assert!(meta.ends_with(" - -"), "{what}: {meta}");
                                assert_eq!(written[1].as_deref(), Some(&fp.as_bytes()[..]));
                                assert_eq!(written[2], None, "{what}: the old answer is gone");
                                let ttl: i64 = raw.pttl(&name).await.unwrap();
                                assert!(ttl > 50_000, "{what}: retention counts again ({ttl} ms)");
                            }
                            BeginOutcome::Replay(r) => {
                                assert_eq!(r.body, &b"{\"done\":1}"[..]);
                                assert_eq!(r.status, Some(201));
                                assert!(!r.is_error);
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    assert_eq!(rows, 72);
    let _: () = raw.del(&names).await.unwrap();
}

#[test]
fn record_keys_are_unambiguous_and_hash_tagged() {
    // The first 16 bytes of sha256(00 00 00 0c "refund:ORD-1" 00 00 00 03 "k-1"), computed
    // independently.
    assert_eq!(
        record_name("idem:", "refund:ORD-1", "k-1"),
        "idem:{7002ada12e6bbb5ac546339d6263e2c4}"
    );
    assert_ne!(
        record_name("idem:", "ab", "c"),
        record_name("idem:", "a", "bc"),
        "moving a byte between scope and key makes another identity"
    );
    assert!(
        RedisStore::builder()
            .prefix("bad{prefix")
            .check_prefix()
            .is_err()
    );
    assert!(RedisStore::builder().prefix("ok:").check_prefix().is_ok());
}

#[test]
fn transient_errors_are_unavailable() {
    use redis::{ErrorKind, ServerErrorKind};
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert!(matches!(map_err(io), Error::Unavailable(_)));
    let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
    assert!(matches!(map_err(timeout), Error::Unavailable(_)));
    for kind in [
        ServerErrorKind::ClusterDown,
        ServerErrorKind::TryAgain,
        ServerErrorKind::BusyLoading,
        ServerErrorKind::MasterDown,
        ServerErrorKind::ReadOnly,
    ] {
        let e = RedisError::from((ErrorKind::Server(kind), "transient"));
        assert!(matches!(map_err(e), Error::Unavailable(_)), "{kind:?}");
    }
    let broken = RedisError::from((
        ErrorKind::Server(ServerErrorKind::ResponseError),
        "user_script:1: a bug",
    ));
    assert!(matches!(map_err(broken), Error::Store(_)));
}

#[test]
fn eviction_policies_are_read_from_every_answer_shape() {
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let mut out = Vec::new();
    collect_policies(
        &Value::Array(vec![bulk("maxmemory-policy"), bulk("noeviction")]),
        &mut out,
    );
    collect_policies(
        &Value::Map(vec![(
            bulk("127.0.0.1:7102"),
            Value::Array(vec![bulk("maxmemory-policy"), bulk("volatile-lru")]),
        )]),
        &mut out,
    );
    collect_policies(
        &Value::Map(vec![(bulk("maxmemory-policy"), bulk("allkeys-lru"))]),
        &mut out,
    );
    assert_eq!(out, ["noeviction", "volatile-lru", "allkeys-lru"]);
}
