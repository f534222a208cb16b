//! Sizes written as string literals: `"512B"`, `"64KiB"`, `"1MiB"` (a space before the unit is
//! allowed).

/// The largest size cap of a resumable call's stored request: 1 MiB, the runtime's
/// `RequestCap::MAX` (a test in `tests/completer.rs` holds the two together).
pub(crate) const MAX_REQUEST: u64 = 1024 * 1024;

pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let help = "use a whole number followed by `B`, `KiB` or `MiB`, e.g. \"256KiB\"";
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size \"{text}\": {help}"))?;
    let factor = match unit.trim_start() {
        "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return Err(format!("invalid size \"{text}\": {help}")),
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("size \"{text}\" is too large"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn units() {
        assert_eq!(super::parse("512B"), Ok(512));
        assert_eq!(super::parse("64KiB"), Ok(65_536));
        assert_eq!(super::parse("64 KiB"), Ok(65_536));
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
            "1.5MiB",
            "-1B",
            "99999999999999999999MiB",
        ] {
            assert!(super::parse(bad).is_err(), "{bad:?}");
        }
    }
}
