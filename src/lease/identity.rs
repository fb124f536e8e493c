//! Claimant identities and the names of claim Leases.
//!
//! A claimant in a Pod is `<pod-name>_<pod-uid>`: unique across Pod re-creation, and
//! checkable by the Lease guard against the Pod name and UID the apiserver puts in a
//! Pod-bound token's user info. Outside a Pod (`leasehold run` on a laptop) it is
//! `<host>-<random>`.

use sha2::{Digest, Sha256};

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

    /// An identity for a claimant outside any Pod: host name plus a random suffix.
    pub fn for_process() -> Identity {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".to_owned());
        let suffix: u32 = rand::random();
        Identity { id: format!("{host}-{suffix:08x}"), pod: None }
    }

    /// An identity outside any Pod for user `username`: `<username>/<host>-<random>`. The
    /// Lease guard accepts a non-pod holder only under its own user name.
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

    /// The name of this claimant's claim Lease on `lock`: `<lock>.<hash>`. Lock names are
    /// DNS labels (no dots), so a claim name never collides with a lock Lease.
    pub fn claim_name(&self, lock: &str) -> String {
        let digest = Sha256::digest(self.id.as_bytes());
        let hash: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("{lock}.{hash}")
    }
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
    fn claim_names_are_stable_distinct_and_dotted() {
        let a = Identity::for_pod("a", UID);
        let b = Identity::for_pod("b", UID);
        assert_eq!(a.claim_name("orders"), a.claim_name("orders"));
        assert_ne!(a.claim_name("orders"), b.claim_name("orders"));
        assert!(a.claim_name("orders").starts_with("orders."));
        assert_eq!(a.claim_name("orders").len(), "orders.".len() + 16);
    }
}
