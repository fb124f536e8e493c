//! Fencing tokens: minting and reading.
//!
//! A token is minted as `max(previous + 1, wall clock in ms)` (design 4.2), where
//! `previous` is the highest token known from every source (status, the lock Lease's
//! annotation, the controller's memory). The `+ 1` makes tokens strictly increase even
//! when the wall clock stands still or goes backwards; the wall-clock term keeps them
//! increasing when every record of the previous token is lost (Lease and lock deleted,
//! etcd restored), as long as the clock has not gone back by more than the time since the
//! last grant.

use k8s_openapi::api::coordination::v1::Lease;

use crate::crd::ANNOTATION_TOKEN;

/// The next token after `previous` (the highest known), given the wall clock in ms; `None`
/// when `previous` is the largest token there is: a token is never reused, so the lock
/// cannot be granted again (the caller reports it loudly).
pub fn mint(previous: i64, wall_clock_ms: i64) -> Option<i64> {
    previous.checked_add(1).map(|next| next.max(wall_clock_ms))
}

/// How far above every token we know of (and the wall clock) a token on a lock Lease may
/// be before it is treated as written by someone other than a controller: one day.
pub const TAMPER_MARGIN_MS: i64 = 24 * 3600 * 1000;

/// The highest token a controller could have minted: `max(known, wall clock) + 1 day`,
/// where `known` is the highest token recorded in status and in the controller's memory.
pub fn ceiling(known: i64, wall_clock_ms: i64) -> i64 {
    known.max(wall_clock_ms).saturating_add(TAMPER_MARGIN_MS)
}

/// Parses a token as written in annotations: a positive decimal integer without sign,
/// leading zeros or whitespace.
pub fn parse(value: &str) -> Result<i64, TokenError> {
    let valid = !value.is_empty()
        && value.len() <= 19
        && value.bytes().all(|b| b.is_ascii_digit())
        && !(value.len() > 1 && value.starts_with('0'));
    if !valid {
        return Err(TokenError(value.chars().take(40).collect()));
    }
    value.parse::<i64>().ok().filter(|t| *t > 0).ok_or_else(|| TokenError(value.to_owned()))
}

/// A token annotation that is not a positive decimal integer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("fencing token {0:?} is not a positive decimal integer")]
pub struct TokenError(pub String);

/// The token recorded on a lock Lease, if any (a malformed one counts as none: the other
/// sources and the wall clock still keep the next token higher).
pub fn of_lease(lease: &Lease) -> Option<i64> {
    lease.metadata.annotations.as_ref()?.get(ANNOTATION_TOKEN).and_then(|v| parse(v).ok())
}

/// The wall clock in ms since the Unix epoch.
pub fn wall_clock_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mint_table() {
        // (previous, wall clock, expected)
        let cases = [
            (0, 1_700_000_000_000, Some(1_700_000_000_000)), // first grant: the clock
            (1_700_000_000_000, 1_700_000_000_500, Some(1_700_000_000_500)), // clock moved on
            (1_700_000_000_000, 1_700_000_000_000, Some(1_700_000_000_001)), // same ms
            (1_700_000_000_000, 1_600_000_000_000, Some(1_700_000_000_001)), // clock went backwards
            (1_700_000_000_000, 0, Some(1_700_000_000_001)), // clock broken
            (i64::MAX - 1, 0, Some(i64::MAX)),               // the last token
            (i64::MAX, i64::MAX, None),                      // none left: never reused, never wraps
        ];
        for (previous, wall, expected) in cases {
            assert_eq!(mint(previous, wall), expected, "mint({previous}, {wall})");
        }
    }

    #[test]
    fn ceiling_table() {
        let day = TAMPER_MARGIN_MS;
        assert_eq!(ceiling(0, 1_700_000_000_000), 1_700_000_000_000 + day);
        assert_eq!(ceiling(1_800_000_000_000, 1_700_000_000_000), 1_800_000_000_000 + day);
        assert_eq!(ceiling(i64::MAX - 5, 0), i64::MAX, "saturates");
    }

    #[test]
    fn minted_tokens_strictly_increase_under_any_clock() {
        let clock = [5, 5, 4, 100, 3, 3, 101, 0, 102, 102];
        let mut previous = 0;
        for wall in clock {
            let next = mint(previous, wall).expect("tokens left");
            assert!(next > previous, "{next} after {previous} (clock {wall})");
            previous = next;
        }
    }

    #[test]
    fn parse_table() {
        assert_eq!(parse("1"), Ok(1));
        assert_eq!(parse("1700000000000"), Ok(1_700_000_000_000));
        for bad in ["", "0", "-1", "+1", " 1", "1 ", "01", "1.0", "abc", "99999999999999999999", "9223372036854775808"]
        {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
