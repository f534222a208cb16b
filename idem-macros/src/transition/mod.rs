//! `#[state_transition]`: the guarded `UPDATE` of a state machine, and the classification of
//! what happened when it did not apply. Checked ([`valid`]), then expanded ([`expand`]).

mod expand;
mod valid;

use crate::attr::Grammar;
use crate::sql::ret::Outcome;
use crate::sql::{Required, Steps};

pub(crate) const STEPS: Steps<valid::Model> = Steps {
    attr: "state_transition",
    grammar: Grammar {
        site: "#[state_transition]",
        args: &[
            ("table", "\"orders\""),
            ("key", "\"order_no\""),
            ("state", "\"status\""),
            ("from", "\"PENDING\""),
            ("to", "\"PAID\""),
            ("guard", "\"amount_cents\""),
            ("owner", "\"refund_request\""),
            ("set", "\"paid_at = now()\""),
            ("returning", "Order"),
            ("machine", "OrderStatus"),
            ("crate", "\"::idem\""),
            ("migrations", "\"../migrations\""),
        ],
    },
    required: Required {
        args: &[
            ("table", "table = \"orders\""),
            ("key", "key = \"order_no\""),
            ("from", "from = \"PENDING\""),
            ("to", "to = \"PAID\""),
        ],
        missing: |name, example| {
            format!(
                "missing `{name}`: #[state_transition] needs `table`, `key`, `from` and `to`, e.g. `{example}`"
            )
        },
    },
    outcome: Outcome {
        name: "Transition",
        example: "Result<Transition<Order, OrderStatus>, idem::Error>",
    },
    validate: valid::validate,
    expand: expand::expand,
};
