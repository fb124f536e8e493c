//! `leasehold check`: whether an installation can work, asked of the API server the way
//! the real requests go — the chart runs it as its `helm test`, and after installs and
//! upgrades. It checks:
//! - the Kubernetes version is one Leasehold supports ([`OLDEST_SUPPORTED`]);
//! - the three CRDs are established and serve `v1alpha1`;
//! - the webhook configurations exist and every webhook carries a CA bundle;
//! - the API server reaches each webhook over TLS and gets its answer: dry-run requests
//!   (nothing is stored) that each webhook must see, in a namespace where they apply — an
//!   opted-in Pod must come back with the sidecar, a fenced write without a lock must be
//!   refused by the fence, a force release of a lock that is not held must be refused by
//!   the force-release webhook. "failed calling webhook" is what an unreachable port, a
//!   pod network the API server cannot route to, or a certificate it does not trust
//!   produce, and the finding says which.
//!
//! - a controller replica leads: its election Lease is held and renewed within its lease
//!   duration;
//! - the webhooks' CA bundles are valid and not about to expire (a warning within
//!   `--cert-warn-days`);
//! - the guard (the lock Lease and LockClaim ValidatingAdmissionPolicies and their
//!   bindings) is installed.
//!
//! Every finding is printed as `ok`, `WARN` or `FAIL` with what was found, and a fix where
//! one is known; the exit status is 1 if any failed (warnings do not fail). With `--wait`,
//! the checks run again until none fails or the wait is over, and the last round is
//! printed: the chart's install check waits so for a release to be usable.

mod install;

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::crd::{ANNOTATION_FORCE_RELEASE, DistributedLock, LABEL_INJECT};
use crate::webhook::inject::SIDECAR_NAME;

/// The oldest Kubernetes release Leasehold supports: ValidatingAdmissionPolicy
/// `admissionregistration.k8s.io/v1`, which the guard needs, is GA from 1.30.
pub const OLDEST_SUPPORTED: (u32, u32) = (1, 30);

/// The CRDs an installation needs.
const CRDS: [&str; 3] =
    ["distributedlocks.leasehold.dev", "lockclaims.leasehold.dev", "forcereleaserequests.leasehold.dev"];

/// Name of the dry-run probe objects.
const PROBE: &str = "leasehold-check";

/// `leasehold check` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Name of the Mutating and Validating webhook configurations (the chart's fullname).
    #[arg(long, default_value = "leasehold")]
    pub webhook_configuration: String,
    /// A namespace where the webhooks apply, for the dry-run probes (nothing is stored
    /// there); not the release namespace, which the webhooks never see.
    #[arg(long, default_value = "default")]
    pub probe_namespace: String,
    /// The namespace the controller runs in (the release namespace): where its election
    /// Lease is.
    #[arg(long, default_value = "leasehold-system")]
    pub controller_namespace: String,
    /// The controller's election Lease (its `--election-name`); empty for a controller
    /// that runs without leader election (the leader is then not checked).
    #[arg(long, default_value = "leasehold-controller")]
    pub election_name: String,
    /// Warn when a webhook CA certificate expires within this many days.
    #[arg(long, default_value_t = 30)]
    pub cert_warn_days: u32,
    /// The guard's ValidatingAdmissionPolicies (each with a binding of the same name).
    #[arg(long = "guard-policy", default_values_t = [
        crate::webhook::guard::lease::POLICY_NAME.to_owned(),
        crate::webhook::guard::claim::POLICY_NAME.to_owned(),
    ])]
    pub guard_policies: Vec<String>,
    /// Check again, a second after each round, until no check fails or this long has
    /// passed (`2m`; no round starts after it); `0s` checks once. For an installation just
    /// made: the API server reaches the webhooks only once their Service routes to the
    /// ready replicas, a moment after they are Ready.
    #[arg(long, value_parser = crate::duration::parse_duration, default_value = "0s")]
    pub wait: Duration,
}

/// The pause between two rounds of checks under `--wait`.
const AGAIN_AFTER: Duration = Duration::from_secs(1);

/// Whether to check again: something failed, and another round fits in the `left` of the
/// wait.
pub fn check_again(findings: &[Finding], left: Duration) -> bool {
    findings.iter().any(Finding::failed) && left >= AGAIN_AFTER
}

/// Runs every check ([`run`]), round after round until none fails or `config.wait` has
/// passed; the findings of the last round. Each round that had failures names them on
/// stderr, so that a wait that ran out says what it waited for.
pub async fn run_until_passing(config: &Config) -> anyhow::Result<Vec<Finding>> {
    let deadline = tokio::time::Instant::now() + config.wait;
    loop {
        let findings = run(config).await?;
        if !check_again(&findings, deadline.saturating_duration_since(tokio::time::Instant::now())) {
            return Ok(findings);
        }
        let failing: Vec<&str> = findings.iter().filter(|f| f.failed()).map(|f| f.what.as_str()).collect();
        eprintln!("leasehold check: waiting for {}", failing.join(", "));
        tokio::time::sleep(AGAIN_AFTER).await;
    }
}

/// How a checked fact stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// It holds.
    Ok,
    /// It holds, but will not for long (a certificate near its expiry).
    Warn,
    /// It does not hold: the installation cannot work as it should.
    Fail,
}

/// One checked fact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was checked.
    pub what: String,
    /// How it stands.
    pub level: Level,
    /// What was found, or what is wrong and where to look.
    pub detail: String,
    /// How to fix it, where that is known.
    pub hint: Option<String>,
}

impl Finding {
    fn ok(what: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding { what: what.into(), level: Level::Ok, detail: detail.into(), hint: None }
    }

    fn warn(what: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding { what: what.into(), level: Level::Warn, detail: detail.into(), hint: None }
    }

    fn fail(what: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding { what: what.into(), level: Level::Fail, detail: detail.into(), hint: None }
    }

    fn with_hint(mut self, hint: impl Into<String>) -> Finding {
        self.hint = Some(hint.into());
        self
    }

    /// Whether it failed.
    pub fn failed(&self) -> bool {
        self.level == Level::Fail
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let level = match self.level {
            Level::Ok => "ok",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        write!(f, "{level:<4}  {}: {}", self.what, self.detail)?;
        match &self.hint {
            Some(hint) if self.level != Level::Ok => write!(f, "\n      fix: {hint}"),
            _ => Ok(()),
        }
    }
}

/// The leading number of a version part: providers append suffixes ("30+" on EKS and GKE).
fn number(part: &str) -> Option<u32> {
    let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Judges the API server's reported version against [`OLDEST_SUPPORTED`].
pub fn version_finding(major: &str, minor: &str, git_version: &str) -> Finding {
    let what = "kubernetes version";
    let (oldest_major, oldest_minor) = OLDEST_SUPPORTED;
    match (number(major), number(minor)) {
        (Some(major), Some(minor)) if (major, minor) >= OLDEST_SUPPORTED => {
            Finding::ok(what, format!("{git_version} ({oldest_major}.{oldest_minor} or later is supported)"))
        }
        (Some(_), Some(_)) => Finding::fail(
            what,
            format!(
                "{git_version} is older than {oldest_major}.{oldest_minor}, the oldest release Leasehold supports \
                 (it needs ValidatingAdmissionPolicy admissionregistration.k8s.io/v1)"
            ),
        ),
        _ => Finding::fail(what, format!("cannot read the version {major:?}.{minor:?} ({git_version})")),
    }
}

/// The finding on webhook configuration `kind`/`name`, read as its webhooks' names and
/// whether each has a CA bundle.
fn configuration(kind: &str, name: &str, read: kube::Result<Option<Vec<(String, bool)>>>) -> Finding {
    match read {
        Ok(Some(hooks)) => match hooks.iter().filter(|(_, has)| !has).map(|(n, _)| n.as_str()).collect::<Vec<_>>() {
            missing if missing.is_empty() => {
                Finding::ok(format!("{kind} {name}"), format!("{} webhooks, each with a CA bundle", hooks.len()))
            }
            missing => Finding::fail(
                format!("{kind} {name}"),
                format!(
                    "no CA bundle on {}: with cert-manager, its CA injector has not filled it in",
                    missing.join(", ")
                ),
            ),
        },
        Ok(None) => Finding::fail(format!("{kind} {name}"), "missing"),
        Err(e) => Finding::fail(format!("{kind} {name}"), format!("cannot read it: {e}")),
    }
}

/// Judges the answer to a dry-run request that webhook `webhook` must see. `Ok` carries
/// whether the answer shows the webhook's work (`expected` says what that is); `Err` the
/// API server's refusal.
pub fn probe_finding(webhook: &str, expected: &str, answer: Result<bool, String>) -> Finding {
    let what = format!("webhook {webhook}");
    match answer {
        Ok(true) => Finding::ok(what, format!("reached by the API server: {expected}")),
        Ok(false) => Finding::fail(
            what,
            format!(
                "the request went through without it ({expected} expected): is its failurePolicy Ignore while it is unreachable, or is the namespace excluded?"
            ),
        ),
        Err(message) if message.contains(&format!("failed calling webhook \"{webhook}\"")) => {
            let lower = message.to_lowercase();
            // The URL in the message carries `?timeout=10s`: look for the causes' own words.
            let why = if lower.contains("connection refused") || lower.contains("no endpoints") {
                "no controller replica serves it (is the Deployment ready?)"
            } else if lower.contains("x509") || lower.contains("certificate") || lower.contains("tls:") {
                "the API server does not trust the webhook's certificate: its caBundle and the serving certificate differ (rotate the Secret, or check cert-manager's CA injection)"
            } else if ["deadline exceeded", "i/o timeout", "timed out", "client.timeout", "no route to host"]
                .iter()
                .any(|words| lower.contains(words))
            {
                "the API server cannot reach the webhook in time: a firewall or a pod network it cannot route to (see docs/platforms.md: ports.webhook, hostNetwork)"
            } else {
                "the API server cannot call it"
            };
            Finding::fail(what, format!("{why}: {message}"))
        }
        Err(message) if message.contains(webhook) => {
            Finding::ok(what, format!("reached by the API server: {expected}"))
        }
        Err(message) => Finding::fail(what, format!("the probe was refused by something else: {message}")),
    }
}

/// The CA bundles of the webhooks of configuration `name`, each with its webhook's name
/// (unreadable configurations are reported by their own finding).
async fn ca_bundles(client: &kube::Client, name: &str) -> Vec<(String, Vec<u8>)> {
    let mut bundles = Vec::new();
    if let Ok(Some(c)) = Api::<MutatingWebhookConfiguration>::all(client.clone()).get_opt(name).await {
        bundles.extend(c.webhooks.into_iter().flatten().filter_map(|w| Some((w.name, w.client_config.ca_bundle?.0))));
    }
    if let Ok(Some(c)) = Api::<ValidatingWebhookConfiguration>::all(client.clone()).get_opt(name).await {
        bundles.extend(c.webhooks.into_iter().flatten().filter_map(|w| Some((w.name, w.client_config.ca_bundle?.0))));
    }
    bundles.retain(|(_, pem)| !pem.is_empty());
    bundles
}

/// Runs every check.
pub async fn run(config: &Config) -> anyhow::Result<Vec<Finding>> {
    use anyhow::Context as _;
    let client = crate::kube_client::client().await.context("failed to build a Kubernetes client")?;
    let mut findings = Vec::new();

    findings.push(match client.apiserver_version().await {
        Ok(info) => version_finding(&info.major, &info.minor, &info.git_version),
        Err(e) => Finding::fail("kubernetes version", format!("cannot read /version: {e}")),
    });

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in CRDS {
        let what = format!("crd {name}");
        findings.push(match crds.get_opt(name).await {
            Ok(Some(crd)) => {
                let established = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
                let serves = crd.spec.versions.iter().any(|v| v.name == "v1alpha1" && v.served);
                match (established, serves) {
                    (true, true) => Finding::ok(what, "established, serving v1alpha1"),
                    (false, _) => Finding::fail(what, "not established yet"),
                    (true, false) => Finding::fail(what, "does not serve v1alpha1"),
                }
            }
            Ok(None) => Finding::fail(what, "missing (crds.enabled=false? apply the release's CRDs first)"),
            Err(e) => Finding::fail(what, format!("cannot read it: {e}")),
        });
    }

    let name = &config.webhook_configuration;
    let has_bundle = |c: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig| {
        c.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty())
    };
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone()).get_opt(name).await.map(|c| {
        c.map(|c| {
            c.webhooks.unwrap_or_default().iter().map(|w| (w.name.clone(), has_bundle(&w.client_config))).collect()
        })
    });
    findings.push(configuration("mutatingwebhookconfiguration", name, mutating));
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone()).get_opt(name).await.map(|c| {
        c.map(|c| {
            c.webhooks.unwrap_or_default().iter().map(|w| (w.name.clone(), has_bundle(&w.client_config))).collect()
        })
    });
    findings.push(configuration("validatingwebhookconfiguration", name, validating));

    findings.push(install::certificate_finding(
        &ca_bundles(&client, name).await,
        jiff::Timestamp::now(),
        config.cert_warn_days,
    ));

    if config.election_name.is_empty() {
        findings.push(Finding::ok("controller leader", "not checked: the controller runs without leader election"));
    } else {
        let election = Api::<Lease>::namespaced(client.clone(), &config.controller_namespace)
            .get_opt(&config.election_name)
            .await
            .map_err(|e| e.to_string());
        findings.push(install::leader_finding(
            &config.controller_namespace,
            &config.election_name,
            election.as_ref().map(Option::as_ref).map_err(Clone::clone),
            jiff::Timestamp::now(),
        ));
    }

    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let mut guard = Vec::new();
    for policy in &config.guard_policies {
        let state = match (policies.get_opt(policy).await, bindings.get_opt(policy).await) {
            (Ok(p), Ok(b)) => Ok((p.is_some(), b.is_some())),
            (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
        };
        guard.push((policy.clone(), state));
    }
    findings.push(install::guard_finding(&guard));

    let namespace = &config.probe_namespace;
    let dry_run = PostParams { dry_run: true, field_manager: Some(crate::crd::MANAGER_CLI.into()) };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": PROBE, "labels": {LABEL_INJECT: "true"}},
        "spec": {"containers": [{"name": "probe", "image": "leasehold-check.invalid/probe:1"}]},
    }))?;
    let answer = Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&dry_run, &pod)
        .await
        .map(|p| {
            let spec = p.spec.unwrap_or_default();
            spec.init_containers.iter().flatten().chain(spec.containers.iter()).any(|c| c.name == SIDECAR_NAME)
        })
        .map_err(|e| e.to_string());
    findings.push(probe_finding("inject.leasehold.dev", "an opted-in Pod gets the sidecar", answer));

    let fenced: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": PROBE, "labels": {"leasehold.dev/fenced-by": PROBE},
            "annotations": {"leasehold.dev/fencing-token": "1"}},
    }))?;
    let answer = Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&dry_run, &fenced)
        .await
        .map(|_| false)
        .map_err(|e| e.to_string());
    findings.push(probe_finding("fenced.leasehold.dev", "a fenced write without its lock is refused", answer));

    let mut lock = DistributedLock::new(PROBE, Default::default());
    lock.metadata.annotations = Some([(ANNOTATION_FORCE_RELEASE.to_owned(), "leasehold check".to_owned())].into());
    let answer = Api::<DistributedLock>::namespaced(client.clone(), namespace)
        .create(&dry_run, &lock)
        .await
        .map(|l| l.metadata.annotations.is_some_and(|a| a.contains_key(crate::crd::ANNOTATION_FORCE_RELEASE_BY)))
        .map_err(|e| e.to_string());
    findings.push(probe_finding("force-release.leasehold.dev", "a force release is stamped or refused", answer));

    let request: crate::crd::ForceReleaseRequest = serde_json::from_value(json!({
        "metadata": {"name": PROBE},
        "spec": {"lock": PROBE, "reason": "leasehold check"},
    }))?;
    let answer = Api::<crate::crd::ForceReleaseRequest>::namespaced(client, namespace)
        .create(&dry_run, &request)
        .await
        .map(|r| r.spec.requester.is_some())
        .map_err(|e| e.to_string());
    let expected = "a force-release request is stamped with its requester or refused";
    findings.push(probe_finding("force-release-requests.leasehold.dev", expected, answer));
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_table() {
        for (major, minor, ok) in [
            ("1", "30", true),
            ("1", "36", true),
            ("1", "30+", true),
            ("2", "0", true),
            ("1", "29", false),
            ("1", "29+", false),
            ("1", "", false),
            ("x", "30", false),
        ] {
            let finding = version_finding(major, minor, "vX");
            assert_eq!(finding.level == Level::Ok, ok, "{major}.{minor}: {finding}");
        }
        assert!(version_finding("1", "29", "v1.29.15").detail.contains("older than 1.30"));
    }

    #[test]
    fn checks_again_only_while_something_fails_and_another_round_fits_in_the_wait() {
        let ok = || Finding::ok("a", "fine");
        let warned = || Finding::warn("b", "soon");
        let failed = || Finding::fail("c", "broken");
        let second = Duration::from_secs(1);
        let cases: [(Vec<Finding>, Duration, bool); 7] = [
            (vec![], Duration::from_secs(60), false),
            (vec![ok(), warned()], Duration::from_secs(60), false),
            (vec![ok(), failed()], Duration::from_secs(60), true),
            (vec![failed()], second, true),
            (vec![failed()], second - Duration::from_millis(1), false),
            (vec![failed()], Duration::ZERO, false),
            (vec![warned(), failed()], Duration::from_secs(2), true),
        ];
        for (findings, left, again) in cases {
            assert_eq!(check_again(&findings, left), again, "{findings:?} with {left:?} left");
        }
    }

    #[test]
    fn probe_table() {
        let webhook = "inject.leasehold.dev";
        let call = |e: &str| Err(format!("Internal error occurred: failed calling webhook \"{webhook}\": {e}"));
        let post = "failed to call webhook: Post \"https://leasehold-webhook.leasehold-system.svc:443/mutate/pods?timeout=10s\"";
        let cases: [(Result<bool, String>, bool, &str); 9] = [
            (Ok(true), true, "reached"),
            (Ok(false), false, "went through without it"),
            (
                call(&format!(
                    "{post}: tls: failed to verify certificate: x509: certificate signed by unknown authority"
                )),
                false,
                "does not trust",
            ),
            (call(&format!("{post}: context deadline exceeded")), false, "docs/platforms.md"),
            (call(&format!("{post}: dial tcp 10.0.0.7:9443: i/o timeout")), false, "docs/platforms.md"),
            (
                call(&format!("{post}: dial tcp 127.0.0.1:9443: connect: connection refused")),
                false,
                "no controller replica",
            ),
            (call("no endpoints available for service \"leasehold-webhook\""), false, "no controller replica"),
            (Err(format!("admission webhook \"{webhook}\" denied the request: no")), true, "reached"),
            (Err("pods \"leasehold-check\" is forbidden: User cannot create".into()), false, "something else"),
        ];
        for (answer, ok, says) in cases {
            let finding = probe_finding(webhook, "the sidecar", answer.clone());
            assert_eq!(finding.level == Level::Ok, ok, "{answer:?}: {finding}");
            assert!(finding.detail.contains(says), "{answer:?}: {finding}");
        }
    }
}
