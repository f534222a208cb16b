mod deps {}

idem::state_machine! {
    #[idem(crate = "crate::deps::idem")]
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
    }
    Pending -> Paid;
}

fn main() {}
