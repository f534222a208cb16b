idem::state_machine! {
    pub enum OrderStatus {
        Pending = "PENDING",
        Paid = "PAID",
    }
    Pending -> Paid -> Refunded;
}

fn main() {}
