//! HTTP integration for axum (feature `axum`).

use std::cell::RefCell;

use crate::record::StoredResponse;

tokio::task_local! {
    /// Set by the replay layer around a request; a replay leaves its stored response here.
    static REPLAYED: RefCell<Option<StoredResponse>>;
}

pub(crate) fn note_replay(stored: &StoredResponse) {
    let _ = REPLAYED.try_with(|slot| *slot.borrow_mut() = Some(stored.clone()));
}
