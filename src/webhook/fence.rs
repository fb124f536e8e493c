//! Resource-side fencing for Kubernetes objects: an object labelled
//! `leasehold.dev/fenced-by: <lock>` may be created or updated only with the lock's current
//! token in its `leasehold.dev/fencing-token` annotation.
//!
//! The current token is read fresh from the apiserver on every write (a cache could lag a
//! grant and let a stale holder through). An update must also not lower the token already
//! on the object, which closes the window between this check and the write landing: with
//! the apiserver's own resourceVersion check, a write computed from an older object fails.

use crate::lease::token;

/// The tokens a fenced write is judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Current {
    /// The lock's current token: the highest issued (or reserved by a revocation).
    pub lock: i64,
    /// The token on the object before this update (UPDATE only).
    pub object: Option<i64>,
}

/// Judges a write fenced by `lock` carrying `annotation`; `Err` names the lock and both
/// tokens.
pub fn judge(lock: &str, annotation: Option<&str>, current: Current) -> Result<i64, String> {
    let Some(value) = annotation else {
        return Err(format!(
            "object fenced by lock {lock} has no leasehold.dev/fencing-token annotation (the lock's current token is {})",
            current.lock
        ));
    };
    let presented = token::parse(value).map_err(|e| format!("object fenced by lock {lock}: {e}"))?;
    if presented < current.lock {
        return Err(format!(
            "stale write rejected: object fenced by lock {lock} carries token {presented}, but the lock's current token is {}",
            current.lock
        ));
    }
    if presented > current.lock {
        return Err(format!(
            "write rejected: object fenced by lock {lock} carries token {presented}, higher than any token issued ({})",
            current.lock
        ));
    }
    if let Some(stored) = current.object
        && presented < stored
    {
        return Err(format!(
            "stale write rejected: object fenced by lock {lock} already carries token {stored}, this write carries {presented}"
        ));
    }
    Ok(presented)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_table() {
        let c = |lock, object| Current { lock, object };
        assert_eq!(judge("l", Some("7"), c(7, None)), Ok(7));
        assert_eq!(judge("l", Some("7"), c(7, Some(7))), Ok(7));
        let cases = [
            (None, c(7, None), ["no leasehold.dev/fencing-token", "7"]),
            (Some("x7"), c(7, None), ["lock l", "x7"]),
            (Some("5"), c(7, None), ["token 5", "current token is 7"]),
            (Some("9"), c(7, None), ["token 9", "(7)"]),
            (Some("7"), c(7, Some(8)), ["token 8", "carries 7"]),
        ];
        for (annotation, current, needles) in cases {
            let error = judge("l", annotation, current).expect_err("rejected");
            for needle in needles {
                assert!(error.contains(needle), "{error:?} lacks {needle:?}");
            }
        }
    }
}
