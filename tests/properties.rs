//! Property tests: scopes are injective, fingerprints do not depend on map order.

use std::collections::{BTreeMap, HashMap};

use idem::{Fingerprint, ScopeBuilder};
use proptest::prelude::*;

/// Splits a rendered `order:<a>:<b>` scope back into its values. Its existence for every
/// input is what makes the encoding injective.
fn parse(scope: &str) -> (String, String) {
    let rest = scope.strip_prefix("order:").expect("prefix");
    let (a, b) = rest.split_once(':').expect("delimiter");
    (decode(a), decode(b))
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).expect("hex"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("utf-8")
}

fn render(a: &str, b: &str) -> String {
    let mut s = ScopeBuilder::new();
    s.literal("order:").value(a).literal(":").value(b);
    s.finish().unwrap()
}

/// Strings rich in the characters that break naive encodings.
fn tricky() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just(':'),
            Just('%'),
            Just('3'),
            Just('A'),
            Just('/'),
            Just('é'),
            Just(' '),
            any::<char>()
        ],
        0..12,
    )
    .prop_map(|v| v.into_iter().collect())
}

proptest! {
    #[test]
    fn scope_encoding_round_trips(a in tricky(), b in tricky()) {
        prop_assert_eq!(parse(&render(&a, &b)), (a, b));
    }

    #[test]
    fn distinct_values_give_distinct_scopes(a1 in tricky(), b1 in tricky(), a2 in tricky(), b2 in tricky()) {
        prop_assume!((&a1, &b1) != (&a2, &b2));
        prop_assert_ne!(render(&a1, &b1), render(&a2, &b2));
    }

    #[test]
    fn colon_splits_never_collide(s in tricky(), i in 0usize..12, j in 0usize..12) {
        // The same characters split at two different places: naive "a:b" joins collide here.
        let chars: Vec<char> = s.chars().collect();
        let (i, j) = (i.min(chars.len()), j.min(chars.len()));
        prop_assume!(i != j);
        let split = |k: usize| -> (String, String) {
            (chars[..k].iter().collect(), chars[k..].iter().collect())
        };
        let (a1, b1) = split(i);
        let (a2, b2) = split(j);
        prop_assert_ne!(render(&a1, &b1), render(&a2, &b2));
    }

    #[test]
    fn fingerprint_ignores_map_order(entries in proptest::collection::vec((tricky(), any::<i64>()), 0..40), seed in any::<u64>()) {
        let forward: HashMap<String, i64> = entries.iter().cloned().collect();
        let mut shuffled = entries.clone();
        // A deterministic shuffle from the seed: insertion order changes, contents do not.
        let mut x = seed | 1;
        for k in (1..shuffled.len()).rev() {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            shuffled.swap(k, (x % (k as u64 + 1)) as usize);
        }
        let mut backward = HashMap::with_capacity(shuffled.len() * 3);
        for (k, v) in shuffled.into_iter().rev() {
            // Later duplicates must not win over earlier ones differently than in `forward`.
            if forward.get(&k) == Some(&v) {
                backward.insert(k, v);
            }
        }
        let sorted: BTreeMap<String, i64> = forward.clone().into_iter().collect();
        let f = Fingerprint::of(&forward).unwrap();
        prop_assert_eq!(f, Fingerprint::of(&backward).unwrap());
        prop_assert_eq!(f, Fingerprint::of(&sorted).unwrap());
    }

    #[test]
    fn fingerprint_tells_different_maps_apart(a in proptest::collection::btree_map(tricky(), any::<i64>(), 0..10), b in proptest::collection::btree_map(tricky(), any::<i64>(), 0..10)) {
        prop_assume!(a != b);
        prop_assert_ne!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    }
}
