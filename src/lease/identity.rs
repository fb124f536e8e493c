//! Claimant identities and the names of their LockClaims.
//!
//! A claimant in a Pod is `<pod-name>_<pod-uid>`: unique across Pod re-creation, and
//! checkable by the guard against the Pod name and UID the apiserver puts in a Pod-bound
//! token's user info. Outside a Pod (`leasehold run` on a laptop) it is
//! `<username>/u-<host>-<8 hex>`. A claimant's LockClaim on lock `l` is `l.<pod-uid>` or
//! `l.u-<host>-<8 hex>`: derived from the identity, so one claim per claimant and lock.

/// Who claims a lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The holderIdentity written into Leases.
    pub id: String,
    /// The claimant's Pod name and UID, when it runs in a Pod.
    pub pod: Option<PodRef>,
}

/// A Pod by name and UID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

impl Identity {
    /// The identity of a claimant running in the given Pod.
    pub fn for_pod(name: &str, uid: &str) -> Identity {
        Identity { id: format!("{name}_{uid}"), pod: Some(PodRef { name: name.to_owned(), uid: uid.to_owned() }) }
    }

    /// An identity for a process outside any Pod: `u-<host>-<8 hex>`, the host name made
    /// fit for an object name (lowercase letters, digits and `-`, at most 40 characters).
    pub fn for_process() -> Identity {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let suffix: u32 = rand::random();
        Identity { id: format!("u-{}-{suffix:08x}", sanitize_host(&host)), pod: None }
    }

    /// An identity outside any Pod for user `username`: `<username>/u-<host>-<8 hex>`. The
    /// guard accepts a non-pod claimant only under its own user name.
    pub fn for_user(username: &str) -> Identity {
        Identity { id: format!("{username}/{}", Identity::for_process().id), pod: None }
    }

    /// Asks the apiserver who we are (SelfSubjectReview): the Pod identity when the
    /// credentials are bound to a Pod, else a user identity.
    pub async fn discover(client: &kube::Client) -> Result<Identity, kube::Error> {
        use k8s_openapi::api::authentication::v1::SelfSubjectReview;
        let reviews: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
        let review = reviews.create(&kube::api::PostParams::default(), &SelfSubjectReview::default()).await?;
        let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
        let extra = user.extra.unwrap_or_default();
        let first = |key: &str| extra.get(key).and_then(|v| v.first()).cloned();
        Ok(match (first("authentication.kubernetes.io/pod-name"), first("authentication.kubernetes.io/pod-uid")) {
            (Some(name), Some(uid)) => Identity::for_pod(&name, &uid),
            _ => Identity::for_user(&user.username.unwrap_or_else(|| "unknown".into())),
        })
    }

    /// Reads the Pod back out of an identity written by [`Identity::for_pod`].
    pub fn parse(id: &str) -> Identity {
        let pod = id.rsplit_once('_').and_then(|(name, uid)| {
            let uid_like = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
            (uid_like && !name.is_empty()).then(|| PodRef { name: name.to_owned(), uid: uid.to_owned() })
        });
        Identity { id: id.to_owned(), pod }
    }

    /// The name of this claimant's LockClaim on `lock`: `<lock>.<pod-uid>` for a Pod,
    /// `<lock>.<suffix>` otherwise, where `suffix` is what follows the last `/` of the
    /// identity (`u-<host>-<8 hex>`). Lock names are DNS labels (no dots), so the part after
    /// the first dot is always the claimant's.
    pub fn claim_name(&self, lock: &str) -> String {
        match &self.pod {
            Some(pod) => format!("{lock}.{}", pod.uid),
            None => format!("{lock}.{}", self.id.rsplit('/').next().unwrap_or(&self.id)),
        }
    }
}

/// A host name as part of an object name: lowercase ASCII letters, digits and `-`, no
/// leading or trailing `-`, at most 40 characters; `host` if nothing is left.
fn sanitize_host(host: &str) -> String {
    let mapped: String = host
        .trim()
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() { c } else { '-' })
        .take(40)
        .collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed.is_empty() { "host".to_owned() } else { trimmed.to_owned() }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10";

    #[test]
    fn pod_identity_round_trips() {
        let id = Identity::for_pod("worker-0", UID);
        assert_eq!(id.id, format!("worker-0_{UID}"));
        assert_eq!(Identity::parse(&id.id), id);
    }

    #[test]
    fn non_pod_identities_have_no_pod() {
        for id in ["laptop-1a2b3c4d", "a_b", "_0b8f3a1e-5d2c-4c55-9a57-2f3c1e7b9d10", ""] {
            assert_eq!(Identity::parse(id).pod, None, "{id}");
        }
        assert_eq!(Identity::for_process().pod, None);
    }

    #[test]
    fn claim_names_follow_the_claimant() {
        let a = Identity::for_pod("a", UID);
        assert_eq!(a.claim_name("orders"), format!("orders.{UID}"));
        assert_eq!(Identity::parse(&a.id).claim_name("orders"), a.claim_name("orders"));
        let user = Identity { id: "system:serviceaccount:ns:ci/u-laptop-0a1b2c3d".into(), pod: None };
        assert_eq!(user.claim_name("orders"), "orders.u-laptop-0a1b2c3d");
        let process = Identity::for_process();
        assert!(process.id.starts_with("u-"), "{}", process.id);
        assert_eq!(process.claim_name("orders"), format!("orders.{}", process.id));
        let named = Identity::for_user("alice");
        assert!(named.id.starts_with("alice/u-"), "{}", named.id);
        assert!(named.claim_name("orders").starts_with("orders.u-"));
    }

    #[test]
    fn host_names_become_name_safe() {
        let cases = [
            ("laptop", "laptop"),
            ("My_Laptop.local\n", "my-laptop-local"),
            ("--x--", "x"),
            ("", "host"),
            ("___", "host"),
            (&"h".repeat(60), &"h".repeat(40)),
        ];
        for (host, expected) in cases {
            assert_eq!(sanitize_host(host), expected, "{host:?}");
        }
    }
}
