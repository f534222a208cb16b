//! `#[create_once]`: insert by a unique business number, or return the row that already has
//! it. Checked ([`valid`]), then expanded ([`expand`]).

mod expand;
mod valid;

use crate::attr::Grammar;
use crate::sql::ret::Outcome;
use crate::sql::{Required, Steps};

pub(crate) const STEPS: Steps<valid::Model> = Steps {
    attr: "create_once",
    grammar: Grammar {
        site: "#[create_once]",
        args: &[
            ("table", "\"orders\""),
            ("unique", "\"order_no\""),
            ("returning", "Order"),
            ("crate", "\"::idem\""),
            ("migrations", "\"../migrations\""),
        ],
    },
    required: Required {
        args: &[
            ("table", "table = \"orders\""),
            ("unique", "unique = \"order_no\""),
            ("returning", "returning = Order"),
        ],
        missing: |name, example| format!("missing `{name}` in #[create_once], e.g. `{example}`"),
    },
    outcome: Outcome {
        name: "Created",
        example: "Result<Created<Order>, idem::Error>",
    },
    validate: valid::validate,
    expand: expand::expand,
};
