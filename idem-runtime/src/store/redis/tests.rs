//! What the Redis store decides without a server. The begin script against
//! `lifecycle::decide`, on a server, is in `tests/redis.rs`.

use super::*;

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
