//! `leasehold wait`: block a script until a lock is free, held, or granted to a given
//! claimant — on a watch of the lock Lease, never a polling loop. Exit codes are
//! [`crate::run::EXIT_NOT_ACQUIRED`] on timeout and [`crate::run::EXIT_REFUSED`] when the lock
//! does not exist or may not be read (the same meanings as for `leasehold run`).

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::wait::await_condition;

use super::target::{self, PodNamespace};
use crate::controller::view::{LeaseState, lease_state};
use crate::crd::DistributedLock;
use crate::run::{EXIT_NOT_ACQUIRED, EXIT_REFUSED};

/// What to wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Until {
    /// Nobody holds the lock (and no revoked hold is draining).
    Free,
    /// Somebody holds it, confirmed.
    Held,
    /// This claimant (an identity, or a Pod name) holds it, confirmed.
    GrantedTo(String),
}

/// Parses `free`, `held` or `granted-to=<identity or pod name>`.
pub fn parse_until(s: &str) -> Result<Until, String> {
    match s {
        "free" => Ok(Until::Free),
        "held" => Ok(Until::Held),
        _ => match s.strip_prefix("granted-to=") {
            Some(who) if !who.is_empty() => Ok(Until::GrantedTo(who.to_owned())),
            _ => Err(format!("{s:?} is not free, held or granted-to=<identity or pod name>")),
        },
    }
}

/// Whether the lock Lease (absent: the controller has not made it, so nobody holds) shows
/// the awaited state. A grant counts once the holder has confirmed it: until then it may
/// still be revoked without the claimant ever having held.
pub fn holds(until: &Until, lease: Option<&Lease>) -> bool {
    let state = lease.map_or(LeaseState::Free, lease_state);
    match (until, state) {
        (Until::Free, LeaseState::Free) => true,
        (Until::Held, LeaseState::Held(h)) => h.confirmed,
        (Until::GrantedTo(who), LeaseState::Held(h)) => {
            h.confirmed && (h.identity.id == *who || h.identity.pod.is_some_and(|p| p.name == *who))
        }
        _ => false,
    }
}

/// `leasehold wait` arguments.
#[derive(Clone, Debug, clap::Args)]
#[command(after_long_help = crate::run::EXIT_CODES)]
pub struct Wait {
    /// The lock: `<namespace>/<name>`, or `<name>` inside a Pod (its own namespace).
    pub lock: String,
    /// `free`, `held`, or `granted-to=<identity or pod name>`.
    #[arg(long = "for", value_parser = parse_until)]
    pub until: Until,
    /// How long to wait before giving up (exit 75).
    #[arg(long, default_value = "30s", value_parser = crate::duration::parse_duration)]
    pub timeout: Duration,
}

/// Waits; returns the process's exit code and what to say.
pub async fn wait(args: Wait) -> anyhow::Result<(i32, String)> {
    let (namespace, name) = target::resolve(&args.lock, &PodNamespace::read())?;
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    match Api::<DistributedLock>::namespaced(client.clone(), &namespace).get_opt(&name).await {
        Ok(Some(_)) => {}
        Ok(None) => return Ok((EXIT_REFUSED, format!("lock {namespace}/{name} does not exist"))),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok((EXIT_REFUSED, format!("not allowed to read lock {namespace}/{name}: {}", e.message)));
        }
        Err(e) => return Err(e).with_context(|| format!("failed to read lock {namespace}/{name}")),
    }
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let until = args.until.clone();
    let done = await_condition(leases, &name, move |lease: Option<&Lease>| holds(&until, lease));
    match tokio::time::timeout(args.timeout, done).await {
        Ok(Ok(_)) => Ok((0, String::new())),
        Ok(Err(e)) => Err(e).with_context(|| format!("failed to watch the Lease of lock {namespace}/{name}")),
        Err(_) => Ok((
            EXIT_NOT_ACQUIRED,
            format!("lock {namespace}/{name} was not {} within {:?}", describe(&args.until), args.timeout),
        )),
    }
}

fn describe(until: &Until) -> String {
    match until {
        Until::Free => "free".to_owned(),
        Until::Held => "held".to_owned(),
        Until::GrantedTo(who) => format!("granted to {who}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "11111111-1111-1111-1111-111111111111";

    fn lease(holder: Option<&str>, renewed: &str, draining: bool) -> Lease {
        let mut annotations = json!({"leasehold.dev/fencing-token": "5"});
        if draining {
            annotations["leasehold.dev/draining"] = json!("5");
        }
        serde_json::from_value(json!({
            "metadata": {"name": "orders", "annotations": annotations},
            "spec": {"holderIdentity": holder, "acquireTime": "2026-12-01T11:00:00.000000Z", "renewTime": renewed},
        }))
        .expect("a Lease")
    }

    #[test]
    fn conditions() {
        let id = format!("web-a_{UID}");
        let granted = lease(Some(&id), "2026-12-01T11:00:00.000000Z", false);
        let confirmed = lease(Some(&id), "2026-12-01T11:00:02.000000Z", false);
        let draining = lease(Some(&id), "2026-12-01T11:00:02.000000Z", true);
        let free = lease(None, "2026-12-01T11:00:02.000000Z", false);
        let to = |who: &str| Until::GrantedTo(who.to_owned());
        let cases: [(&Until, Option<&Lease>, bool); 14] = [
            (&Until::Free, None, true),
            (&Until::Free, Some(&free), true),
            (&Until::Free, Some(&confirmed), false),
            (&Until::Free, Some(&draining), false),
            (&Until::Held, Some(&confirmed), true),
            (&Until::Held, Some(&granted), false),
            (&Until::Held, Some(&draining), false),
            (&Until::Held, Some(&free), false),
            (&Until::Held, None, false),
            (&to(&id), Some(&confirmed), true),
            (&to("web-a"), Some(&confirmed), true),
            (&to("web-b"), Some(&confirmed), false),
            (&to("web-a"), Some(&granted), false),
            (&to("web-a"), Some(&draining), false),
        ];
        for (until, lease, expected) in cases {
            assert_eq!(holds(until, lease), expected, "{until:?} on {lease:?}");
        }
    }

    #[test]
    fn until_argument() {
        assert_eq!(parse_until("free"), Ok(Until::Free));
        assert_eq!(parse_until("held"), Ok(Until::Held));
        assert_eq!(parse_until("granted-to=web-a"), Ok(Until::GrantedTo("web-a".into())));
        for bad in ["", "granted-to=", "granted-to", "Free", "released"] {
            assert!(parse_until(bad).is_err(), "{bad}");
        }
    }
}
