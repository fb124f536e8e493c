//! Names every part of Leasehold checks the same way: a lock name is a DNS label, as the
//! DistributedLock CRD requires. The sidecar's API, the sidecar's `--hold` flag and the
//! injection webhook all refuse the same names with the same rule.

/// A lock name that is not a DNS label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lock name {shown:?} is not a DNS label (at most 63 lowercase letters, digits and '-')")]
pub struct InvalidLockName {
    /// The name as given, cut to its first 80 characters (a caller's mistake may be long).
    pub shown: String,
}

/// Checks a lock name: a DNS label, as the CRD requires.
pub fn validate_lock_name(name: &str) -> Result<(), InvalidLockName> {
    if is_dns_label(name) { Ok(()) } else { Err(InvalidLockName { shown: name.chars().take(80).collect() }) }
}

/// Whether `name` is an RFC 1123 label: 1 to 63 lowercase letters, digits and '-', not
/// starting or ending with '-'.
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names() {
        for ok in ["a", "orders", "a-1", &"x".repeat(63)] {
            assert!(validate_lock_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "a.b", "-a", "a-", "a_b", &"x".repeat(64), "a b", "ü"] {
            let e = validate_lock_name(bad).expect_err(bad);
            assert_eq!(e.shown, bad.chars().take(80).collect::<String>(), "{bad}");
        }
    }

    #[test]
    fn a_long_bad_name_is_shown_cut() {
        let long = "X".repeat(200);
        let e = validate_lock_name(&long).expect_err("not a label");
        assert_eq!(e.shown.len(), 80);
        assert_eq!(
            e.to_string(),
            format!("lock name {:?} is not a DNS label (at most 63 lowercase letters, digits and '-')", "X".repeat(80))
        );
    }
}
