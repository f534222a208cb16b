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

/// A record's value with `head` as its first line and `rest` after it.
fn value(head: &str, rest: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("{head}\n").into_bytes();
    for part in rest {
        v.extend_from_slice(part);
    }
    v
}

#[test]
fn format_3_records_decode_their_work_and_format_2_records_have_none() {
    let ident = identity("s", "k");
    let fp = [7u8; 32];
    let plain = value(
        &format!("idem2 i 1000 2000 1 - - {} 4 0", ident.len()),
        &[&ident, &fp, b"step"],
    );
    let r = unpack(&plain).unwrap();
    assert_eq!(
        (r.state, r.fence, r.lease_until),
        (State::InProgress, 1000, 2000)
    );
    assert_eq!(r.recovery.as_deref(), Some(&b"step"[..]));
    assert_eq!(
        (r.request, r.note, r.resume_at, r.expires_at),
        (None, None, None, None)
    );

    let work = value(
        &format!("idem3 p 1001 2000 3 - - {} - 0 5 7 - 9000", ident.len()),
        &[&ident, &fp, b"req\n1", b"gave up"],
    );
    let r = unpack(&work).unwrap();
    assert_eq!(
        (r.state, r.attempt, r.scope.as_str(), r.key.as_str()),
        (State::Parked, 3, "s", "k")
    );
    assert_eq!(r.request.as_deref(), Some(&b"req\n1"[..]));
    assert_eq!(r.note.as_deref(), Some("gave up"));
    assert_eq!(
        (r.resume_at, r.expires_at, r.recovery),
        (None, Some(9000), None)
    );

    let suspended = value(
        &format!("idem3 i 1001 2000 1 - - {} 1 0 - 2 2500 -", ident.len()),
        &[&ident, &fp, b"x", b"ok"],
    );
    let r = unpack(&suspended).unwrap();
    assert_eq!(
        (r.request, r.note.as_deref(), r.resume_at),
        (None, Some("ok"), Some(2500))
    );
}

#[test]
fn malformed_format_3_records_are_refused_with_a_reason() {
    let ident = identity("s", "k");
    let fp = [7u8; 32];
    let head = |h: &str| h.replace("<i>", &ident.len().to_string());
    let cases: [(&str, Vec<u8>); 7] = [
        (
            "parked in format 2",
            value(&head("idem2 p 1 2 1 - - <i> - 0"), &[&ident, &fp]),
        ),
        (
            "a field missing",
            value(&head("idem3 i 1 2 1 - - <i> - 0 - - -"), &[&ident, &fp]),
        ),
        (
            "a field too many",
            value(&head("idem3 i 1 2 1 - - <i> - 0 - - - - -"), &[&ident, &fp]),
        ),
        (
            "a request longer than the value",
            value(
                &head("idem3 i 1 2 1 - - <i> - 0 99 - - -"),
                &[&ident, &fp, b"r"],
            ),
        ),
        (
            "a resume time that is not a number",
            value(&head("idem3 i 1 2 1 - - <i> - 0 - - 1x -"), &[&ident, &fp]),
        ),
        (
            "an end of retention out of range",
            value(
                &head("idem3 i 1 2 1 - - <i> - 0 - - - 1234567890123456"),
                &[&ident, &fp],
            ),
        ),
        (
            "a note that is not text",
            value(
                &head("idem3 i 1 2 1 - - <i> - 0 - 2 - -"),
                &[&ident, &fp, &[0xff, 0xfe]],
            ),
        ),
    ];
    for (what, v) in cases {
        assert!(unpack(&v).is_err(), "{what}");
    }
    assert_eq!(
        unpack(&value(&head("idem4 i 1 2 1 - - <i> - 0"), &[&ident, &fp])).unwrap_err(),
        "a record of unknown format version 4"
    );
}
