// The path in `crate = "…"` is the one generated code uses: a path that does not exist is
// reported on the string.

mod deps {}

pub struct User {
    pub id: u64,
}

fn main() {
    let user = User { id: 7 };
    let _ = idem::scope!("order:<user.id>", crate = "crate::deps::idem");
}
