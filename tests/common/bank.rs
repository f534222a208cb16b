//! A payment gateway for consumer tests: it deduplicates by the caller's downstream key, and
//! loses its answers until it is fixed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use idem::ClaimInfo;
use idem::consumer::HandlerError;

/// A bank that deduplicates by the caller's key, as payment gateways do; its answers are lost
/// until it is fixed.
#[derive(Default)]
pub struct LossyBank {
    /// Money moved, by downstream key.
    moved: Mutex<HashMap<String, u32>>,
    /// Calls of the handler's guarded body.
    runs: AtomicUsize,
    /// Whether its answers reach the caller.
    fixed: AtomicBool,
}

impl LossyBank {
    /// Pays under `claim`: the money moves once per downstream key; the answer is lost while
    /// the bank is broken, and the outcome is then unknown.
    pub fn pay(&self, claim: &ClaimInfo, payload: &[u8]) -> Result<String, HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        *self
            .moved
            .lock()
            .unwrap()
            .entry(claim.downstream_key("bank"))
            .or_default() = 1;
        if !self.fixed.load(Ordering::SeqCst) {
            claim.outcome_unknown("the bank's answer was lost");
            return Err(HandlerError::transient("the bank's answer was lost"));
        }
        Ok(format!(
            "paid {} on attempt {}",
            String::from_utf8_lossy(payload),
            claim.attempt()
        ))
    }

    /// From now on its answers reach the caller.
    pub fn fix(&self) {
        self.fixed.store(true, Ordering::SeqCst);
    }

    /// Payments made, one per downstream key.
    pub fn moves(&self) -> u32 {
        self.moved.lock().unwrap().values().sum()
    }

    /// Calls of [`LossyBank::pay`].
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}
