//! `#[versioned_update]`: optimistic locking. The `UPDATE` applies only while the row still
//! has the version that was read, and bumps it. Checked ([`valid`]), then expanded
//! ([`expand`]).

mod expand;
mod valid;

use crate::attr::Grammar;
use crate::sql::ret::Outcome;
use crate::sql::{Required, Steps};

pub(crate) const STEPS: Steps<valid::Model> = Steps {
    attr: "versioned_update",
    grammar: Grammar {
        site: "#[versioned_update]",
        args: &[
            ("table", "\"orders\""),
            ("key", "\"user_id\""),
            ("version", "\"version\""),
            ("set", "\"nickname\""),
            ("crate", "\"::idem\""),
            ("migrations", "\"../migrations\""),
        ],
    },
    required: Required {
        args: &[
            ("table", "table = \"user_profile\""),
            ("key", "key = \"user_id\""),
            ("set", "set = \"nickname\""),
        ],
        missing: |name, example| {
            format!("missing `{name}` in #[versioned_update], e.g. `{example}`")
        },
    },
    outcome: Outcome {
        name: "Versioned",
        example: "Result<Versioned, idem::Error>",
    },
    validate: valid::validate,
    expand: expand::expand,
};
