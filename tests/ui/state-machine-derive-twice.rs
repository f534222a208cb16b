idem::state_machine! {
    #[derive(Debug, Clone, PartialOrd)]
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
    }
    Pending -> Paid;
}

fn main() {}
