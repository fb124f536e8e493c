//! Durations as people write them on command lines and in Pod annotations (`500ms`, `2s`,
//! `1m30s`), read one way by the controller, the sidecar, the injection webhook and the CLI.

use std::time::Duration;

/// Parses durations like `500ms`, `2s`, `1m30s`. The error names the text and the problem
/// (it is a `String` so that clap shows it as is).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = s.parse().map_err(|e| format!("invalid duration {s:?}: {e}"))?;
    Duration::try_from(d).map_err(|_| format!("invalid duration {s:?}: must not be negative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let cases = [
            ("500ms", Duration::from_millis(500)),
            ("2s", Duration::from_secs(2)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("0s", Duration::ZERO),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn bad_durations_are_named() {
        for bad in ["", "ten", "5", "1x"] {
            let e = parse_duration(bad).expect_err(bad);
            assert!(e.starts_with(&format!("invalid duration {bad:?}: ")), "{e}");
        }
        assert_eq!(parse_duration("-1s"), Err("invalid duration \"-1s\": must not be negative".to_owned()));
    }
}
