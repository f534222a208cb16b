//! The guide: idem from the first guarded handler to operating it in production.
//!
//! The crate's front page and the README show the two commands, how to add idem and one guarded
//! handler. These chapters hold the rest, in the order a newcomer needs it; every code block in
//! them is compiled as a doctest, and the walkthrough's commands are run as written by a test
//! that compares every byte of their answers.
//!
//! 1. [Guarantees, layer by layer](defence): the migrations checked at compile time, the key's
//!    record, the state machine's guarded `UPDATE`, fencing, the transactional mode, and
//!    duplicates that wait for the first answer.
//! 2. [Work nobody came back for](completer): unknown outcomes, resumable calls, the completer.
//! 3. [Any `http` service, and its clients](http): the `tower` guard and `idem::client`.
//! 4. [Messages](messages): JetStream and RabbitMQ consumers, dead letters, the outbox.
//! 5. [Walkthrough](walkthrough): the refund service, request by request.
//! 6. [Stores and retention](stores): which store to choose, and how long records live.
//! 7. [Operating it](operating): the `idem` tool, the admin view, metrics.
//! 8. [Details](details): every guarantee with the test or benchmark behind it.

pub mod defence {
    #![doc = include_str!("guide/defence.md")]
}

pub mod completer {
    #![doc = include_str!("guide/completer.md")]
}

pub mod http {
    #![doc = include_str!("guide/http.md")]
}

pub mod messages {
    #![doc = include_str!("guide/messages.md")]
}

pub mod walkthrough {
    #![doc = include_str!("guide/walkthrough.md")]
}

pub mod stores {
    #![doc = include_str!("guide/stores.md")]
}

pub mod operating {
    #![doc = include_str!("guide/operating.md")]
}

pub mod details {
    #![doc = include_str!("guide/details.md")]
}
