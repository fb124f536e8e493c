//! The findings on what an installation runs on: a controller replica leading, the
//! webhooks' CA certificates, and the guard's policies — each a pure judgement of what was
//! read.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;

use super::Finding;

/// Judges the controller's election Lease `namespace/name`: a replica leads when the
/// Lease names a holder that renewed within its lease duration (as of `now`).
pub fn leader_finding(namespace: &str, name: &str, lease: Result<Option<&Lease>, String>, now: Timestamp) -> Finding {
    let what = "controller leader";
    let hint =
        format!("is the controller Deployment running? `kubectl -n {namespace} get pods,lease/{name}`, and its logs");
    let lease = match lease {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            return Finding::fail(what, format!("no election Lease {namespace}/{name}: no replica has ever led"))
                .with_hint(hint);
        }
        Err(e) => return Finding::fail(what, format!("cannot read Lease {namespace}/{name}: {e}")),
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    let duration = jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let renewed = spec.renew_time.map(|t| t.0);
    match (holder, renewed) {
        (Some(holder), Some(renewed)) if now.duration_since(renewed) <= duration => {
            let ago = now.duration_since(renewed).as_secs_f64().max(0.0);
            Finding::ok(what, format!("{holder} leads (Lease {namespace}/{name} renewed {ago:.0}s ago)"))
        }
        (Some(holder), renewed) => Finding::fail(
            what,
            format!(
                "{holder} holds Lease {namespace}/{name} but last renewed {}: longer ago than its {}s lease duration",
                renewed.map_or_else(|| "never".to_owned(), |t| t.to_string()),
                duration.as_secs()
            ),
        )
        .with_hint(hint),
        (None, _) => {
            Finding::fail(what, format!("Lease {namespace}/{name} names no holder: no replica leads")).with_hint(hint)
        }
    }
}

/// The validity (from, until) and subject of the certificate of a PEM bundle that expires
/// first.
fn earliest_expiry(pem: &[u8]) -> Result<(Timestamp, Timestamp, String), String> {
    let mut earliest: Option<(Timestamp, Timestamp, String)> = None;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        let cert = block.parse_x509().map_err(|e| format!("not an X.509 certificate: {e}"))?;
        let at = |t: x509_parser::time::ASN1Time| {
            Timestamp::from_second(t.timestamp()).map_err(|e| format!("a certificate time out of range: {e}"))
        };
        let (from, until) = (at(cert.validity().not_before)?, at(cert.validity().not_after)?);
        let subject = cert.subject().to_string();
        if earliest.as_ref().is_none_or(|(_, u, _)| until < *u) {
            earliest = Some((from, until, subject));
        }
    }
    earliest.ok_or_else(|| "no certificate in it".to_owned())
}

/// Judges the CA bundles the API server uses to trust the webhooks (`(webhook, PEM)`):
/// each certificate must be valid now; within `warn_days` of its expiry, a warning.
pub fn certificate_finding(bundles: &[(String, Vec<u8>)], now: Timestamp, warn_days: u32) -> Finding {
    let what = "webhook certificates";
    let hint = "renew the CA: with cert-manager, check its Certificate and CA injector; with the chart's own \
                certificate, `helm upgrade` the release (it issues a new one)";
    if bundles.is_empty() {
        return Finding::fail(what, "no webhook carries a CA bundle").with_hint(hint);
    }
    let mut soonest: Option<(Timestamp, String, String)> = None;
    for (webhook, pem) in bundles {
        match earliest_expiry(pem) {
            Err(e) => {
                return Finding::fail(what, format!("the CA bundle of {webhook} is unreadable: {e}")).with_hint(hint);
            }
            Ok((from, _, subject)) if from > now => {
                return Finding::fail(what, format!("{subject} (CA of {webhook}) is not valid before {from}"))
                    .with_hint("check the clock of the host that issued it");
            }
            Ok((_, until, subject)) => {
                if soonest.as_ref().is_none_or(|(u, _, _)| until < *u) {
                    soonest = Some((until, subject, webhook.clone()));
                }
            }
        }
    }
    let (until, subject, webhook) = soonest.expect("at least one bundle, each with a certificate");
    let left = until.duration_since(now);
    let days = left.as_secs() / 86_400;
    if left.is_negative() {
        Finding::fail(what, format!("{subject} (CA of {webhook}) expired at {until}")).with_hint(hint)
    } else if days < i64::from(warn_days) {
        Finding::warn(what, format!("{subject} (CA of {webhook}) expires at {until}, in {days} days")).with_hint(hint)
    } else {
        Finding::ok(what, format!("{} CA bundles valid; the first expiry is {until} ({days} days)", bundles.len()))
    }
}

/// What was read of one guard policy: whether the ValidatingAdmissionPolicy exists, and
/// whether its binding of the same name does.
pub type GuardRead = Result<(bool, bool), String>;

/// Judges the guard: each named policy must be there with its binding.
pub fn guard_finding(found: &[(String, GuardRead)]) -> Finding {
    let what = "lease guard";
    let hint = "the chart installs it; else apply `leasehold lease-guard --controller-user <the controller's user>`";
    let mut missing = Vec::new();
    for (name, state) in found {
        match state {
            Ok((true, true)) => {}
            Ok((false, _)) => missing.push(format!("ValidatingAdmissionPolicy {name}")),
            Ok((true, false)) => missing.push(format!("ValidatingAdmissionPolicyBinding {name}")),
            Err(e) => return Finding::fail(what, format!("cannot read {name}: {e}")),
        }
    }
    if missing.is_empty() {
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        Finding::ok(what, format!("policies and bindings present: {}", names.join(", ")))
    } else {
        Finding::fail(
            what,
            format!("missing {}: anyone allowed to write Leases could forge a lock's holder", missing.join(", ")),
        )
        .with_hint(hint)
    }
}

#[cfg(test)]
#[path = "install_tests.rs"]
mod tests;
