//! Why the controller takes a hold away: one vocabulary for the lock Lease's
//! `leasehold.dev/revoked` annotation (which the holder reads), the revocation metric's
//! label and the lock's Events. The string forms are part of the Lease protocol: they
//! never change.

use std::fmt;
use std::str::FromStr;

/// Why the controller took a hold away.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum RevokeReason {
    /// No renewal seen for a lease duration.
    Expired,
    /// The holder's Pod is gone.
    PodGone,
    /// The grant was never confirmed.
    Unconfirmed,
    /// Held longer than `maxHoldSeconds`.
    MaxHold,
    /// An operator forced it.
    Forced,
    /// The DistributedLock is being deleted.
    LockDeleted,
}

impl RevokeReason {
    /// Every reason.
    pub const ALL: [RevokeReason; 6] = [
        RevokeReason::Expired,
        RevokeReason::PodGone,
        RevokeReason::Unconfirmed,
        RevokeReason::MaxHold,
        RevokeReason::Forced,
        RevokeReason::LockDeleted,
    ];

    /// The stable string form, as recorded on the lock Lease and in metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            RevokeReason::Expired => "Expired",
            RevokeReason::PodGone => "PodGone",
            RevokeReason::Unconfirmed => "Unconfirmed",
            RevokeReason::MaxHold => "MaxHold",
            RevokeReason::Forced => "Forced",
            RevokeReason::LockDeleted => "LockDeleted",
        }
    }
}

impl fmt::Display for RevokeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no revocation reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown revocation reason {0:?} (known: Expired, PodGone, Unconfirmed, MaxHold, Forced, LockDeleted)")]
pub struct UnknownReason(pub String);

impl FromStr for RevokeReason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RevokeReason::ALL.into_iter().find(|r| r.as_str() == s).ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_string_and_the_strings_never_change() {
        let strings: Vec<&str> = RevokeReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(strings, ["Expired", "PodGone", "Unconfirmed", "MaxHold", "Forced", "LockDeleted"]);
        for reason in RevokeReason::ALL {
            assert_eq!(reason.as_str().parse::<RevokeReason>(), Ok(reason));
            assert_eq!(reason.to_string(), reason.as_str());
        }
        assert_eq!("expired".parse::<RevokeReason>(), Err(UnknownReason("expired".into())));
    }
}
