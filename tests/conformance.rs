//! The store conformance suite (`idem::testkit`), run on every store idem ships: memory, SQLite
//! and PostgreSQL (and the memory store behind `CachedStore` and `SharedStore`), and the transactional cases on both SQL stores. The same kit is what a store
//! written elsewhere runs to prove it keeps the contract.
//!
//! PostgreSQL runs when `DATABASE_URL` points at it at build time (each case in a schema of its
//! own); otherwise its cases are listed as ignored.

mod common;

use idem::testkit::Env;
use idem::{CachedStore, ManualClock, MemoryStore, PgStore, SharedStore, SqliteStore};

use common::{PgSchema, SqliteFile};

async fn memory() -> Env<MemoryStore> {
    let clock = ManualClock::new();
    Env::with_clock(MemoryStore::with_clock(clock.clone()), clock)
}

async fn sqlite() -> Env<SqliteStore> {
    let file = SqliteFile::new();
    let store = SqliteStore::connect(&file.url).await.expect("open SQLite");
    Env::new(store).keep(file)
}

async fn postgres() -> Env<PgStore> {
    let schema = PgSchema::create(&common::pg_url(), 16).await;
    let store = PgStore::builder()
        .build(schema.pool.clone())
        .await
        .expect("create the table");
    Env::new(store).keep(schema)
}

/// The cache in front of a store keeps the store's contract.
async fn cached() -> Env<CachedStore<MemoryStore>> {
    let clock = ManualClock::new();
    Env::with_clock(
        CachedStore::new(MemoryStore::with_clock(clock.clone()), 1024),
        clock,
    )
}

/// So does a store behind `SharedStore` (what `set_default_store` installs).
async fn shared() -> Env<SharedStore> {
    let clock = ManualClock::new();
    Env::with_clock(
        SharedStore::new(MemoryStore::with_clock(clock.clone())),
        clock,
    )
}

mod memory_store {
    idem::testkit::conformance_tests!(super::memory);
}

mod cached_store {
    idem::testkit::conformance_tests!(super::cached);
}

mod shared_store {
    idem::testkit::conformance_tests!(super::shared);
}

mod sqlite_store {
    idem::testkit::conformance_tests!(super::sqlite);
}

mod postgres_store {
    idem::testkit::conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres
    );
}

mod sqlite_transactional {
    idem::testkit::tx_conformance_tests!(super::sqlite);
}

mod postgres_transactional {
    idem::testkit::tx_conformance_tests!(
        #[cfg_attr(
            not(idem_postgres),
            ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
        )]
        super::postgres
    );
}

/// A record idem cannot read exactly (written by something else, or damaged) is an error that
/// names it, never a state a body may run on.
mod unreadable_records {
    use idem::{BeginRequest, Error, Fingerprint, Key, Policy, Store};

    /// `(key, state, fingerprint length, stored status)`, each wrong in one way.
    const BAD: [(&str, &str, usize, i32); 3] = [
        ("k-state", "bogus", 32, 200),
        ("k-fingerprint", "completed", 5, 200),
        ("k-status", "completed", 32, 70_000),
    ];

    async fn check<S: Store>(store: &S) {
        let fp = Fingerprint::from_bytes([7; 32]);
        for (key, what, ..) in BAD {
            let k = Key::parse(key).unwrap();
            let begun = store
                .begin(BeginRequest {
                    scope: "s",
                    key: k.as_str(),
                    fingerprint: &fp,
                    policy: &Policy::DEFAULT,
                })
                .await;
            match begun {
                Err(Error::Store(e)) => {
                    assert!(e.to_string().contains(key), "{what}: {e}")
                }
                other => panic!("{what}: an unreadable record must be an error, got {other:?}"),
            }
            assert!(
                matches!(store.lookup("s", key).await, Err(Error::Store(_))),
                "{what}: lookup"
            );
        }
    }

    #[tokio::test]
    async fn sqlite() {
        let env = super::sqlite().await;
        let mut conn = env.store().pool().acquire().await.unwrap();
        // The table's own CHECK refuses an unknown state: a foreign writer might not have it.
        sqlx::query("PRAGMA ignore_check_constraints = ON")
            .execute(&mut *conn)
            .await
            .unwrap();
        for (key, state, len, status) in BAD {
            sqlx::query(
                "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
                 expires_at, response_status, response_body, created_at, updated_at) \
                 VALUES ('s', $1, $2, $3, 1, 0, 9e15, $4, x'7b7d', 0, 0)",
            )
            .bind(key)
            .bind(vec![7u8; len])
            .bind(state)
            .bind(status)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        drop(conn);
        check(env.store()).await;
    }

    #[tokio::test]
    #[cfg_attr(
        not(idem_postgres),
        ignore = "needs PostgreSQL: set DATABASE_URL=postgres://…"
    )]
    async fn postgres() {
        let env = super::postgres().await;
        // The table's own CHECK refuses an unknown state: drop it, as a foreign writer might not
        // have it.
        sqlx::query("ALTER TABLE idem_records DROP CONSTRAINT idem_records_state_check")
            .execute(env.store().pool())
            .await
            .unwrap();
        for (key, state, len, status) in BAD {
            sqlx::query(
                "INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_until, \
                 expires_at, response_status, response_body, created_at, updated_at) \
                 VALUES ('s', $1, $2, $3, 1, now(), now() + interval '1 day', $4, '\\x7b7d', \
                 now(), now())",
            )
            .bind(key)
            .bind(vec![7u8; len])
            .bind(state)
            .bind(status)
            .execute(env.store().pool())
            .await
            .unwrap();
        }
        check(env.store()).await;
    }
}
