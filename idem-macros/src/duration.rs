//! Durations written as string literals: `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`.

use crate::quantity::{self, Unread};

const UNITS: &[(&str, u64)] = &[
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// The duration in milliseconds.
pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let help = "use a whole number followed by `ms`, `s`, `m`, `h` or `d`, e.g. \"30s\" or \"24h\"";
    match quantity::parse(text, UNITS) {
        Ok(0) => Err(format!("duration \"{text}\" is zero: it must be positive")),
        Ok(ms) => Ok(ms),
        Err(Unread::Malformed) => Err(format!("invalid duration \"{text}\": {help}")),
        Err(Unread::Overflow) => Err(format!("duration \"{text}\" is too long")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn units() {
        assert_eq!(super::parse("500ms"), Ok(500));
        assert_eq!(super::parse("30s"), Ok(30_000));
        assert_eq!(super::parse("5m"), Ok(300_000));
        assert_eq!(super::parse("24h"), Ok(86_400_000));
        assert_eq!(super::parse("7d"), Ok(604_800_000));
        for bad in [
            "",
            "5",
            "m",
            "5 minutes",
            "1.5h",
            "-3s",
            "0s",
            "99999999999999999999d",
        ] {
            assert!(super::parse(bad).is_err(), "{bad:?}");
        }
    }
}
