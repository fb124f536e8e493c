use super::*;
use crate::check::Level;
use serde_json::json;

fn at(s: &str) -> Timestamp {
    s.parse().expect("a timestamp")
}

fn lease(holder: Option<&str>, renewed: Option<&str>) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": "leasehold-controller", "namespace": "leasehold-system"},
        "spec": {"holderIdentity": holder, "renewTime": renewed, "leaseDurationSeconds": 15},
    }))
    .expect("a Lease")
}

#[test]
fn leader_table() {
    let now = at("2026-12-01T12:00:00Z");
    let fresh = lease(Some("leasehold-7d9-abc"), Some("2026-12-01T11:59:55.000000Z"));
    let stale = lease(Some("leasehold-7d9-abc"), Some("2026-12-01T11:59:00.000000Z"));
    let nobody = lease(None, Some("2026-12-01T11:59:55.000000Z"));
    let empty = lease(Some(""), None);
    type Read<'a> = Result<Option<&'a Lease>, String>;
    let cases: [(Read<'_>, bool, &str); 6] = [
        (Ok(Some(&fresh)), true, "leasehold-7d9-abc leads"),
        (Ok(Some(&stale)), false, "longer ago than its 15s lease duration"),
        (Ok(Some(&nobody)), false, "names no holder"),
        (Ok(Some(&empty)), false, "names no holder"),
        (Ok(None), false, "no replica has ever led"),
        (Err("forbidden".into()), false, "cannot read"),
    ];
    for (read, ok, says) in cases {
        let finding = leader_finding("leasehold-system", "leasehold-controller", read.clone(), now);
        assert_eq!(finding.level == Level::Ok, ok, "{read:?}: {finding}");
        assert!(finding.detail.contains(says), "{read:?}: {finding}");
    }
}

fn ca(from: (i32, u8, u8), until: (i32, u8, u8)) -> Vec<u8> {
    let mut params =
        rcgen::CertificateParams::new(vec!["leasehold-webhook.leasehold-system.svc".into()]).expect("valid parameters");
    params.not_before = rcgen::date_time_ymd(from.0, from.1, from.2);
    params.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
    let key = rcgen::KeyPair::generate().expect("a key");
    params.self_signed(&key).expect("a certificate").pem().into_bytes()
}

#[test]
fn certificate_table() {
    let now = at("2026-12-01T12:00:00Z");
    let good = ca((2026, 1, 1), (2036, 1, 1));
    let soon = ca((2026, 1, 1), (2026, 12, 20));
    let expired = ca((2025, 1, 1), (2026, 11, 30));
    let future = ca((2027, 1, 1), (2036, 1, 1));
    let named = |pem: &Vec<u8>| ("inject.leasehold.dev".to_owned(), pem.clone());
    let both = [good.clone(), soon.clone()].concat();
    type Bundles = Vec<(String, Vec<u8>)>;
    let cases: [(Bundles, Level, &str); 7] = [
        (vec![named(&good), ("fenced.leasehold.dev".into(), good.clone())], Level::Ok, "2 CA bundles valid"),
        (vec![named(&soon)], Level::Warn, "in 18 days"),
        (vec![named(&good), named(&soon)], Level::Warn, "in 18 days"),
        (vec![("inject.leasehold.dev".into(), both)], Level::Warn, "in 18 days"),
        (vec![named(&expired)], Level::Fail, "expired at 2026-11-30"),
        (vec![named(&future)], Level::Fail, "not valid before 2027-01-01"),
        (vec![("inject.leasehold.dev".into(), b"not a certificate".to_vec())], Level::Fail, "unreadable"),
    ];
    for (bundles, level, says) in cases {
        let finding = certificate_finding(&bundles, now, 30);
        assert_eq!(finding.level, level, "{finding}");
        assert!(finding.detail.contains(says), "{says}: {finding}");
    }
    assert_eq!(certificate_finding(&[], now, 30).level, Level::Fail);
    // Past the warning window: fine.
    assert_eq!(certificate_finding(&[named(&soon)], now, 7).level, Level::Ok);
}

#[test]
fn guard_table() {
    let found = |lease: Result<(bool, bool), String>, claim: Result<(bool, bool), String>| {
        vec![("leasehold-lease-guard".to_owned(), lease), ("leasehold-claim-guard".to_owned(), claim)]
    };
    let cases = [
        (found(Ok((true, true)), Ok((true, true))), true, "present: leasehold-lease-guard, leasehold-claim-guard"),
        (found(Ok((false, false)), Ok((true, true))), false, "missing ValidatingAdmissionPolicy leasehold-lease-guard"),
        (found(Ok((true, true)), Ok((true, false))), false, "ValidatingAdmissionPolicyBinding leasehold-claim-guard"),
        (found(Err("forbidden".into()), Ok((true, true))), false, "cannot read leasehold-lease-guard"),
    ];
    for (found, ok, says) in cases {
        let finding = guard_finding(&found);
        assert_eq!(finding.level == Level::Ok, ok, "{finding}");
        assert!(finding.detail.contains(says), "{says}: {finding}");
    }
}
