//! A whole number followed by its unit, written as a string literal: what the attributes'
//! durations (`"30s"`) and sizes (`"256KiB"`) are made of.

/// Why a quantity could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unread {
    /// Not a whole number followed by one of the units.
    Malformed,
    /// More than a `u64` of the smallest unit.
    Overflow,
}

/// `text` (spaces around it allowed) as a whole number followed by one of `units`, each with how
/// many of the smallest unit it is: the quantity in the smallest unit.
pub(crate) fn parse(text: &str, units: &[(&str, u64)]) -> Result<u64, Unread> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| Unread::Malformed)?;
    let factor = units
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, factor)| *factor)
        .ok_or(Unread::Malformed)?;
    n.checked_mul(factor).ok_or(Unread::Overflow)
}
