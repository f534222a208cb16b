//! "Did you mean …?": the nearest name among candidates.

/// The candidate nearest to `name`, ignoring case, if it is near enough to be a likely typo:
/// at most one edit per three characters (at least one), as rustc's own suggestions allow.
/// Among equally near candidates the one sharing the longest beginning with `name` wins (a typo
/// is more often at the end: `REFUNDING` means `REFUNDED`, not `PENDING`), then the first, so
/// the answer is stable.
pub fn nearest<'a, I>(name: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let wanted: Vec<char> = name.to_lowercase().chars().collect();
    let limit = (wanted.len().max(3) / 3).max(1);
    let mut best: Option<((usize, std::cmp::Reverse<usize>), &'a str)> = None;
    for candidate in candidates {
        let have: Vec<char> = candidate.to_lowercase().chars().collect();
        // Lengths alone bound the distance from below; skip what cannot be near.
        if have.len().abs_diff(wanted.len()) > limit {
            continue;
        }
        let d = distance(&wanted, &have);
        let shared = wanted.iter().zip(&have).take_while(|(a, b)| a == b).count();
        let rank = (d, std::cmp::Reverse(shared));
        if d <= limit && best.is_none_or(|(b, _)| rank < b) {
            best = Some((rank, candidate));
        }
    }
    best.map(|(_, c)| c)
}

/// Edit distance with adjacent transpositions (optimal string alignment): `amuont` is one edit
/// from `amount`, as a typist would count it.
fn distance(a: &[char], b: &[char]) -> usize {
    let width = b.len() + 1;
    let mut rows = vec![0usize; (a.len() + 1) * width];
    let at = |i: usize, j: usize| i * width + j;
    for i in 0..=a.len() {
        rows[at(i, 0)] = i;
    }
    for j in 0..=b.len() {
        rows[at(0, j)] = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[at(i - 1, j)] + 1)
                .min(rows[at(i, j - 1)] + 1)
                .min(rows[at(i - 1, j - 1)] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[at(i - 2, j - 2)] + 1);
            }
            rows[at(i, j)] = d;
        }
    }
    rows[at(a.len(), b.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLUMNS: &[&str] = &[
        "order_no",
        "status",
        "amount_cents",
        "paid_at",
        "created_at",
    ];

    #[test]
    fn suggests_the_column_one_typo_away() {
        assert_eq!(
            nearest("amount_cent", COLUMNS.iter().copied()),
            Some("amount_cents")
        );
        assert_eq!(nearest("stauts", COLUMNS.iter().copied()), Some("status"));
        assert_eq!(
            nearest("order_number", COLUMNS.iter().copied()),
            None,
            "four edits from `order_no` is not a typo"
        );
    }

    #[test]
    fn a_tie_goes_to_the_shared_beginning() {
        let states = ["PENDING", "PAID", "REFUNDED"];
        assert_eq!(
            nearest("REFUNDING", states.iter().copied()),
            Some("REFUNDED")
        );
    }

    #[test]
    fn ignores_case() {
        assert_eq!(nearest("Status", COLUMNS.iter().copied()), Some("status"));
        assert_eq!(nearest("PAID_AT", COLUMNS.iter().copied()), Some("paid_at"));
    }

    #[test]
    fn suggests_nothing_unrelated() {
        assert_eq!(nearest("customer", COLUMNS.iter().copied()), None);
        assert_eq!(nearest("id", COLUMNS.iter().copied()), None);
        assert_eq!(nearest("x", std::iter::empty()), None);
    }

    #[test]
    fn prefers_the_nearest_then_the_first() {
        let names = ["paid_on", "paid_at", "paid_ot"];
        assert_eq!(nearest("paid_at", names.iter().copied()), Some("paid_at"));
        assert_eq!(nearest("paid_ox", names.iter().copied()), Some("paid_on"));
    }

    #[test]
    fn counts_a_transposition_as_one_edit() {
        let a: Vec<char> = "amuont".chars().collect();
        let b: Vec<char> = "amount".chars().collect();
        assert_eq!(distance(&a, &b), 1);
        let c: Vec<char> = "kitten".chars().collect();
        let d: Vec<char> = "sitting".chars().collect();
        assert_eq!(distance(&c, &d), 3);
    }
}
