//! The wait queue's order: in what order claims are served (which are live is the plan's to say).
//!
//! Order is claim creation order — the apiserver's `creationTimestamp` (seconds), then the
//! claimant's own microsecond claim time within the same second, then the name. It is
//! derived from the claims alone, so it survives controller restarts and failovers
//! without any extra write.

use super::view::Claim;

/// Sorts claims into grant order.
pub fn order(claims: &mut [Claim]) {
    claims.sort_by(|a, b| (a.created, a.requested, &a.name).cmp(&(b.created, b.requested, &b.name)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Identity;
    use jiff::Timestamp;
    use std::time::Duration;

    fn claim(name: &str, created_s: i64, requested_us: i64) -> Claim {
        Claim {
            mode: crate::crd::ClaimMode::Read,
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: "1".into(),
            identity: Identity { id: format!("id-{name}"), pod: None },
            created: Timestamp::from_second(created_s).expect("valid"),
            requested: Timestamp::from_microsecond(requested_us).expect("valid"),
            renew_time: None,
            ttl: Duration::from_secs(30),
        }
    }

    fn names(claims: &[Claim]) -> Vec<&str> {
        claims.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn order_by_creation_then_claim_time_then_name() {
        let mut claims = vec![
            claim("c", 100, 100_000_300),
            claim("a", 101, 100_000_000), // created a second later, whatever its own clock says
            claim("b", 100, 100_000_200),
            claim("d", 100, 100_000_200), // same instant as b: by name
        ];
        order(&mut claims);
        assert_eq!(names(&claims), ["b", "d", "c", "a"]);
    }
}
