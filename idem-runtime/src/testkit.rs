//! The store conformance suite, public: a store written outside idem proves it keeps idem's
//! contract by running the same cases as the stores idem ships (memory, SQLite, PostgreSQL), which
//! run through this kit themselves. Feature `testkit`.
//!
//! Each case takes an [`Env`]: the store, how time passes on its clock, and whatever must live
//! as long as the case (a schema, a temporary directory). [`conformance_tests!`] writes one
//! `#[test]` per case; `tx_conformance_tests!` does the same for a `TxStore` (feature `sqlite` or
//! `postgres`).
//!
//! ```
//! // tests/conformance.rs of a crate with a store of its own (here, `MemoryStore` stands in).
//! use idem::testkit::Env;
//! use idem::MemoryStore;
//!
//! async fn my_store() -> Env<MemoryStore> {
//!     // Connect to your store here. `Env::new`: leases and retention run on the store's own
//!     // clock, so the cases that let time pass sleep.
//!     Env::new(MemoryStore::new())
//! }
//!
//! idem::testkit::conformance_tests!(my_store);
//! # fn main() {}
//! ```
//!
//! A store that reads an injectable clock passes it with [`Env::with_clock`] and its cases run
//! without sleeping. Attributes before the function apply to every generated test, so a store
//! that needs a server can be skipped visibly when it is absent:
//! `conformance_tests!(#[cfg_attr(not(has_server), ignore = "needs the server")] my_store)`.
//!
//! The cases can also be called one by one:
//!
//! ```
//! use idem::store::{Operation, Reply};
//! use idem::testkit::{self, Env};
//! use idem::MemoryStore;
//!
//! // A store of your own; here one that hands every call to a memory store.
//! #[derive(Clone)]
//! struct Wrapped(MemoryStore);
//!
//! impl idem::Store for Wrapped {
//!     fn call<'a>(&'a self, op: Operation<'a>) -> impl Future<Output = idem::Result<Reply>> + Send + 'a {
//!         self.0.call(op)
//!     }
//!     fn defer(&self, write: idem::store::Deferred) {
//!         self.0.defer(write)
//!     }
//! }
//!
//! testkit::block_on(async {
//!     let clock = idem::ManualClock::new();
//!     let env = Env::with_clock(Wrapped(MemoryStore::with_clock(clock.clone())), clock);
//!     testkit::cases::replay_is_byte_identical(&env).await;
//!     testkit::cases::expired_lease_reclaims_with_fence_and_recovery_point(&env).await;
//! });
//! ```

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::clock::ManualClock;
use crate::store::Store;

#[doc(inline)]
pub use crate::conformance_tests;
#[cfg(feature = "sql")]
#[doc(inline)]
pub use crate::tx_conformance_tests;

/// A store under test, with a way to let time pass on its clock, and what must live as long as
/// the case.
pub struct Env<S> {
    store: S,
    clock: Option<ManualClock>,
    expires_by_itself: bool,
    keep: Vec<Box<dyn Any + Send + Sync>>,
}

impl<S> fmt::Debug for Env<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("manual_clock", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Store + Clone> Env<S> {
    /// A store whose leases and retention run on real time (its own clock, a database's, a
    /// server's): the cases sleep when they let time pass.
    pub fn new(store: S) -> Self {
        Env {
            store,
            clock: None,
            expires_by_itself: false,
            keep: Vec::new(),
        }
    }

    /// A store that reads `clock`: the cases advance it instead of sleeping.
    pub fn with_clock(store: S, clock: ManualClock) -> Self {
        Env {
            store,
            clock: Some(clock),
            expires_by_itself: false,
            keep: Vec::new(),
        }
    }

    /// A store whose records leave by themselves when their retention ends (a key with a time
    /// to live), so that `purge_expired` has nothing left to delete: the cases then check that
    /// expired records are gone and that purging deletes none.
    pub fn expires_by_itself(mut self) -> Self {
        self.expires_by_itself = true;
        self
    }

    /// Keeps `value` alive until the case ends, then drops it (a schema that drops itself, a
    /// temporary directory).
    pub fn keep(mut self, value: impl Any + Send + Sync) -> Self {
        self.keep.push(Box::new(value));
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Lets `d` pass on the store's clock.
    pub async fn wait(&self, d: Duration) {
        match &self.clock {
            Some(c) => c.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }
}

/// Runs `fut` to completion on a new multi-threaded Tokio runtime: what each generated test
/// does.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a Tokio runtime for the test")
        .block_on(fut)
}

/// One `#[test]` per conformance case for the store that `make` builds.
///
/// `make` is a path to an `async fn() -> Env<S>` (called afresh for every case, so each case has
/// a store of its own). Attributes written before it are put on every test.
///
/// ```
/// # use idem::{testkit::Env, MemoryStore};
/// # async fn my_store() -> Env<MemoryStore> { Env::new(MemoryStore::new()) }
/// idem::testkit::conformance_tests!(my_store);
/// // On a store that needs a server, listed as ignored where it is not configured:
/// mod with_server {
///     idem::testkit::conformance_tests!(
///         #[cfg_attr(not(has_server), ignore = "needs the server")]
///         super::my_store
///     );
/// }
/// # fn main() {}
/// ```
#[doc(hidden)]
#[macro_export]
macro_rules! conformance_tests {
    ($(#[$attr:meta])* $make:path) => {
        $crate::__testkit_cases! {
            [$(#[$attr])*] $make; cases:
            first_claim,
            replay_is_byte_identical,
            different_fingerprint_is_key_reuse,
            live_claim_is_in_progress,
            expired_lease_reclaims_with_fence_and_recovery_point,
            fail_closed_keeps_in_progress,
            renew_extends_the_lease_and_keeps_the_recovery_point,
            release_lets_a_retry_claim,
            a_suspended_claim_is_resumed_by_its_retry_at_once,
            dropped_guard_releases_promptly,
            racing_tasks_claim_once,
            waiting_duplicates_replay_the_first_answer,
            a_waiting_duplicate_is_told_in_progress_when_its_wait_runs_out,
            a_release_lets_one_waiting_duplicate_run_and_the_others_replay_it,
            the_ends_of_claims_are_announced_to_their_listeners,
            retention_expiry_frees_the_identity,
            purge_removes_only_expired,
            a_purged_identity_never_reuses_a_fence,
            attempts_count_unfinished_tries,
            a_repeated_completion_is_done_once,
            operators_list_and_inspect_records,
            a_forced_release_moves_the_fence_on,
            a_forced_release_with_a_stale_fence_releases_nothing,
            stats_count_by_state_and_prefix,
            expired_records_are_counted_then_purged_in_batches,
            a_resumable_claim_whose_lease_ran_out_is_due_with_its_request,
            a_suspended_claim_is_due_after_its_resume_time_with_its_note,
            due_honours_its_limit_longest_due_first,
            park_with_the_due_fence_parks_for_good,
            retry_makes_parked_work_due_again,
            unfinished_work_outlives_its_retention_and_finished_work_does_not,
            listings_and_counts_read_a_bounded_number_of_records,
        }
    };
}

/// One `#[test]` per transactional conformance case for the [`TxStore`](crate::TxStore) (that
/// is also a [`tx_cases::TxFixture`]) that `make` builds; see [`conformance_tests!`].
#[cfg(feature = "sql")]
#[doc(hidden)]
#[macro_export]
macro_rules! tx_conformance_tests {
    ($(#[$attr:meta])* $make:path) => {
        $crate::__testkit_cases! {
            [$(#[$attr])*] $make; tx_cases:
            tx_commit_makes_both_durable,
            tx_rollback_leaves_nothing,
            tx_duplicate_waits_then_replays,
            tx_duplicate_claims_after_rollback,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __testkit_cases {
    ([$($attr:tt)*] $make:path; $module:ident: $case:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        $($attr)*
        fn $case() {
            $crate::testkit::block_on(async {
                let env = $make().await;
                $crate::testkit::$module::$case(&env).await;
            });
        }
        $crate::__testkit_cases! { [$($attr)*] $make; $module: $($rest),* }
    };
    ([$($attr:tt)*] $make:path; $module:ident: $(,)?) => {};
}

/// The cases every store passes.
pub mod cases {
    use std::time::Duration;

    use super::Env;
    use crate::lifecycle::State;
    use crate::store::Retried;
    use crate::store::{ForcedRelease, Listing, RecordQuery, StateCounts, StoreAdmin};
    use crate::{
        BeginOutcome, BeginRequest, ClaimRef, Error, ExpiredLease, Fingerprint, Key, Policy,
        RecordState, Store, StoredRequest, StoredResponse, Unfinished,
    };

    pub(super) fn key(s: &str) -> Key {
        Key::parse(s).unwrap()
    }

    pub(super) fn fp(v: &str) -> Fingerprint {
        Fingerprint::of(v).unwrap()
    }

    pub(super) const POLICY: Policy = Policy::DEFAULT;

    pub(super) fn req<'a>(
        scope: &'a str,
        key: &'a Key,
        fp: &'a Fingerprint,
        policy: &'a Policy,
    ) -> BeginRequest<'a> {
        BeginRequest::new(scope, key.as_str(), fp, policy)
    }

    pub(super) fn claimed(outcome: BeginOutcome) -> crate::Claimed {
        match outcome {
            BeginOutcome::Claimed(c) => c,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    pub(super) fn claim<'a>(scope: &'a str, key: &'a Key, fence: u64) -> ClaimRef<'a> {
        ClaimRef {
            scope,
            key: key.as_str(),
            fence,
        }
    }

    /// A claim that `req` must get.
    pub(super) async fn begin_claimed<S: Store + Clone>(
        env: &Env<S>,
        req: BeginRequest<'_>,
    ) -> crate::Claimed {
        claimed(env.store().begin(req).await.unwrap())
    }

    /// Completes `claim` with `response`, which must succeed.
    pub(super) async fn complete_ok<S: Store + Clone>(
        env: &Env<S>,
        claim: ClaimRef<'_>,
        response: &StoredResponse,
    ) {
        env.store().complete(claim, response).await.unwrap();
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn first_claim<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-first");
        let f = fp("body");
        let c = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        assert!(c.fence > 0);
        assert!(!c.reclaimed);
        assert_eq!(c.recovery_point, None);
        // The same key under another scope is another record.
        let other = begin_claimed(env, req("s2", &k, &f, &POLICY)).await;
        assert!(!other.reclaimed);
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn replay_is_byte_identical<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-replay");
        let f = fp("body");
        let c = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        // Unusual spacing, key order and escapes: a JSON column would normalise these away.
        let body = b"{ \"z\":1,  \"a\" : [2 ,1],\n\t\"u\":\"\\u00e9\" }  ".to_vec();
        let stored = StoredResponse {
            status: Some(201),
            is_error: false,
            body: body.clone().into(),
        };
        complete_ok(env, claim("s", &k, c.fence), &stored).await;
        for _ in 0..2 {
            match env.store().begin(req("s", &k, &f, &POLICY)).await.unwrap() {
                BeginOutcome::Replay(r) => {
                    assert_eq!(r.body, body, "replayed bytes differ");
                    assert_eq!(r.status, Some(201));
                    assert!(!r.is_error);
                }
                other => panic!("expected a replay, got {other:?}"),
            }
        }
        let rec = env.store().lookup("s", k.as_str()).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.response.unwrap().body, body);
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn different_fingerprint_is_key_reuse<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-reuse");
        let c = begin_claimed(env, req("s", &k, &fp("a"), &POLICY)).await;
        // While in progress…
        assert_eq!(
            env.store()
                .begin(req("s", &k, &fp("b"), &POLICY))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        );
        complete_ok(
            env,
            claim("s", &k, c.fence),
            &StoredResponse::ok(b"1".to_vec()),
        )
        .await;
        // …and once completed.
        assert_eq!(
            env.store()
                .begin(req("s", &k, &fp("b"), &POLICY))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn live_claim_is_in_progress<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-live");
        let f = fp("a");
        let policy = POLICY.lease(Duration::from_secs(30));
        begin_claimed(env, req("s", &k, &f, &policy)).await;
        match env.store().begin(req("s", &k, &f, &policy)).await.unwrap() {
            BeginOutcome::InProgress { retry_after } => {
                assert!(retry_after > Duration::from_secs(25), "{retry_after:?}");
                assert!(retry_after <= Duration::from_secs(30), "{retry_after:?}");
            }
            other => panic!("expected in progress, got {other:?}"),
        }
        let rec = env.store().lookup("s", k.as_str()).await.unwrap().unwrap();
        assert_eq!(rec.state, RecordState::InProgress);
        assert!(rec.response.is_none());
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn expired_lease_reclaims_with_fence_and_recovery_point<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let k = key("k-lease");
        let f = fp("a");
        let policy = POLICY.lease(Duration::from_millis(300));
        let old = begin_claimed(env, req("s", &k, &f, &policy)).await;
        env.store()
            .checkpoint(claim("s", &k, old.fence), b"charged", policy.lease)
            .await
            .unwrap();
        env.wait(Duration::from_millis(450)).await;

        let new = begin_claimed(env, req("s", &k, &f, &policy)).await;
        assert_eq!(new.fence, old.fence + 1);
        assert!(new.reclaimed);
        assert_eq!(new.recovery_point.as_deref(), Some(&b"charged"[..]));

        // The slow original wakes up: every write it tries is refused and changes nothing.
        let late = StoredResponse::ok(b"late".to_vec());
        for result in [
            env.store().complete(claim("s", &k, old.fence), &late).await,
            env.store()
                .checkpoint(claim("s", &k, old.fence), b"x", policy.lease)
                .await,
            env.store().release(claim("s", &k, old.fence)).await,
        ] {
            assert!(
                matches!(result, Err(Error::FenceLost { fence }) if fence == old.fence),
                "{result:?}"
            );
        }
        env.store()
            .complete(
                claim("s", &k, new.fence),
                &StoredResponse::ok(b"new".to_vec()),
            )
            .await
            .unwrap();
        match env.store().begin(req("s", &k, &f, &policy)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r.body, &b"new"[..]),
            other => panic!("expected the new owner's replay, got {other:?}"),
        }
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn fail_closed_keeps_in_progress<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-closed");
        let f = fp("a");
        let policy = POLICY
            .lease(Duration::from_millis(300))
            .expired_lease(ExpiredLease::FailClosed);
        begin_claimed(env, req("s", &k, &f, &policy)).await;
        env.wait(Duration::from_millis(450)).await;
        assert!(matches!(
            env.store().begin(req("s", &k, &f, &policy)).await.unwrap(),
            BeginOutcome::InProgress { .. }
        ));
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn renew_extends_the_lease_and_keeps_the_recovery_point<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let k = key("k-renew");
        let f = fp("a");
        let policy = POLICY.lease(Duration::from_millis(400));
        let c = claimed(env.store().begin(req("s", &k, &f, &policy)).await.unwrap());
        env.store()
            .checkpoint(claim("s", &k, c.fence), b"step-1", policy.lease)
            .await
            .unwrap();
        // Renewed past the original lease's end twice: the claim stays live throughout.
        for _ in 0..2 {
            env.wait(Duration::from_millis(250)).await;
            env.store()
                .renew(claim("s", &k, c.fence), Duration::from_millis(400))
                .await
                .unwrap();
        }
        match env.store().begin(req("s", &k, &f, &policy)).await.unwrap() {
            BeginOutcome::InProgress { retry_after } => {
                assert!(retry_after <= Duration::from_millis(400), "{retry_after:?}");
                assert!(retry_after > Duration::from_millis(100), "{retry_after:?}");
            }
            other => panic!("a renewed claim must stay in progress, got {other:?}"),
        }
        // Once renewals stop, the lease runs out and the take-over gets the recovery point the
        // renewals left untouched.
        env.wait(Duration::from_millis(600)).await;
        let new = claimed(env.store().begin(req("s", &k, &f, &policy)).await.unwrap());
        assert_eq!(new.fence, c.fence + 1);
        assert!(new.reclaimed);
        assert_eq!(new.recovery_point.as_deref(), Some(&b"step-1"[..]));
        // The superseded owner can renew nothing.
        let late = env
            .store()
            .renew(claim("s", &k, c.fence), Duration::from_secs(60))
            .await;
        assert!(
            matches!(late, Err(Error::FenceLost { fence }) if fence == c.fence),
            "{late:?}"
        );
        // A completed record is not renewed either.
        env.store()
            .complete(
                claim("s", &k, new.fence),
                &StoredResponse::ok(b"done".to_vec()),
            )
            .await
            .unwrap();
        let done = env
            .store()
            .renew(claim("s", &k, new.fence), Duration::from_secs(60))
            .await;
        assert!(matches!(done, Err(Error::FenceLost { .. })), "{done:?}");
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// A completion whose reply was lost after the store committed it is retried with the same
    /// fence and answer: that retry succeeds. Another answer, or another fence, is still refused.
    pub async fn a_repeated_completion_is_done_once<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-complete-twice");
        let f = fp("a");
        let c = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        let answer = StoredResponse {
            status: Some(201),
            is_error: false,
            body: bytes::Bytes::from_static(b"{\"id\":1}"),
        };
        complete_ok(env, claim("s", &k, c.fence), &answer).await;
        complete_ok(env, claim("s", &k, c.fence), &answer).await;
        let other = StoredResponse::ok(b"another answer".to_vec());
        let done = env.store().complete(claim("s", &k, c.fence), &other).await;
        assert!(matches!(done, Err(Error::FenceLost { .. })), "{done:?}");
        let done = env
            .store()
            .complete(claim("s", &k, c.fence + 1), &answer)
            .await;
        assert!(matches!(done, Err(Error::FenceLost { .. })), "{done:?}");
        match env.store().begin(req("s", &k, &f, &POLICY)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(r, answer),
            other => panic!("expected the first answer replayed, got {other:?}"),
        }
        // An answer without a status (a consumer's) and an error's are recognised alike.
        for (name, answer) in [
            (
                "k-complete-twice-message",
                StoredResponse::ok(b"acked".to_vec()),
            ),
            (
                "k-complete-twice-error",
                StoredResponse {
                    status: Some(422),
                    is_error: true,
                    body: bytes::Bytes::from_static(b"refused"),
                },
            ),
        ] {
            let k = key(name);
            let c = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
            complete_ok(env, claim("s", &k, c.fence), &answer).await;
            complete_ok(env, claim("s", &k, c.fence), &answer).await;
            let flipped = StoredResponse {
                is_error: !answer.is_error,
                ..answer.clone()
            };
            let done = env
                .store()
                .complete(claim("s", &k, c.fence), &flipped)
                .await;
            assert!(matches!(done, Err(Error::FenceLost { .. })), "{done:?}");
        }
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn release_lets_a_retry_claim<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-release");
        let f = fp("a");
        let c = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        env.store().release(claim("s", &k, c.fence)).await.unwrap();
        assert!(env.store().lookup("s", k.as_str()).await.unwrap().is_none());
        let retry = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        assert!(
            retry.fence > c.fence,
            "fences must keep growing across a release"
        );
        assert!(!retry.reclaimed);
        // The released owner cannot write over the retry.
        assert!(matches!(
            env.store()
                .complete(claim("s", &k, c.fence), &StoredResponse::ok(vec![]))
                .await,
            Err(Error::FenceLost { .. })
        ));
        // After a release, the key is free for another body too.
        let k2 = key("k-release-2");
        let c2 = begin_claimed(env, req("s", &k2, &fp("a"), &POLICY)).await;
        env.store()
            .release(claim("s", &k2, c2.fence))
            .await
            .unwrap();
        begin_claimed(env, req("s", &k2, &fp("b"), &POLICY)).await;
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn a_suspended_claim_is_resumed_by_its_retry_at_once<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-suspend");
        let f = fp("a");
        let c = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        env.store()
            .checkpoint(claim("s", &k, c.fence), b"charged", POLICY.lease)
            .await
            .unwrap();
        // The outcome is unknown: kept in progress, its lease ended, never released.
        env.store()
            .suspend(
                claim("s", &k, c.fence),
                "the gateway timed out",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        // Another body under the key is still key reuse: the record holds this request's work.
        assert!(matches!(
            env.store()
                .begin(req("s", &k, &fp("b"), &POLICY))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        ));
        // The same request's retry resumes it at once: the next attempt, the recovery point.
        let resumed = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        assert!(resumed.fence > c.fence);
        assert!(resumed.reclaimed, "a resumption, not a fresh claim");
        assert_eq!(resumed.attempt, 2);
        assert_eq!(resumed.recovery_point.as_deref(), Some(&b"charged"[..]));
        // The suspended attempt can write nothing more.
        for stale in [
            env.store()
                .suspend(claim("s", &k, c.fence), "late", Duration::ZERO)
                .await,
            env.store()
                .complete(claim("s", &k, c.fence), &StoredResponse::ok(vec![]))
                .await,
        ] {
            assert!(matches!(stale, Err(Error::FenceLost { .. })), "{stale:?}");
        }
        complete_ok(
            env,
            claim("s", &k, resumed.fence),
            &StoredResponse::ok(&b"done"[..]),
        )
        .await;
        assert!(env.store().lookup("s", k.as_str()).await.unwrap().is_some());
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn dropped_guard_releases_promptly<S: Store + Clone>(env: &Env<S>) {
        let f = fp("a");
        let guard = match crate::begin(env.store(), "s".into(), key("k-drop"), f, POLICY).await {
            Ok(crate::Begun::Claimed(g)) => g,
            other => panic!("{other:?}"),
        };
        let first = guard.fence();
        drop(guard);
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            match env
                .store
                .begin(req("s", &key("k-drop"), &f, &POLICY))
                .await
                .unwrap()
            {
                BeginOutcome::Claimed(c) => {
                    assert_eq!(c.fence, first + 1);
                    break;
                }
                BeginOutcome::InProgress { .. } if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                other => panic!("the dropped claim was not released within 1 s: {other:?}"),
            }
        }
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn racing_tasks_claim_once<S: Store + Clone>(env: &Env<S>) {
        let f = fp("a");
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let store = env.store().clone();
            tasks.push(tokio::spawn(async move {
                let k = key("k-race");
                store.begin(req("s", &k, &f, &POLICY)).await.unwrap()
            }));
        }
        let mut claims = 0;
        let mut in_progress = 0;
        for t in tasks {
            match t.await.unwrap() {
                BeginOutcome::Claimed(c) => {
                    assert!(!c.reclaimed);
                    claims += 1;
                }
                BeginOutcome::InProgress { .. } => in_progress += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(claims, 1, "exactly one of 64 racing tasks may claim");
        assert_eq!(in_progress, 63);
    }

    /// Begins `(s, key)` with fingerprint `a` under `policy` through the flow (as every guarded
    /// call does), on a task of its own, and says how long it took to answer.
    fn begin_task<S: Store + Clone>(
        env: &Env<S>,
        key_text: &'static str,
        policy: Policy,
    ) -> tokio::task::JoinHandle<(Result<Option<StoredResponse>, Error>, Duration)> {
        let store = env.store().clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let begun = crate::begin(&store, "s".into(), key(key_text), fp("a"), policy).await;
            let answer = match begun {
                Ok(crate::Begun::Replay(stored)) => Ok(Some(stored)),
                Ok(crate::Begun::Claimed(guard)) => {
                    // A waiter that claims runs, and answers with its own bytes.
                    let mine = StoredResponse::ok(&b"second"[..]);
                    guard.complete(&mine).await.map(|()| None)
                }
                Err(e) => Err(e),
            };
            (answer, started.elapsed())
        })
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn waiting_duplicates_replay_the_first_answer<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-wait");
        let f = fp("a");
        let first = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        let waiting = POLICY.wait(Duration::from_secs(20));
        let waiters: Vec<_> = (0..16)
            .map(|_| begin_task(env, "k-wait", waiting))
            .collect();
        // The duplicates are waiting, not answered: none has finished while the claim is live.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "a duplicate with a wait was answered while the first call still ran"
        );
        let answer = StoredResponse {
            status: Some(201),
            ..StoredResponse::ok(&b"{\"refund\":\"r-1\"}"[..])
        };
        complete_ok(env, claim("s", &k, first.fence), &answer).await;
        for w in waiters {
            let (got, took) = w.await.unwrap();
            let got = got.unwrap_or_else(|e| panic!("a waiting duplicate got {e:?}"));
            assert_eq!(
                got.as_ref(),
                Some(&answer),
                "every waiting duplicate replays the first answer, byte for byte, and none runs"
            );
            assert!(
                took < Duration::from_secs(10),
                "a waiting duplicate replays soon after the completion, not at the end of its wait ({took:?})"
            );
        }
        // A duplicate without a wait is told at once, as before.
        let k2 = key("k-wait-none");
        begin_claimed(env, req("s", &k2, &f, &POLICY)).await;
        let (got, _) = begin_task(env, "k-wait-none", POLICY).await.unwrap();
        assert!(matches!(got, Err(Error::InProgress { .. })), "{got:?}");
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn a_waiting_duplicate_is_told_in_progress_when_its_wait_runs_out<
        S: Store + Clone,
    >(
        env: &Env<S>,
    ) {
        let k = key("k-wait-out");
        let f = fp("a");
        let first = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        let bound = Duration::from_millis(400);
        let (got, took) = begin_task(env, "k-wait-out", POLICY.wait(bound))
            .await
            .unwrap();
        assert!(matches!(got, Err(Error::InProgress { .. })), "{got:?}");
        assert!(
            took >= bound,
            "told in progress before its wait ran out ({took:?})"
        );
        // It changed nothing: the first call still owns the key and completes it.
        complete_ok(
            env,
            claim("s", &k, first.fence),
            &StoredResponse::ok(&b"one"[..]),
        )
        .await;
        // Another body under the key is still refused at once, wait or not.
        let other = crate::begin(env.store(), "s".into(), k, fp("b"), POLICY.wait(bound)).await;
        assert!(matches!(other, Err(Error::KeyReused)), "{other:?}");
        // A wait longer than the lease is refused before the store is asked.
        let (too_long, _) = begin_task(
            env,
            "k-wait-too-long",
            POLICY
                .lease(Duration::from_secs(1))
                .wait(Duration::from_secs(2)),
        )
        .await
        .unwrap();
        assert!(matches!(too_long, Err(Error::Config(_))), "{too_long:?}");
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn a_release_lets_one_waiting_duplicate_run_and_the_others_replay_it<
        S: Store + Clone,
    >(
        env: &Env<S>,
    ) {
        let k = key("k-wait-release");
        let f = fp("a");
        let first = begin_claimed(env, req("s", &k, &f, &POLICY)).await;
        let waiting = POLICY.wait(Duration::from_secs(20));
        let waiters: Vec<_> = (0..8)
            .map(|_| begin_task(env, "k-wait-release", waiting))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The first call did nothing and released: one waiter claims and runs, the others wait
        // for it and replay its answer.
        env.store()
            .release(claim("s", &k, first.fence))
            .await
            .unwrap();
        let (mut ran, mut replayed) = (0, 0);
        for w in waiters {
            match w.await.unwrap().0 {
                Ok(None) => ran += 1,
                Ok(Some(stored)) => {
                    assert_eq!(&stored.body[..], b"second");
                    replayed += 1;
                }
                Err(e) => panic!("a waiting duplicate got {e:?}"),
            }
        }
        assert_eq!((ran, replayed), (1, 7), "exactly one waiter runs the call");
    }

    /// See [`conformance_tests!`](crate::conformance_tests). A store that announces the
    /// ends of claims ([`Store::changes`]) wakes each claim's listeners when a completion, a
    /// release, a suspension or an operator's release ends it, and nobody else: not a listener
    /// on another key, not for a write that lost its fence. (A store that announces nothing
    /// has nothing to check here: its waiters ask again on their own.)
    pub async fn the_ends_of_claims_are_announced_to_their_listeners<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let Some(changes) = env.store().changes() else {
            return;
        };
        let heard = Duration::from_secs(5);
        let quiet = Duration::from_millis(100);
        let f = fp("a");
        let ks: Vec<Key> = ["k-ann-1", "k-ann-2", "k-ann-3", "k-ann-4"]
            .into_iter()
            .map(key)
            .collect();
        let mut claims = Vec::new();
        for k in &ks {
            claims.push(begin_claimed(env, req("s", k, &f, &POLICY)).await);
        }
        let mut ears: Vec<_> = ks.iter().map(|k| changes.listen("s", k.as_str())).collect();
        let mut other = changes.listen("s", "k-ann-never");
        // A write that lost its fence ends nothing, and is not announced.
        let stale = claim("s", &ks[0], claims[0].fence + 1);
        assert!(matches!(
            env.store().release(stale).await,
            Err(Error::FenceLost { .. })
        ));
        assert!(
            tokio::time::timeout(quiet, ears[0].changed())
                .await
                .is_err(),
            "a write that lost its fence was announced"
        );
        complete_ok(
            env,
            claim("s", &ks[0], claims[0].fence),
            &StoredResponse::ok(&b"one"[..]),
        )
        .await;
        env.store()
            .release(claim("s", &ks[1], claims[1].fence))
            .await
            .unwrap();
        env.store()
            .suspend(claim("s", &ks[2], claims[2].fence), "unknown", POLICY.lease)
            .await
            .unwrap();
        env.store()
            .force_release_fenced("s", ks[3].as_str(), claims[3].fence)
            .await
            .unwrap();
        for (ear, what) in
            ears.iter_mut()
                .zip(["completion", "release", "suspension", "forced release"])
        {
            tokio::time::timeout(heard, ear.changed())
                .await
                .unwrap_or_else(|_| panic!("a {what} was not announced to its listener"));
        }
        assert!(
            tokio::time::timeout(quiet, other.changed()).await.is_err(),
            "a listener on another key was woken"
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn retention_expiry_frees_the_identity<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-retain");
        let policy = POLICY
            .lease(Duration::from_millis(300))
            .retain(Duration::from_millis(300));
        let c = begin_claimed(env, req("s", &k, &fp("a"), &policy)).await;
        complete_ok(
            env,
            claim("s", &k, c.fence),
            &StoredResponse::ok(b"1".to_vec()),
        )
        .await;
        assert!(matches!(
            env.store()
                .begin(req("s", &k, &fp("b"), &policy))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        ));
        env.wait(Duration::from_millis(450)).await;
        assert!(env.store().lookup("s", k.as_str()).await.unwrap().is_none());
        let again = begin_claimed(env, req("s", &k, &fp("b"), &policy)).await;
        assert!(again.fence > c.fence);
        assert_eq!(again.recovery_point, None);
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn purge_removes_only_expired<S: Store + Clone>(env: &Env<S>) {
        let short = POLICY
            .lease(Duration::from_millis(300))
            .retain(Duration::from_millis(300));
        for i in 0..5 {
            let k = key(&format!("k-purge-{i}"));
            let c = begin_claimed(env, req("s", &k, &fp("a"), &short)).await;
            complete_ok(env, claim("s", &k, c.fence), &StoredResponse::ok(vec![])).await;
        }
        let keep = key("k-keep");
        let c = begin_claimed(env, req("s", &keep, &fp("a"), &POLICY)).await;
        complete_ok(env, claim("s", &keep, c.fence), &StoredResponse::ok(vec![])).await;
        env.wait(Duration::from_millis(450)).await;
        for i in 0..5 {
            let k = format!("k-purge-{i}");
            assert!(env.store().lookup("s", &k).await.unwrap().is_none(), "{k}");
        }
        let expired = if env.expires_by_itself { 0 } else { 5 };
        assert_eq!(env.store().purge_expired().await.unwrap(), expired);
        assert_eq!(env.store().purge_expired().await.unwrap(), 0);
        assert!(
            env.store()
                .lookup("s", keep.as_str())
                .await
                .unwrap()
                .is_some()
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn a_purged_identity_never_reuses_a_fence<S: Store + Clone>(env: &Env<S>) {
        let k = key("k-purged");
        let short = POLICY
            .retain(Duration::from_millis(300))
            .lease(Duration::from_millis(300));
        let old = begin_claimed(env, req("s", &k, &fp("a"), &short)).await;
        // The owner stalls past the retention; the record is purged and claimed afresh.
        env.wait(Duration::from_millis(450)).await;
        let expired = if env.expires_by_itself { 0 } else { 1 };
        assert_eq!(env.store().purge_expired().await.unwrap(), expired);
        let new = begin_claimed(env, req("s", &k, &fp("a"), &POLICY)).await;
        assert!(
            new.fence > old.fence,
            "{} must exceed {}",
            new.fence,
            old.fence
        );
        let late = env
            .store
            .complete(
                claim("s", &k, old.fence),
                &StoredResponse::ok(b"late".to_vec()),
            )
            .await;
        assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
        env.store()
            .complete(
                claim("s", &k, new.fence),
                &StoredResponse::ok(b"new".to_vec()),
            )
            .await
            .unwrap();
    }

    /// Three records an operator looks at: a claim in progress that checkpointed
    /// (`refund:1`), a completed one (`refund:2`) and a released one (`order:3`), made in that
    /// order.
    async fn three_records<S: Store + Clone>(env: &Env<S>) -> [u64; 3] {
        let (a, b, c) = (key("k-a"), key("k-b"), key("k-c"));
        let ca = begin_claimed(env, req("refund:1", &a, &fp("a"), &POLICY)).await;
        env.store()
            .checkpoint(claim("refund:1", &a, ca.fence), b"step-1", POLICY.lease)
            .await
            .unwrap();
        env.wait(Duration::from_millis(5)).await;
        let cb = begin_claimed(env, req("refund:2", &b, &fp("b"), &POLICY)).await;
        complete_ok(
            env,
            claim("refund:2", &b, cb.fence),
            &StoredResponse {
                status: Some(201),
                ..StoredResponse::ok(b"{\"refund\":2}".to_vec())
            },
        )
        .await;
        env.wait(Duration::from_millis(5)).await;
        let cc = begin_claimed(env, req("order:3", &c, &fp("c"), &POLICY)).await;
        env.store()
            .release(claim("order:3", &c, cc.fence))
            .await
            .unwrap();
        [ca.fence, cb.fence, cc.fence]
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn operators_list_and_inspect_records<S: Store + Clone>(env: &Env<S>) {
        let fences = three_records(env).await;
        let store = env.store();
        let all = store.list(&RecordQuery::new()).await.unwrap();
        let seen: Vec<_> = all
            .iter()
            .map(|r| (r.scope.as_str(), r.key.as_str(), r.state, r.fence))
            .collect();
        assert_eq!(
            seen,
            [
                ("refund:1", "k-a", State::InProgress, fences[0]),
                ("refund:2", "k-b", State::Completed, fences[1]),
                ("order:3", "k-c", State::Released, fences[2]),
            ],
            "every record, in the order their retention ends: for one retention, oldest first"
        );
        assert!(
            all.iter()
                .all(|r| r.response.is_none() && r.recovery_point.is_none())
        );
        assert!(all.iter().all(|r| r.attempt == 1));
        assert!(
            all.iter()
                .all(|r| r.expires_in > Duration::from_secs(23 * 3600))
        );
        assert!(
            all[0]
                .lease_remaining
                .is_some_and(|l| l <= POLICY.lease && !l.is_zero())
        );
        assert_eq!(all[1].lease_remaining, None);
        assert_eq!(all[1].fingerprint, fp("b"));

        let only = |q: RecordQuery| async move {
            let found = store.list(&q).await.unwrap();
            found.into_iter().map(|r| r.key).collect::<Vec<_>>()
        };
        assert_eq!(
            only(RecordQuery::new().state(State::InProgress)).await,
            ["k-a"]
        );
        assert_eq!(
            only(RecordQuery::new().scope_prefix("refund:")).await,
            ["k-a", "k-b"]
        );
        assert_eq!(
            only(RecordQuery::new().scope_prefix("refund:2")).await,
            ["k-b"]
        );
        assert_eq!(
            only(RecordQuery::new().scope_prefix("%")).await,
            Vec::<String>::new()
        );
        assert_eq!(only(RecordQuery::new().limit(2)).await, ["k-a", "k-b"]);
        assert_eq!(
            only(RecordQuery::new().older_than(Duration::from_secs(3600))).await,
            Vec::<String>::new()
        );
        env.wait(Duration::from_millis(1200)).await;
        assert_eq!(
            only(
                RecordQuery::new()
                    .older_than(Duration::from_secs(1))
                    .state(State::Completed)
            )
            .await,
            ["k-b"]
        );

        let completed = store.inspect("refund:2", "k-b").await.unwrap().unwrap();
        let answer = completed
            .response
            .expect("an inspected completed record has its answer");
        assert_eq!(
            (answer.status, &answer.body[..]),
            (Some(201), &b"{\"refund\":2}"[..])
        );
        let running = store.inspect("refund:1", "k-a").await.unwrap().unwrap();
        assert_eq!(running.recovery_point.as_deref(), Some(&b"step-1"[..]));
        assert_eq!(running.response, None);
        let released = store.inspect("order:3", "k-c").await.unwrap().unwrap();
        assert_eq!(released.state, State::Released);
        assert_eq!(store.inspect("refund:1", "k-none").await.unwrap(), None);
        assert_eq!(store.inspect("refund:9", "k-a").await.unwrap(), None);
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn a_forced_release_moves_the_fence_on<S: Store + Clone>(env: &Env<S>) {
        let store = env.store();
        let k = key("k-stuck");
        let stale = begin_claimed(env, req("s", &k, &fp("a"), &POLICY)).await;
        let done = store.force_release("s", k.as_str()).await.unwrap();
        let ForcedRelease::Released { fence } = done else {
            panic!("a claim in progress is released: {done:?}")
        };
        assert!(
            fence > stale.fence,
            "the fence moves on: {fence} > {}",
            stale.fence
        );
        let info = store.inspect("s", k.as_str()).await.unwrap().unwrap();
        assert_eq!((info.state, info.fence), (State::Released, fence));

        // The owner presumed gone wakes up: it can neither complete nor checkpoint nor release.
        let late = store
            .complete(
                claim("s", &k, stale.fence),
                &StoredResponse::ok(b"late".to_vec()),
            )
            .await;
        assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
        let late = store
            .checkpoint(claim("s", &k, stale.fence), b"x", POLICY.lease)
            .await;
        assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");

        // The retry claims at once and completes; its answer is the one replayed.
        let retry = begin_claimed(env, req("s", &k, &fp("a"), &POLICY)).await;
        assert!(retry.fence > fence);
        complete_ok(
            env,
            claim("s", &k, retry.fence),
            &StoredResponse::ok(b"retry".to_vec()),
        )
        .await;
        let late = store
            .complete(
                claim("s", &k, stale.fence),
                &StoredResponse::ok(b"late".to_vec()),
            )
            .await;
        assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
        match store.begin(req("s", &k, &fp("a"), &POLICY)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(&r.body[..], b"retry"),
            other => panic!("the retry's answer is replayed: {other:?}"),
        }

        // Nothing else to release: a completed record, and one that does not exist.
        assert_eq!(
            store.force_release("s", k.as_str()).await.unwrap(),
            ForcedRelease::NotInProgress(State::Completed)
        );
        assert_eq!(
            store.force_release("s", "k-none").await.unwrap(),
            ForcedRelease::NotFound
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn a_forced_release_with_a_stale_fence_releases_nothing<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let store = env.store();
        let k = key("k-seen");
        // The operator sees the first claim; it is released (by another operator) and the
        // retry claims again before the operator's release arrives.
        let seen = begin_claimed(env, req("s", &k, &fp("a"), &POLICY)).await;
        let done = store
            .force_release_fenced("s", k.as_str(), seen.fence)
            .await
            .unwrap();
        let ForcedRelease::Released { fence: released } = done else {
            panic!("a claim with the fence asked for is released: {done:?}")
        };
        let retry = begin_claimed(env, req("s", &k, &fp("a"), &POLICY)).await;
        assert!(retry.fence > released);

        // The late release names the fence the operator saw: the retry's claim stays.
        assert_eq!(
            store
                .force_release_fenced("s", k.as_str(), seen.fence)
                .await
                .unwrap(),
            ForcedRelease::FenceMoved {
                fence: retry.fence,
                state: State::InProgress,
            }
        );
        let info = store.inspect("s", k.as_str()).await.unwrap().unwrap();
        assert_eq!((info.state, info.fence), (State::InProgress, retry.fence));
        complete_ok(
            env,
            claim("s", &k, retry.fence),
            &StoredResponse::ok(b"retry".to_vec()),
        )
        .await;

        // A stale fence on a completed record says what it is now; the right one says it is
        // not in progress; neither changes it.
        assert_eq!(
            store
                .force_release_fenced("s", k.as_str(), seen.fence)
                .await
                .unwrap(),
            ForcedRelease::FenceMoved {
                fence: retry.fence,
                state: State::Completed,
            }
        );
        assert_eq!(
            store
                .force_release_fenced("s", k.as_str(), retry.fence)
                .await
                .unwrap(),
            ForcedRelease::NotInProgress(State::Completed)
        );
        match store.begin(req("s", &k, &fp("a"), &POLICY)).await.unwrap() {
            BeginOutcome::Replay(r) => assert_eq!(&r.body[..], b"retry"),
            other => panic!("the retry's answer is replayed: {other:?}"),
        }
        assert_eq!(
            store
                .force_release_fenced("s", "k-none", seen.fence)
                .await
                .unwrap(),
            ForcedRelease::NotFound
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn stats_count_by_state_and_prefix<S: Store + Clone>(env: &Env<S>) {
        three_records(env).await;
        let stats = env.store().stats(Duration::from_secs(3600)).await.unwrap();
        let counts = |in_progress, completed, released| {
            let mut c = StateCounts::default();
            c.add(State::InProgress, in_progress);
            c.add(State::Completed, completed);
            c.add(State::Released, released);
            c
        };
        assert_eq!(stats.states, counts(1, 1, 1));
        assert_eq!(stats.states.total(), 3);
        assert_eq!(
            stats.by_prefix,
            [
                ("order".to_owned(), counts(0, 0, 1)),
                ("refund".to_owned(), counts(1, 1, 0)),
            ]
        );
        assert_eq!((stats.expired, stats.expiring_soon), (0, 0));
        let oldest = stats.oldest_in_progress.expect("a claim in progress");
        assert!(oldest < Duration::from_secs(60), "{oldest:?}");
        // Every record's retention (24 hours) ends within two days.
        let soon = env
            .store()
            .stats(Duration::from_secs(48 * 3600))
            .await
            .unwrap();
        assert_eq!(soon.expiring_soon, 3);
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn expired_records_are_counted_then_purged_in_batches<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let short = POLICY
            .lease(Duration::from_millis(300))
            .retain(Duration::from_millis(300));
        for i in 0..5 {
            let k = key(&format!("k-count-{i}"));
            let c = begin_claimed(env, req("s", &k, &fp("a"), &short)).await;
            complete_ok(env, claim("s", &k, c.fence), &StoredResponse::ok(vec![])).await;
        }
        let keep = key("k-keep");
        begin_claimed(env, req("s", &keep, &fp("a"), &POLICY)).await;
        assert_eq!(env.store().count_expired().await.unwrap(), 0);
        env.wait(Duration::from_millis(450)).await;
        let expired = if env.expires_by_itself { 0 } else { 5 };
        assert_eq!(env.store().count_expired().await.unwrap(), expired);
        let stats = env.store().stats(Duration::ZERO).await.unwrap();
        assert_eq!((stats.expired, stats.states.total()), (expired, 1));
        let mut purged = 0;
        loop {
            let n = env.store().purge_batch().await.unwrap();
            if n == 0 {
                break;
            }
            purged += n;
        }
        assert_eq!(purged, expired);
        assert_eq!(env.store().count_expired().await.unwrap(), 0);
        let left = env.store().list(&RecordQuery::new()).await.unwrap();
        assert_eq!(
            left.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["k-keep"]
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn attempts_count_unfinished_tries<S: Store + Clone>(env: &Env<S>) {
        let (k, f) = (key("k-attempts"), fp("a"));
        let short = POLICY.lease(Duration::from_millis(300));
        let first = begin_claimed(env, req("s", &k, &f, &short)).await;
        assert_eq!(first.attempt, 1);
        // Released (an error, a panic, a dropped caller): the retry is the second attempt.
        env.store()
            .release(claim("s", &k, first.fence))
            .await
            .unwrap();
        let second = begin_claimed(env, req("s", &k, &f, &short)).await;
        assert_eq!(second.attempt, 2);
        assert!(!second.reclaimed);
        // Abandoned past its lease: the take-over is the third.
        env.wait(Duration::from_millis(450)).await;
        let third = begin_claimed(env, req("s", &k, &f, &short)).await;
        assert!(third.reclaimed);
        assert_eq!(third.attempt, 3);
        // Another request after a release starts again at 1.
        env.store()
            .release(claim("s", &k, third.fence))
            .await
            .unwrap();
        let other = begin_claimed(env, req("s", &k, &fp("b"), &short)).await;
        assert_eq!(other.attempt, 1);
        // A request whose record's retention ended starts again at 1 too.
        let (k2, retain) = (
            key("k-attempts-2"),
            short.retain(Duration::from_millis(300)),
        );
        let c = begin_claimed(env, req("s", &k2, &f, &retain)).await;
        env.store().release(claim("s", &k2, c.fence)).await.unwrap();
        env.wait(Duration::from_millis(450)).await;
        assert_eq!(
            begin_claimed(env, req("s", &k2, &f, &retain)).await.attempt,
            1
        );
    }

    // ---- the completer's operations ----------------------------------------------------------

    /// The stored request of a resumable call to `order`, encoded as a store keeps it.
    fn stored_request(order: &str) -> Vec<u8> {
        StoredRequest::new("pay:<order_no>", format!("{{\"order_no\":\"{order}\"}}"))
            .unwrap()
            .encode()
    }

    /// The claims `due(limit)` lists whose scope is `scope`, by key.
    async fn due_in<S: Store + Clone>(env: &Env<S>, scope: &str, limit: usize) -> Vec<Unfinished> {
        let mut due = env.store().due(limit).await.unwrap();
        due.retain(|u| u.scope == scope);
        due
    }

    fn keys(due: &[Unfinished]) -> Vec<&str> {
        due.iter().map(|u| u.key.as_str()).collect()
    }

    /// A resumable claim on `(scope, k)` whose lease of 300 ms ran out: found due, as the
    /// completer finds it.
    async fn due_claim<S: Store + Clone>(env: &Env<S>, scope: &str, k: &Key) -> Unfinished {
        let short = POLICY.lease(Duration::from_millis(300));
        let request = stored_request(k.as_str());
        let f = fp("a");
        begin_claimed(env, req(scope, k, &f, &short).resumable(&request)).await;
        env.wait(Duration::from_millis(450)).await;
        let due = due_in(env, scope, 100).await;
        let found = due.into_iter().find(|u| u.key == k.as_str());
        found.expect("a resumable claim whose lease ran out is due")
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// A resumable claim is due to the completer once its lease runs out, with what the
    /// completer needs to take it over: its stored request, attempt, fingerprint and fence. A
    /// claim that stores no request never is, and a live one is not yet.
    pub async fn a_resumable_claim_whose_lease_ran_out_is_due_with_its_request<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let (resumable, plain, live) = (key("k-due-1"), key("k-due-plain"), key("k-due-live"));
        let (f, short) = (fp("a"), POLICY.lease(Duration::from_millis(300)));
        let long = POLICY.lease(Duration::from_secs(30));
        let request = stored_request("ORD-1");
        let c = begin_claimed(env, req("due", &resumable, &f, &short).resumable(&request)).await;
        begin_claimed(env, req("due", &plain, &f, &short)).await;
        begin_claimed(env, req("due", &live, &f, &long).resumable(&request)).await;
        assert!(
            due_in(env, "due", 10).await.is_empty(),
            "nothing is due while its lease runs"
        );
        env.wait(Duration::from_millis(450)).await;
        let due = due_in(env, "due", 10).await;
        assert_eq!(
            keys(&due),
            ["k-due-1"],
            "only the resumable claim whose lease ran out"
        );
        let u = &due[0];
        assert_eq!((u.fence, u.attempt), (c.fence, 1));
        assert_eq!(u.fingerprint, f);
        assert_eq!(u.request, request, "its request, byte for byte");
        assert_eq!(u.note, None);
        assert!(
            u.overdue >= Duration::from_millis(100) && u.overdue < Duration::from_secs(60),
            "{:?}",
            u.overdue
        );
        let info = env
            .store()
            .inspect("due", resumable.as_str())
            .await
            .unwrap()
            .unwrap();
        assert!(info.resumable && info.holds_work(), "{info:?}");
        assert_eq!(info.request.as_deref(), Some(&request[..]));

        // Taken over (as the completer does, storing no request of its own): the new claim is
        // live, then due again with the next attempt and the same request once its lease ends.
        let again = begin_claimed(env, req("due", &resumable, &f, &short)).await;
        assert!(again.reclaimed);
        assert_eq!((again.fence, again.attempt), (c.fence + 1, 2));
        assert!(due_in(env, "due", 10).await.is_empty());
        env.wait(Duration::from_millis(450)).await;
        let due = due_in(env, "due", 10).await;
        assert_eq!(keys(&due), ["k-due-1"]);
        assert_eq!((due[0].fence, due[0].attempt), (again.fence, 2));
        assert_eq!(due[0].request, request);

        // Finished: never due again.
        let last = begin_claimed(env, req("due", &resumable, &f, &short)).await;
        complete_ok(
            env,
            claim("due", &resumable, last.fence),
            &StoredResponse::ok(&b"done"[..]),
        )
        .await;
        env.wait(Duration::from_millis(450)).await;
        assert!(due_in(env, "due", 10).await.is_empty());
        // Released work is not due either: its retry starts it again.
        let k = key("k-due-released");
        let c = begin_claimed(env, req("due", &k, &f, &short).resumable(&request)).await;
        env.store()
            .release(claim("due", &k, c.fence))
            .await
            .unwrap();
        env.wait(Duration::from_millis(450)).await;
        assert!(due_in(env, "due", 10).await.is_empty());
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// A suspended claim (its outcome unknown) is due once its resume time passes, not before,
    /// with the note that says why; one that stores no request never is.
    pub async fn a_suspended_claim_is_due_after_its_resume_time_with_its_note<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let (resumable, plain) = (key("k-susp-1"), key("k-susp-plain"));
        let f = fp("a");
        let request = stored_request("ORD-2");
        let c = begin_claimed(
            env,
            req("susp", &resumable, &f, &POLICY).resumable(&request),
        )
        .await;
        let p = begin_claimed(env, req("susp", &plain, &f, &POLICY)).await;
        env.store()
            .checkpoint(claim("susp", &resumable, c.fence), b"charged", POLICY.lease)
            .await
            .unwrap();
        for (k, fence) in [(&resumable, c.fence), (&plain, p.fence)] {
            env.store()
                .suspend(
                    claim("susp", k, fence),
                    "the gateway timed out",
                    Duration::from_millis(600),
                )
                .await
                .unwrap();
        }
        // Its lease ended now, but its resume time has not come.
        assert!(due_in(env, "susp", 10).await.is_empty());
        env.wait(Duration::from_millis(800)).await;
        let due = due_in(env, "susp", 10).await;
        assert_eq!(
            keys(&due),
            ["k-susp-1"],
            "only the one whose request is stored"
        );
        let u = &due[0];
        assert_eq!((u.fence, u.attempt), (c.fence, 1));
        assert_eq!(u.note.as_deref(), Some("the gateway timed out"));
        assert_eq!(u.request, request);
        assert!(u.overdue < Duration::from_secs(60), "{:?}", u.overdue);
        // Both hold unfinished work, with their note.
        for k in [&resumable, &plain] {
            let info = env.store().inspect("susp", k.as_str()).await.unwrap();
            let info = info.unwrap();
            assert!(info.holds_work(), "{info:?}");
            assert_eq!(info.note.as_deref(), Some("the gateway timed out"));
        }
        // The completer's take-over gets the recovery point and the next attempt.
        let resumed = begin_claimed(env, req("susp", &resumable, &f, &POLICY)).await;
        assert_eq!((resumed.attempt, resumed.reclaimed), (2, true));
        assert_eq!(resumed.recovery_point.as_deref(), Some(&b"charged"[..]));
        assert!(due_in(env, "susp", 10).await.is_empty());
        // Suspended again after the second attempt: due again, with the new note.
        env.store()
            .suspend(
                claim("susp", &resumable, resumed.fence),
                "still no answer",
                Duration::ZERO,
            )
            .await
            .unwrap();
        env.wait(Duration::from_millis(50)).await;
        let due = due_in(env, "susp", 10).await;
        assert_eq!(keys(&due), ["k-susp-1"]);
        assert_eq!((due[0].fence, due[0].attempt), (resumed.fence, 2));
        assert_eq!(due[0].note.as_deref(), Some("still no answer"));
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    pub async fn due_honours_its_limit_longest_due_first<S: Store + Clone>(env: &Env<S>) {
        let (f, short) = (fp("a"), POLICY.lease(Duration::from_millis(300)));
        for i in 0..4 {
            let k = key(&format!("k-limit-{i}"));
            let request = stored_request(k.as_str());
            begin_claimed(env, req("limit", &k, &f, &short).resumable(&request)).await;
            env.wait(Duration::from_millis(30)).await;
        }
        env.wait(Duration::from_millis(450)).await;
        let all = due_in(env, "limit", 10).await;
        assert_eq!(
            keys(&all),
            ["k-limit-0", "k-limit-1", "k-limit-2", "k-limit-3"],
            "those due longest first"
        );
        assert!(all.windows(2).all(|w| w[0].overdue >= w[1].overdue));
        let two = due_in(env, "limit", 2).await;
        assert_eq!(keys(&two), ["k-limit-0", "k-limit-1"]);
        assert!(env.store().due(0).await.unwrap().is_empty());
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// Parking needs the fence the claim was found due with: it is then parked for good (never
    /// due, a `begin` answers parked, kept for an operator); a stale fence or a live claim parks
    /// nothing.
    pub async fn park_with_the_due_fence_parks_for_good<S: Store + Clone>(env: &Env<S>) {
        let store = env.store();
        let k = key("k-park");
        let u = due_claim(env, "park", &k).await;
        // A live claim is not parked, nor one under a fence that is not the record's.
        let live = key("k-park-live");
        let request = stored_request("live");
        let l = begin_claimed(
            env,
            req("park", &live, &fp("a"), &POLICY).resumable(&request),
        )
        .await;
        for (kk, fence) in [(&live, l.fence), (&k, u.fence + 1), (&k, u.fence - 1)] {
            let done = store.park(claim("park", kk, fence), "gave up").await;
            assert!(
                matches!(done, Err(Error::FenceLost { fence: f }) if f == fence),
                "{done:?}"
            );
        }
        assert_eq!(
            store
                .inspect("park", live.as_str())
                .await
                .unwrap()
                .unwrap()
                .state,
            State::InProgress
        );
        store
            .park(claim("park", &k, u.fence), "the bank kept timing out")
            .await
            .unwrap();

        let info = store.inspect("park", k.as_str()).await.unwrap().unwrap();
        assert_eq!((info.state, info.fence), (State::Parked, u.fence));
        assert_eq!(info.note.as_deref(), Some("the bank kept timing out"));
        assert!(info.holds_work(), "{info:?}");
        let parked = store
            .list(&RecordQuery::new().state(State::Parked))
            .await
            .unwrap();
        assert_eq!(
            parked.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["k-park"]
        );
        let found = store.lookup("park", k.as_str()).await.unwrap().unwrap();
        assert_eq!((found.state, found.fence), (RecordState::Parked, u.fence));
        let stats = store.stats(Duration::ZERO).await.unwrap();
        let mut counts = StateCounts::default();
        counts.add(State::InProgress, 1);
        counts.add(State::Parked, 1);
        assert_eq!(stats.states, counts);
        // Never run again by itself: a begin is told it is parked (another body: key reuse).
        for policy in [POLICY, POLICY.expired_lease(ExpiredLease::FailClosed)] {
            assert_eq!(
                store
                    .begin(req("park", &k, &fp("a"), &policy))
                    .await
                    .unwrap(),
                BeginOutcome::Parked
            );
        }
        assert_eq!(
            store
                .begin(req("park", &k, &fp("b"), &POLICY))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        );
        env.wait(Duration::from_millis(100)).await;
        assert!(due_in(env, "park", 10).await.is_empty(), "never due again");
        // Parked once: parking again, or any write under its fence, changes nothing.
        let again = store.park(claim("park", &k, u.fence), "twice").await;
        assert!(matches!(again, Err(Error::FenceLost { .. })), "{again:?}");
        let late = store
            .complete(
                claim("park", &k, u.fence),
                &StoredResponse::ok(&b"late"[..]),
            )
            .await;
        assert!(matches!(late, Err(Error::FenceLost { .. })), "{late:?}");
        let info = store.inspect("park", k.as_str()).await.unwrap().unwrap();
        assert_eq!(info.note.as_deref(), Some("the bank kept timing out"));
        // An operator may release it instead of retrying it: the fence moves on, and the
        // request's retry runs as its next attempt.
        let done = store.force_release("park", k.as_str()).await.unwrap();
        let ForcedRelease::Released { fence } = done else {
            panic!("parked work is released: {done:?}")
        };
        assert!(fence > u.fence);
        let retry = begin_claimed(env, req("park", &k, &fp("a"), &POLICY)).await;
        assert!(retry.fence > fence);
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// The operator's retry of parked work: in progress again with its lease run out, due at
    /// once with its attempts counted afresh and its note kept, and taken over by the next
    /// claim.
    pub async fn retry_makes_parked_work_due_again<S: Store + Clone>(env: &Env<S>) {
        let store = env.store();
        let k = key("k-retry");
        assert_eq!(
            store.retry("retry", k.as_str()).await.unwrap(),
            Retried::NotFound
        );
        let u = due_claim(env, "retry", &k).await;
        assert_eq!(
            store.retry("retry", k.as_str()).await.unwrap(),
            Retried::NotParked(State::InProgress)
        );
        store
            .park(claim("retry", &k, u.fence), "gave up")
            .await
            .unwrap();
        assert_eq!(
            store.retry("retry", k.as_str()).await.unwrap(),
            Retried::Retried { fence: u.fence }
        );
        let info = store.inspect("retry", k.as_str()).await.unwrap().unwrap();
        assert_eq!((info.state, info.attempt), (State::InProgress, 1));
        assert_eq!(info.note.as_deref(), Some("gave up"));
        assert!(
            info.lease_remaining.is_some_and(|l| l.is_zero()),
            "{info:?}"
        );
        env.wait(Duration::from_millis(20)).await;
        let due = due_in(env, "retry", 10).await;
        assert_eq!(keys(&due), ["k-retry"], "due again at once");
        assert_eq!((due[0].fence, due[0].attempt), (u.fence, 1));
        assert_eq!(due[0].request, u.request);
        // Retried once: a second retry finds it not parked.
        assert_eq!(
            store.retry("retry", k.as_str()).await.unwrap(),
            Retried::NotParked(State::InProgress)
        );
        // The completer's claim takes it over as the next attempt and finishes it.
        let c = begin_claimed(env, req("retry", &k, &fp("a"), &POLICY)).await;
        assert_eq!((c.fence, c.attempt, c.reclaimed), (u.fence + 1, 2, true));
        complete_ok(
            env,
            claim("retry", &k, c.fence),
            &StoredResponse::ok(&b"done"[..]),
        )
        .await;
        assert!(due_in(env, "retry", 10).await.is_empty());
        match store
            .begin(req("retry", &k, &fp("a"), &POLICY))
            .await
            .unwrap()
        {
            BeginOutcome::Replay(r) => assert_eq!(&r.body[..], b"done"),
            other => panic!("the finished work is replayed: {other:?}"),
        }
        assert_eq!(
            store.retry("retry", k.as_str()).await.unwrap(),
            Retried::NotParked(State::Completed)
        );
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// Records that hold unfinished work are listed from their own index, oldest first, all of
    /// them; any other listing examines at most [`RecordQuery::examine`] records and says when
    /// it stopped before the end or at its limit; the counts of a small store cover it whole
    /// and say so (see [Bounded reads](crate::store::admin#bounded-reads)).
    pub async fn listings_and_counts_read_a_bounded_number_of_records<S: Store + Clone>(
        env: &Env<S>,
    ) {
        let store = env.store();
        for i in 0..4 {
            let k = key(&format!("k-plain-{i}"));
            let c = begin_claimed(env, req("plain", &k, &fp("a"), &POLICY)).await;
            complete_ok(
                env,
                claim("plain", &k, c.fence),
                &StoredResponse::ok(vec![]),
            )
            .await;
        }
        // An outcome that may have had its effect, with no request stored: only its retry or
        // an operator finishes it. Then work parked by the completer.
        let unknown = key("k-unknown");
        let u = begin_claimed(env, req("work", &unknown, &fp("a"), &POLICY)).await;
        store
            .suspend(
                claim("work", &unknown, u.fence),
                "no answer",
                Duration::ZERO,
            )
            .await
            .unwrap();
        env.wait(Duration::from_millis(5)).await;
        let parked = key("k-parked");
        let p = due_claim(env, "work", &parked).await;
        store
            .park(claim("work", &parked, p.fence), "gave up")
            .await
            .unwrap();

        let keys = |listed: &Listing| {
            listed
                .records
                .iter()
                .map(|r| r.key.clone())
                .collect::<Vec<_>>()
        };
        let work = store
            .listing(&RecordQuery::new().holding_work(true))
            .await
            .unwrap();
        assert_eq!(keys(&work), ["k-unknown", "k-parked"], "oldest first");
        assert!(work.complete);
        for (query, expected) in [
            (RecordQuery::new().state(State::Parked), "k-parked"),
            (
                RecordQuery::new()
                    .holding_work(true)
                    .state(State::InProgress),
                "k-unknown",
            ),
            (
                RecordQuery::new().holding_work(true).scope_prefix("wo"),
                "k-unknown",
            ),
        ] {
            let query = query.limit(1);
            let listed = store.listing(&query).await.unwrap();
            assert_eq!(keys(&listed), [expected], "{query:?}");
            assert!(!listed.complete, "its limit was reached: {query:?}");
        }

        let all = store.listing(&RecordQuery::new()).await.unwrap();
        assert_eq!(all.records.len(), 6);
        assert!(all.complete);
        let few = store.listing(&RecordQuery::new().examine(3)).await.unwrap();
        assert_eq!(few.records.len(), 3, "only the records examined");
        assert!(!few.complete, "three of six were examined");
        let none = store
            .listing(&RecordQuery::new().state(State::Released).examine(3))
            .await
            .unwrap();
        assert!(none.records.is_empty());
        assert!(!none.complete, "none of three passed, and three were left");
        let released = store
            .listing(&RecordQuery::new().state(State::Released))
            .await
            .unwrap();
        assert!(released.records.is_empty());
        assert!(released.complete, "none of all six passed");

        let stats = store.stats(Duration::from_secs(3600)).await.unwrap();
        assert!(stats.complete, "{stats:?}");
        assert_eq!(stats.counted, 6, "{stats:?}");
        let mut counts = StateCounts::default();
        counts.add(State::Completed, 4);
        counts.add(State::InProgress, 1);
        counts.add(State::Parked, 1);
        assert_eq!(stats.states, counts);
        assert_eq!(
            stats.unfinished, 1,
            "the suspended claim; the parked one is not in progress"
        );
        assert!(stats.oldest_unfinished.is_some());
    }

    /// See [`conformance_tests!`](crate::conformance_tests).
    ///
    /// Records that hold unfinished work (a resumable claim in progress, a suspended claim with
    /// or without its request, parked work) are kept past their retention, and neither purged
    /// nor freed for a new claim; finished records go when theirs ends, including one finished
    /// after its retention ended.
    pub async fn unfinished_work_outlives_its_retention_and_finished_work_does_not<
        S: Store + Clone,
    >(
        env: &Env<S>,
    ) {
        let store = env.store();
        let short = POLICY
            .lease(Duration::from_millis(300))
            .retain(Duration::from_millis(300));
        let f = fp("a");
        let request = stored_request("ORD-9");
        let names = [
            "k-keep-running",
            "k-keep-suspended",
            "k-keep-unknown",
            "k-keep-parked",
            "k-keep-late",
            "k-go-resumable",
            "k-go-plain",
        ];
        let ks = names.map(key);
        let mut fences = Vec::new();
        for (i, k) in ks.iter().enumerate() {
            let r = req("keep", k, &f, &short);
            // Every one stores its request but the suspended claim of unknown outcome and the
            // plain one.
            let r = if matches!(i, 2 | 6) {
                r
            } else {
                r.resumable(&request)
            };
            fences.push(begin_claimed(env, r).await.fence);
        }
        for i in [1, 2] {
            store
                .suspend(claim("keep", &ks[i], fences[i]), "unknown", Duration::ZERO)
                .await
                .unwrap();
        }
        for i in [5, 6] {
            complete_ok(
                env,
                claim("keep", &ks[i], fences[i]),
                &StoredResponse::ok(vec![]),
            )
            .await;
        }
        env.wait(Duration::from_millis(450)).await;
        store
            .park(claim("keep", &ks[3], fences[3]), "gave up")
            .await
            .unwrap();
        let expired = if env.expires_by_itself { 0 } else { 2 };
        assert_eq!(store.purge_expired().await.unwrap(), expired);
        for (i, k) in ks.iter().enumerate().take(5) {
            let info = store.inspect("keep", k.as_str()).await.unwrap();
            let info = info.unwrap_or_else(|| panic!("{}: unfinished work is kept", names[i]));
            assert!(info.holds_work(), "{info:?}");
            assert!(store.lookup("keep", k.as_str()).await.unwrap().is_some());
        }
        for k in &ks[5..] {
            assert!(store.lookup("keep", k.as_str()).await.unwrap().is_none());
            assert!(store.inspect("keep", k.as_str()).await.unwrap().is_none());
        }
        // Still the same request's: another body is key reuse, its retry continues it.
        assert_eq!(
            store
                .begin(req("keep", &ks[0], &fp("b"), &short))
                .await
                .unwrap(),
            BeginOutcome::KeyReused
        );
        let resumed = begin_claimed(env, req("keep", &ks[2], &f, &short)).await;
        assert_eq!((resumed.attempt, resumed.reclaimed), (2, true));
        // (In any order: which of a suspended claim and a lease run out is due longer depends on
        // how a store reads "due longest".)
        let mut due = keys(&due_in(env, "keep", 10).await)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        due.sort();
        assert_eq!(due, ["k-keep-late", "k-keep-running", "k-keep-suspended"]);
        // Finished after its retention ended: it goes.
        complete_ok(
            env,
            claim("keep", &ks[4], fences[4]),
            &StoredResponse::ok(vec![]),
        )
        .await;
        let expired = if env.expires_by_itself { 0 } else { 1 };
        assert_eq!(store.purge_expired().await.unwrap(), expired);
        assert!(
            store
                .lookup("keep", ks[4].as_str())
                .await
                .unwrap()
                .is_none()
        );
        let left = due_in(env, "keep", 10).await;
        let mut due = keys(&left);
        due.sort();
        assert_eq!(due, ["k-keep-running", "k-keep-suspended"]);
    }
}

/// The cases every transactional store passes.
#[cfg(feature = "sql")]
pub mod tx_cases {
    use std::future::Future;
    use std::time::Duration;

    use super::Env;
    use super::cases::{POLICY, claim, claimed, fp, key, req};
    use crate::{BeginOutcome, StoredResponse, TxStore};

    /// A business table beside the records, for the transactional cases: the body's own SQL, which
    /// must commit and roll back together with the claim. Implemented here for [`SqliteStore`],
    /// [`PgStore`] and `MySqlStore`; a transactional store of your own implements it on its
    /// database.
    ///
    /// [`SqliteStore`]: crate::SqliteStore
    /// [`PgStore`]: crate::PgStore
    pub trait TxFixture: TxStore + Clone {
        /// Creates the table `biz (order_no text NOT NULL UNIQUE)`.
        fn create_biz(&self) -> impl Future<Output = ()> + Send;
        /// Inserts `order_no` inside `tx`.
        fn insert_biz(
            &self,
            tx: &mut sqlx::Transaction<'static, Self::Database>,
            order_no: &str,
        ) -> impl Future<Output = ()> + Send;
        /// How many committed rows hold `order_no`, read outside any open transaction.
        fn count_biz(&self, order_no: &str) -> impl Future<Output = i64> + Send;
    }

    /// The fixture for a store of this crate: `$read` is the pool that reads while a
    /// transaction may hold the writer.
    macro_rules! tx_fixture {
        ($feature:literal, $store:ty, $db:ty, $read:ident) => {
            #[cfg(feature = $feature)]
            impl TxFixture for $store {
                async fn create_biz(&self) {
                    sqlx::query("CREATE TABLE biz (order_no TEXT NOT NULL UNIQUE)")
                        .execute(self.pool())
                        .await
                        .unwrap();
                }
                async fn insert_biz(&self, tx: &mut sqlx::Transaction<'static, $db>, n: &str) {
                    sqlx::query("INSERT INTO biz (order_no) VALUES ($1)")
                        .bind(n)
                        .execute(&mut **tx)
                        .await
                        .unwrap();
                }
                async fn count_biz(&self, n: &str) -> i64 {
                    sqlx::query_scalar("SELECT count(*) FROM biz WHERE order_no = $1")
                        .bind(n)
                        .fetch_one(self.$read())
                        .await
                        .unwrap()
                }
            }
        };
    }

    tx_fixture!("sqlite", crate::SqliteStore, sqlx::Sqlite, reader_pool);
    tx_fixture!("postgres", crate::PgStore, sqlx::Postgres, pool);

    // MySQL numbers no placeholders, and indexes a text only by a prefix.
    #[cfg(feature = "mysql")]
    impl TxFixture for crate::MySqlStore {
        async fn create_biz(&self) {
            sqlx::query("CREATE TABLE biz (order_no VARCHAR(255) NOT NULL UNIQUE)")
                .execute(self.pool())
                .await
                .unwrap();
        }
        async fn insert_biz(&self, tx: &mut sqlx::Transaction<'static, sqlx::MySql>, n: &str) {
            sqlx::query("INSERT INTO biz (order_no) VALUES (?)")
                .bind(n)
                .execute(&mut **tx)
                .await
                .unwrap();
        }
        async fn count_biz(&self, n: &str) -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM biz WHERE order_no = ?")
                .bind(n)
                .fetch_one(self.pool())
                .await
                .unwrap()
        }
    }

    type Tx<S> = sqlx::Transaction<'static, <S as TxStore>::Database>;

    /// Opens a transaction on `store` and claims key `k` in it.
    async fn claim_in_tx<S: TxFixture>(store: &S, k: &str) -> (Tx<S>, crate::Claimed) {
        let (k, f) = (key(k), fp("a"));
        let mut tx = store.begin_transaction().await.unwrap();
        let c = claimed(
            store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap(),
        );
        (tx, c)
    }

    /// Writes the business row `order_no` and completes the claim on `k` with it, in `tx`.
    async fn effect_and_complete<S: TxFixture>(
        store: &S,
        tx: &mut Tx<S>,
        k: &str,
        c: &crate::Claimed,
        order_no: &str,
    ) {
        store.insert_biz(tx, order_no).await;
        let k = key(k);
        store
            .complete_in(
                tx,
                claim("s", &k, c.fence),
                &StoredResponse::ok(order_no.as_bytes().to_vec()),
            )
            .await
            .unwrap();
    }

    /// A concurrent duplicate on `k`, in a transaction of its own that commits or rolls back:
    /// what its claim answered.
    fn duplicate<S: TxFixture>(
        store: &S,
        k: &'static str,
        commit: bool,
    ) -> tokio::task::JoinHandle<BeginOutcome> {
        let store = store.clone();
        tokio::spawn(async move {
            let (k, f) = (key(k), fp("a"));
            let mut tx = store.begin_transaction().await.unwrap();
            let outcome = store
                .begin_in(&mut tx, req("s", &k, &f, &POLICY))
                .await
                .unwrap();
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            outcome
        })
    }

    fn replayed(outcome: BeginOutcome) -> bytes::Bytes {
        match outcome {
            BeginOutcome::Replay(r) => r.body,
            other => panic!("expected a replay, got {other:?}"),
        }
    }

    /// See [`tx_conformance_tests!`](crate::tx_conformance_tests).
    pub async fn tx_commit_makes_both_durable<S: TxFixture>(env: &Env<S>) {
        let store = env.store();
        store.create_biz().await;
        let (mut tx, c) = claim_in_tx(store, "k-tx-commit").await;
        effect_and_complete(store, &mut tx, "k-tx-commit", &c, "A1").await;
        // Nothing is visible before the commit.
        assert_eq!(store.count_biz("A1").await, 0);
        tx.commit().await.unwrap();
        assert_eq!(store.count_biz("A1").await, 1);
        let (k, f) = (key("k-tx-commit"), fp("a"));
        let again = store.begin(req("s", &k, &f, &POLICY)).await.unwrap();
        assert_eq!(replayed(again), &b"A1"[..]);
    }

    /// See [`tx_conformance_tests!`](crate::tx_conformance_tests).
    pub async fn tx_rollback_leaves_nothing<S: TxFixture>(env: &Env<S>) {
        let store = env.store();
        store.create_biz().await;
        let (mut tx, c) = claim_in_tx(store, "k-tx-rollback").await;
        effect_and_complete(store, &mut tx, "k-tx-rollback", &c, "B1").await;
        tx.rollback().await.unwrap();
        assert_eq!(store.count_biz("B1").await, 0);
        assert!(store.lookup("s", "k-tx-rollback").await.unwrap().is_none());
        // The identity is free: the retry claims it afresh.
        let (k, f) = (key("k-tx-rollback"), fp("a"));
        claimed(store.begin(req("s", &k, &f, &POLICY)).await.unwrap());
    }

    /// See [`tx_conformance_tests!`](crate::tx_conformance_tests).
    pub async fn tx_duplicate_waits_then_replays<S: TxFixture>(env: &Env<S>) {
        let store = env.store();
        store.create_biz().await;
        let (mut tx, c) = claim_in_tx(store, "k-tx-dup").await;
        let duplicate = duplicate(store, "k-tx-dup", true);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !duplicate.is_finished(),
            "the duplicate must wait for the first transaction"
        );
        effect_and_complete(store, &mut tx, "k-tx-dup", &c, "C1").await;
        tx.commit().await.unwrap();
        assert_eq!(replayed(duplicate.await.unwrap()), &b"C1"[..]);
        assert_eq!(store.count_biz("C1").await, 1);
    }

    /// See [`tx_conformance_tests!`](crate::tx_conformance_tests).
    pub async fn tx_duplicate_claims_after_rollback<S: TxFixture>(env: &Env<S>) {
        let store = env.store();
        store.create_biz().await;
        let (tx, _) = claim_in_tx(store, "k-tx-dup-rb").await;
        let duplicate = duplicate(store, "k-tx-dup-rb", false);
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.rollback().await.unwrap();
        assert!(matches!(duplicate.await.unwrap(), BeginOutcome::Claimed(_)));
    }
}
