//! The wait queue: which claims are live, in what order they are served.
//!
//! Order is claim creation order — the apiserver's `creationTimestamp` (seconds), then the
//! claimant's own microsecond claim time within the same second, then the name. It is
//! derived from the claims alone, so it survives controller restarts and failovers
//! without any extra write.

use std::time::Duration;

use super::view::Claim;

/// Sorts claims into grant order.
pub fn order(claims: &mut [Claim]) {
    claims.sort_by(|a, b| (a.created, a.requested, &a.name).cmp(&(b.created, b.requested, &b.name)));
}

/// Splits ordered claims into live waiters and stale claims. `unchanged_for(claim)` is how
/// long the claim's refresh has been unchanged on the controller's clock; the holder's own
/// claim (identity `holder`) is neither.
pub fn split<'a>(
    claims: &'a [Claim],
    holder: Option<&str>,
    unchanged_for: impl Fn(&Claim) -> Duration,
) -> (Vec<&'a Claim>, Vec<&'a Claim>) {
    let mut live = Vec::new();
    let mut stale = Vec::new();
    for claim in claims.iter().filter(|c| Some(c.identity.id.as_str()) != holder) {
        if unchanged_for(claim) >= claim.ttl { stale.push(claim) } else { live.push(claim) }
    }
    (live, stale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Identity;
    use jiff::Timestamp;

    fn claim(name: &str, created_s: i64, requested_us: i64) -> Claim {
        Claim {
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

    #[test]
    fn split_excludes_holder_and_stale() {
        let claims = vec![claim("a", 1, 1), claim("b", 2, 2), claim("c", 3, 3)];
        let (live, stale) =
            split(
                &claims,
                Some("id-a"),
                |c| {
                    if c.name == "b" { Duration::from_secs(30) } else { Duration::from_secs(29) }
                },
            );
        assert_eq!(live.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(stale.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["b"]);
    }
}
