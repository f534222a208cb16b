//! Sizes written as string literals: `"512B"`, `"64KiB"`, `"1MiB"`.

use crate::quantity::{self, Unread};

/// The largest size cap of a resumable call's stored request: 1 MiB, the runtime's
/// `RequestCap::MAX` (a test in `tests/completer.rs` holds the two together).
pub(crate) const MAX_REQUEST: u64 = 1024 * 1024;

const UNITS: &[(&str, u64)] = &[("B", 1), ("KiB", 1024), ("MiB", 1024 * 1024)];

/// The size in bytes.
pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let help = "use a whole number followed by `B`, `KiB` or `MiB`, e.g. \"256KiB\"";
    match quantity::parse(text, UNITS) {
        Ok(bytes) => Ok(bytes),
        Err(Unread::Malformed) => Err(format!("invalid size \"{text}\": {help}")),
        Err(Unread::Overflow) => Err(format!("size \"{text}\" is too large")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn units() {
        assert_eq!(super::parse("512B"), Ok(512));
        assert_eq!(super::parse("64KiB"), Ok(65_536));
        assert_eq!(super::parse("1MiB"), Ok(1_048_576));
        assert_eq!(
            super::parse("0B"),
            Ok(0),
            "zero is a size; the range is checked apart"
        );
        for bad in [
            "",
            "64",
            "KiB",
            "64kb",
            "64 kib",
            "64 KiB",
            "1.5MiB",
            "-1B",
            "99999999999999999999MiB",
        ] {
            assert!(super::parse(bad).is_err(), "{bad:?}");
        }
    }
}
