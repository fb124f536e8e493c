//! Resource-side fencing for Kubernetes objects: an object labelled
//! `leasehold.dev/fenced-by: <lock>` is written, relabelled and deleted only with the
//! lock's current token in its `leasehold.dev/fencing-token` annotation.
//!
//! - The lock is the one the object is fenced by *before* the write (the old object on
//!   UPDATE and DELETE): a write that removes or changes the label needs that lock's
//!   current token, so a stale writer cannot unfence the object, nor move it under another
//!   lock whose token it can read. A write that puts an object under a lock (CREATE, or a
//!   new label) needs that lock's current token too.
//! - DELETE carries no token: it is admitted only while the token recorded on the object is
//!   the lock's current token (the last write was by the current holder). A holder deletes
//!   safely with a resourceVersion precondition from its own fenced write.
//! - A lock that no longer exists fences nothing: its objects can be written and deleted
//!   freely (they are never stuck); a write naming a lock that does not exist is refused.
//!
//! The token orders writers; it is not a credential: anyone who can read the lock can read
//! its current token. It keeps a writer whose hold has ended from overwriting the work of
//! the next holder.
//!
//! The current token is read fresh from the apiserver on every write (a cache could lag a
//! grant and let a stale holder through). An update must also not lower the token already
//! on the object, which closes the window between this check and the write landing: with
//! the apiserver's own resourceVersion check, a write computed from an older object fails.

use std::collections::BTreeMap;

use crate::lease::token;

/// The kind of write, as far as fencing cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// A new object.
    Create,
    /// A change (including a label change).
    Update,
    /// A deletion.
    Delete,
}

/// A write to a possibly fenced object: the lock label and token annotation before (UPDATE,
/// DELETE) and after (CREATE, UPDATE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Write<'a> {
    /// `leasehold.dev/fenced-by` of the old object.
    pub old_lock: Option<&'a str>,
    /// `leasehold.dev/fencing-token` of the old object.
    pub old_token: Option<&'a str>,
    /// `leasehold.dev/fenced-by` of the new object.
    pub new_lock: Option<&'a str>,
    /// `leasehold.dev/fencing-token` of the new object.
    pub new_token: Option<&'a str>,
}

/// The current token of each lock a write involves; `None` when the lock does not exist.
pub type Tokens = BTreeMap<String, Option<i64>>;

/// The locks whose current token decides `write` (read them, then call [`judge`]).
pub fn locks(operation: Operation, write: &Write<'_>) -> Vec<String> {
    let (before, after) = sides(operation, write);
    let mut locks: Vec<String> = before.into_iter().chain(after).map(str::to_owned).collect();
    locks.dedup();
    locks
}

/// Which lock fences the object before and after the write.
#[cfg(not(feature = "broken-fence-new-label"))]
fn sides<'a>(operation: Operation, write: &Write<'a>) -> (Option<&'a str>, Option<&'a str>) {
    match operation {
        Operation::Create => (None, write.new_lock),
        Operation::Update => (write.old_lock, write.new_lock),
        Operation::Delete => (write.old_lock, None),
    }
}

/// Test-only broken build: the lock is taken from the new object only, so removing or
/// changing the label escapes the fence and a DELETE is never checked.
#[cfg(feature = "broken-fence-new-label")]
fn sides<'a>(operation: Operation, write: &Write<'a>) -> (Option<&'a str>, Option<&'a str>) {
    match operation {
        Operation::Create | Operation::Delete => (None, write.new_lock),
        Operation::Update => (write.new_lock.filter(|l| Some(*l) == write.old_lock), write.new_lock),
    }
}

/// A refused write: the message for the requester, and what to log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The lock that refused it (`<namespace>/<name>`).
    pub lock: String,
    /// The token the write carried (or the object records, for DELETE), as given.
    pub presented: Option<String>,
    /// The lock's current token (`None`: the lock does not exist).
    pub current: Option<i64>,
    /// What to tell the requester.
    pub message: String,
}

/// Judges `write` against the current `tokens` of the locks of [`locks`]; `namespace`
/// qualifies lock names in messages.
pub fn judge(operation: Operation, write: &Write<'_>, namespace: &str, tokens: &Tokens) -> Result<(), Refusal> {
    let (before, after) = sides(operation, write);
    let qualified = |lock: &str| format!("{namespace}/{lock}");
    let current = |lock: &str| tokens.get(lock).copied().flatten();

    // The lock the object is fenced by now: the write needs its current token, unless the
    // lock is gone (then the object is no longer fenced).
    if let Some(lock) = before
        && let Some(now) = current(lock)
    {
        let refuse = |message: String, presented: Option<&str>| Refusal {
            lock: qualified(lock),
            presented: presented.map(str::to_owned),
            current: Some(now),
            message,
        };
        if operation == Operation::Delete {
            return check(&qualified(lock), write.old_token, now, None).map_err(|why| {
                refuse(
                    format!(
                        "delete refused: {why}; only an object last written with the lock's current token can be deleted (write it with your token, then delete with a resourceVersion precondition from that write)"
                    ),
                    write.old_token,
                )
            }).map(|_| ());
        }
        let relabel = match after {
            Some(next) if next == lock => None,
            Some(next) => Some(format!("a move to lock {} needs this lock's current token", qualified(next))),
            None => Some("removing the label needs the lock's current token".to_owned()),
        };
        let stored = write.old_token.and_then(|v| token::parse(v).ok());
        check(&qualified(lock), write.new_token, now, stored).map_err(|why| {
            let message = match &relabel {
                Some(what) => format!("{why} ({what})"),
                None => why,
            };
            refuse(message, write.new_token)
        })?;
    }

    // A lock the write puts the object under: it must exist, and the write carries its
    // current token.
    if let Some(lock) = after
        && before != Some(lock)
    {
        let Some(now) = current(lock) else {
            return Err(Refusal {
                lock: qualified(lock),
                presented: write.new_token.map(str::to_owned),
                current: None,
                message: format!("object would be fenced by lock {}, which does not exist", qualified(lock)),
            });
        };
        check(&qualified(lock), write.new_token, now, None).map_err(|why| {
            let message = match before.filter(|old| current(old).is_some()) {
                Some(old) => format!(
                    "{why} (to move an object from lock {} to lock {}: remove the label with the first lock's current token, then label it with the second's)",
                    qualified(old),
                    qualified(lock)
                ),
                None => why,
            };
            Refusal { lock: qualified(lock), presented: write.new_token.map(str::to_owned), current: Some(now), message }
        })?;
    }
    Ok(())
}

/// Checks a token annotation `value` against lock `lock`'s current token `now`, and
/// against the token `stored` on the object before an update.
fn check(lock: &str, value: Option<&str>, now: i64, stored: Option<i64>) -> Result<i64, String> {
    let Some(value) = value else {
        return Err(format!(
            "object fenced by lock {lock} has no leasehold.dev/fencing-token annotation (the lock's current token is {now})"
        ));
    };
    let presented = token::parse(value).map_err(|e| format!("object fenced by lock {lock}: {e}"))?;
    if presented < now {
        return Err(format!(
            "stale write rejected: object fenced by lock {lock} carries token {presented}, but the lock's current token is {now}"
        ));
    }
    if presented > now {
        return Err(format!(
            "write rejected: object fenced by lock {lock} carries token {presented}, higher than any token issued ({now})"
        ));
    }
    if let Some(stored) = stored
        && presented < stored
    {
        return Err(format!(
            "stale write rejected: object fenced by lock {lock} already carries token {stored}, this write carries {presented}"
        ));
    }
    Ok(presented)
}

#[cfg(test)]
mod tests;
