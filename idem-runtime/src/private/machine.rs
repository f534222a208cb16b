//! The shims of the state-machine and SQL macros that need no driver: the compile-time checks
//! of states, edges, rows and versions against what the user wrote, and their errors.

use std::marker::PhantomData;

use crate::error::Error;
use crate::transition::{StateMachine, StateValue};

/// How a generated statement function turns an [`Error`] into its own error type.
pub fn into_error<E: From<Error>>() -> fn(Error) -> E {
    E::from
}

/// The row type written in the return type, against `returning`.
#[diagnostic::on_unimplemented(
    message = "the return type reads rows as `{Self}`, but `returning = {R}`",
    label = "not the `returning` type",
    note = "the statement's rows are read into one type: name the same one in `returning` and in the return type"
)]
pub trait SameRow<R> {
    type Row;
}

impl<R> SameRow<R> for R {
    type Row = R;
}

/// The row type, when the return type's is `returning`'s.
pub fn same_row<T: SameRow<R>, R>() -> PhantomData<T::Row> {
    PhantomData
}

/// The state type written in `Transition<_, S>`, against `machine = M`.
#[diagnostic::on_unimplemented(
    message = "`Transition<_, {Self}>` names a state type other than `machine = {M}`",
    label = "not the machine's state type",
    note = "a state read from the column is parsed into the machine's enum: write `Transition<_, {M}>`, or `Transition<_, String>` for the column's text"
)]
pub trait StateOf<M> {
    type State;
}

impl<M: StateMachine> StateOf<M> for M {
    type State = M;
}

impl<M> StateOf<M> for String {
    type State = String;
}

pub fn state_of<S: StateOf<M>, M>() -> PhantomData<S::State> {
    PhantomData
}

/// The state type written in `Transition<_, S>` of a transition without `machine = …`.
#[diagnostic::on_unimplemented(
    message = "`Transition<_, {Self}>` needs `machine = {Self}` in the attribute",
    label = "a state type other than the column's text",
    note = "with `machine = {Self}`, `from` and `to` are checked against the machine at compile time; without one, a state is the column's text: `Transition<_, String>`"
)]
pub trait TextState {
    type State;
}

impl TextState for String {
    type State = String;
}

pub fn text_state<S: TextState>() -> PhantomData<S::State> {
    PhantomData
}

/// The state column's text, parsed into the checked state type.
pub fn state_value<S: StateValue>(_state: &PhantomData<S>, text: String) -> Result<S, Error> {
    S::from_column(text)
}

/// The argument holding the version an optimistic update expects.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot hold a row version",
    label = "the version that was read",
    note = "a version is an `i64` (an `i32` or `i16` is widened): the statement compares it, bumps it and returns the new one"
)]
pub trait VersionValue {
    fn get(&self) -> i64;
}

macro_rules! version_value {
    ($($t:ty),*) => {$(
        impl VersionValue for $t {
            fn get(&self) -> i64 {
                i64::from(*self)
            }
        }

        impl VersionValue for &$t {
            fn get(&self) -> i64 {
                i64::from(**self)
            }
        }
    )*};
}

version_value!(i64, i32, i16);

pub fn version<T: VersionValue>(v: &T) -> i64 {
    v.get()
}

/// The states and edges of a `state_machine!`, as their column texts, for the compile-time
/// checks of `#[state_transition(machine = …)]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a state machine",
    label = "`machine` names a type declared with `idem::state_machine!`",
    note = "declare the states and edges once with `idem::state_machine! {{ pub enum {Self} {{ … }} … }}`"
)]
pub trait MachineTexts {
    const MACHINE: MachineText;
}

/// A machine's states and edges, as column texts.
#[derive(Debug, Clone, Copy)]
pub struct MachineText {
    pub states: &'static [&'static str],
    pub edges: &'static [(&'static str, &'static str)],
}

/// A row kept changing under every attempt.
pub fn contention(table: &str) -> Error {
    Error::Unavailable(format!("a row of {table} kept changing under every attempt").into())
}

pub fn unknown_state(machine: &str, text: &str) -> Error {
    Error::Decode(format!("{text:?} is not a state of {machine}"))
}

pub const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

pub const fn const_str_in(text: &str, all: &[&str]) -> bool {
    let mut i = 0;
    while i < all.len() {
        if const_str_eq(text, all[i]) {
            return true;
        }
        i += 1;
    }
    false
}

pub const fn const_edge_in(from: &str, to: &str, edges: &[(&str, &str)]) -> bool {
    let mut i = 0;
    while i < edges.len() {
        if const_str_eq(from, edges[i].0) && const_str_eq(to, edges[i].1) {
            return true;
        }
        i += 1;
    }
    false
}

/// The first of `states` not in `allowed`, or `""`: for the compile-time check that every
/// state of a machine is a value its column allows.
pub const fn first_not_in(states: &[&'static str], allowed: &[&str]) -> &'static str {
    let mut i = 0;
    while i < states.len() {
        if !const_str_in(states[i], allowed) {
            return states[i];
        }
        i += 1;
    }
    ""
}

/// The length of `parts` joined.
pub const fn concat_len(parts: &[&str]) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < parts.len() {
        n += parts[i].len();
        i += 1;
    }
    n
}

/// `parts` joined, as bytes: a compile-time message built from constants.
pub const fn concat<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut out = [0u8; N];
    let (mut i, mut at) = (0, 0);
    while i < parts.len() {
        let bytes = parts[i].as_bytes();
        let mut j = 0;
        while j < bytes.len() && at < N {
            out[at] = bytes[j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    out
}

/// The text of bytes joined from `&str`s.
pub const fn utf8(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(_) => "",
    }
}
