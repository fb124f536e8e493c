use super::*;
use serde_json::json;

const UID_A: &str = "11111111-1111-1111-1111-111111111111";
const UID_B: &str = "22222222-2222-2222-2222-222222222222";
const UID_C: &str = "33333333-3333-3333-3333-333333333333";

fn now() -> Timestamp {
    "2026-12-01T12:00:00Z".parse().expect("valid")
}

fn lock(status: serde_json::Value) -> DistributedLock {
    serde_json::from_value(json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLock",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {},
        "status": status,
    }))
    .expect("a DistributedLock")
}

fn lease(holder: Option<&str>, acquired: &str, renewed: &str, annotations: serde_json::Value) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": "orders", "namespace": "shop", "annotations": annotations},
        "spec": {"holderIdentity": holder, "acquireTime": acquired, "renewTime": renewed},
    }))
    .expect("a Lease")
}

fn claim(pod: &str, uid: &str, created: &str) -> LockClaim {
    serde_json::from_value(json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "LockClaim",
        "metadata": {"name": format!("orders.{uid}"), "namespace": "shop", "uid": format!("claim-{uid}"),
            "resourceVersion": "7", "creationTimestamp": created},
        "spec": {"lock": "orders", "claimant": format!("{pod}_{uid}"), "pod": pod,
            "requestTime": created, "renewTime": created, "ttlSeconds": 45},
    }))
    .expect("a LockClaim")
}

fn observed(lease: Option<Lease>, claims: Vec<LockClaim>) -> Observed {
    let status = json!({
        "fencingToken": 1_764_590_000_123_i64,
        "queueLength": 2,
        "stats": {"grants": 4, "releases": 3, "expirations": 0, "forcedReleases": 0, "lastWaitSeconds": 1.5},
        "conditions": [
            {"type": "Held", "status": "True", "reason": "Held", "message": "held",
             "lastTransitionTime": "2026-12-01T11:58:00Z"},
            {"type": "Ready", "status": "True", "reason": "LeaseOwned", "message": "ok",
             "lastTransitionTime": "2026-12-01T10:00:00Z"},
        ],
        "forceReleaseHistory": [
            {"at": "2026-12-01T09:00:00Z", "event": "Requested", "by": "alice", "request": "orders-x"},
            {"at": "2026-12-01T09:01:00Z", "event": "Denied", "by": "bob", "request": "orders-x", "message": "no"},
        ],
    });
    Observed {
        lock: lock(status),
        lease,
        slots: vec![],
        claims,
        requests: vec![],
        owners: [("web-a".to_owned(), "ReplicaSet/web-5d8f".to_owned())].into(),
        now: now(),
    }
}

fn held_lease() -> Lease {
    lease(
        Some(&format!("web-a_{UID_A}")),
        "2026-12-01T11:58:00.000000Z",
        "2026-12-01T11:59:58.000000Z",
        json!({"leasehold.dev/fencing-token": "1764590000123", "leasehold.dev/claim": format!("orders.{UID_A}")}),
    )
}

#[test]
fn holder_queue_and_waits() {
    // b claimed before c; a's own claim (the holder's) is not a waiter.
    let claims = vec![
        claim("web-c", UID_C, "2026-12-01T11:59:30Z"),
        claim("web-b", UID_B, "2026-12-01T11:58:10Z"),
        claim("web-a", UID_A, "2026-12-01T11:57:59Z"),
    ];
    let v = lock_view(&observed(Some(held_lease()), claims));
    assert_eq!(v.state, "Held");
    let holder = v.holder.as_ref().expect("held");
    assert_eq!(holder.who.display, "pod web-a (ReplicaSet/web-5d8f)");
    assert_eq!(holder.token, Some(1_764_590_000_123));
    assert_eq!(holder.held_seconds, Some(120.0));
    let queue: Vec<(usize, &str, f64)> =
        v.queue.iter().map(|w| (w.position, w.who.display.as_str(), w.waiting_seconds)).collect();
    assert_eq!(queue, [(1, "pod web-b", 110.0), (2, "pod web-c", 30.0)]);
    let text = lock_text(&v);
    for line in [
        "Holder:    pod web-a (ReplicaSet/web-5d8f)",
        "Token:     1764590000123",
        "Held for:  2m0s",
        "1  pod web-b  1m50s    web-b_22222222-2222-2222-2222-222222222222",
        "2  pod web-c  30s      web-c_33333333-3333-3333-3333-333333333333",
        "Ready  True    LeaseOwned",
        "Denied     bob    orders-x  no",
        "Stats: 4 grants, 3 releases, 0 expirations, 0 forced releases; last wait 1s",
        "Pending force-release requests (0):\n  (none)",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn every_holder_of_a_lock_with_permits_with_its_slot_and_mode() {
    // Slot 0 free, slot 1 held by a reader, slot 2 granted to b, not confirmed yet; c waits,
    // and the holders' own claims are no waiters.
    let free = lease(None, "2026-12-01T11:00:00.000000Z", "2026-12-01T11:00:00.000000Z", json!({}));
    let reader = held_lease();
    let granted = lease(
        Some(&format!("web-b_{UID_B}")),
        "2026-12-01T11:59:59.000000Z",
        "2026-12-01T11:59:59.000000Z",
        json!({"leasehold.dev/fencing-token": "1764590000124"}),
    );
    let claims = vec![
        claim("web-c", UID_C, "2026-12-01T11:59:30Z"),
        claim("web-b", UID_B, "2026-12-01T11:58:10Z"),
        claim("web-a", UID_A, "2026-12-01T11:57:59Z"),
    ];
    let mut o = observed(Some(free), claims);
    o.lock.spec.permits = 3;
    o.slots = vec![(1, reader), (2, granted)];
    let v = lock_view(&o);
    assert_eq!((v.state.as_str(), v.permits), ("Held", 3));
    assert!(v.holder.is_none(), "slot 0 is free");
    let holders: Vec<(u32, &str, &str, Option<i64>)> =
        v.holders.iter().map(|h| (h.slot, h.holder.who.display.as_str(), h.state.as_str(), h.holder.token)).collect();
    assert_eq!(
        holders,
        [
            (1, "pod web-a (ReplicaSet/web-5d8f)", "Held", Some(1_764_590_000_123)),
            (2, "pod web-b", "Granted", Some(1_764_590_000_124))
        ]
    );
    let queue: Vec<&str> = v.queue.iter().map(|w| w.who.display.as_str()).collect();
    assert_eq!(queue, ["pod web-c"]);
    let text = lock_text(&v);
    for line in [
        "Permits:   2/3 held",
        "SLOT  HOLDER                           MODE  TOKEN          HELD  STATE",
        "1     pod web-a (ReplicaSet/web-5d8f)  Read  1764590000123  2m0s  Held",
        "2     pod web-b                        Read  1764590000124  1s    Granted",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("Holder:"), "a lock with permits shows its holders, not one holder:\n{text}");

    // A writer holds slot 0 alone.
    let mut writer = held_lease();
    writer.metadata.annotations.get_or_insert_default().insert("leasehold.dev/mode".into(), "Write".into());
    let mut o = observed(Some(writer), vec![]);
    o.lock.spec.permits = 3;
    let v = lock_view(&o);
    assert_eq!(v.holders.iter().map(|h| (h.slot, h.mode.as_str())).collect::<Vec<_>>(), [(0, "Write")]);
    assert!(lock_text(&v).contains("Permits:   1/3 held"));
    let json = serde_json::to_value(&v).expect("serializes");
    assert_eq!(json["holders"][0]["mode"], "Write");
    assert_eq!(json["holders"][0]["slot"], 0);
    assert_eq!(json["holders"][0]["pod"], "web-a", "the holder's fields are flattened into the slot's");
}

#[test]
fn states_of_the_lease() {
    let free = lease(None, "2026-12-01T11:00:00.000000Z", "2026-12-01T11:00:00.000000Z", json!({}));
    let granted = lease(
        Some(&format!("web-a_{UID_A}")),
        "2026-12-01T11:59:59.000000Z",
        "2026-12-01T11:59:59.000000Z",
        json!({"leasehold.dev/fencing-token": "9"}),
    );
    let draining = lease(
        Some(&format!("web-a_{UID_A}")),
        "2026-12-01T11:00:00.000000Z",
        "2026-12-01T11:59:00.000000Z",
        json!({"leasehold.dev/fencing-token": "9", "leasehold.dev/draining": "9", "leasehold.dev/revoked": "MaxHold"}),
    );
    let cases = [
        (None, "NoLease", None, None),
        (Some(free), "Free", None, None),
        (Some(granted), "Granted", Some("pod web-a (ReplicaSet/web-5d8f)"), None),
        (Some(draining), "Draining", Some("pod web-a (ReplicaSet/web-5d8f)"), Some("token 9 revoked: MaxHold")),
    ];
    for (lease, state, holder, drain) in cases {
        let v = lock_view(&observed(lease, vec![]));
        assert_eq!(v.state, state);
        assert_eq!(v.holder.as_ref().map(|h| h.who.display.as_str()), holder, "{state}");
        assert_eq!(v.draining.as_deref(), drain, "{state}");
        assert!(lock_text(&v).contains(&format!("State:     {state}\n")), "{state}");
    }
}

#[test]
fn claimants_are_named_for_people() {
    let owners: BTreeMap<String, String> = [("web-a".to_owned(), "Job/nightly".to_owned())].into();
    let cases = [
        (format!("web-a_{UID_A}"), "pod web-a (Job/nightly)", Some("web-a"), None),
        (format!("web-b_{UID_B}"), "pod web-b", Some("web-b"), None),
        (
            "alice@example.com/u-laptop-3-1a2b3c4d".to_owned(),
            "alice@example.com on laptop-3",
            None,
            Some("alice@example.com"),
        ),
        (
            "system:serviceaccount:ci:runner/u-ci-0f0f0f0f".to_owned(),
            "system:serviceaccount:ci:runner on ci",
            None,
            Some("system:serviceaccount:ci:runner"),
        ),
        ("something-else".to_owned(), "something-else", None, None),
    ];
    for (id, display, pod, user) in cases {
        let w = who(&Identity::parse(&id), &owners);
        assert_eq!((w.display.as_str(), w.pod.as_deref(), w.user.as_deref()), (display, pod, user), "{id}");
    }
}

#[test]
fn malformed_claims_and_other_locks_claims_are_not_waiters() {
    let mut squatter = claim("web-b", UID_B, "2026-12-01T11:58:00Z");
    squatter.metadata.name = Some("orders.not-the-uid".into());
    let mut other = claim("web-c", UID_C, "2026-12-01T11:58:00Z");
    other.spec.lock = "payments".into();
    let v = lock_view(&observed(Some(held_lease()), vec![squatter, other]));
    assert_eq!(v.queue, vec![]);
}

#[test]
fn only_open_requests_of_this_lock_are_pending() {
    let request = |name: &str, lock: &str, phase: Option<&str>| -> ForceReleaseRequest {
        serde_json::from_value(json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "ForceReleaseRequest",
            "metadata": {"name": name, "namespace": "shop", "creationTimestamp": "2026-12-01T11:00:00Z"},
            "spec": {"lock": lock, "reason": "stuck", "requester": "alice", "ttlSeconds": 3600},
            "status": phase.map_or(json!({}), |p| json!({"phase": p, "approvalsText": "1/2"})),
        }))
        .expect("a ForceReleaseRequest")
    };
    let mut o = observed(Some(held_lease()), vec![]);
    o.requests = vec![
        request("open", "orders", None),
        request("approved", "orders", Some("Approved")),
        request("done", "orders", Some("Executed")),
        request("elsewhere", "payments", None),
    ];
    let v = lock_view(&o);
    let names: Vec<(&str, &str, &str)> =
        v.pending_requests.iter().map(|r| (r.name.as_str(), r.phase.as_str(), r.approvals.as_str())).collect();
    assert_eq!(names, [("approved", "Approved", "1/2"), ("open", "Pending", "0/?")]);
}

#[test]
fn json_shape_is_stable() {
    let v = lock_view(&observed(Some(held_lease()), vec![claim("web-b", UID_B, "2026-12-01T11:58:10Z")]));
    let json = serde_json::to_value(&v).expect("serializes");
    let mut keys: Vec<&str> = json.as_object().expect("object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "conditions",
            "fencingToken",
            "history",
            "holder",
            "holders",
            "lock",
            "namespace",
            "pendingRequests",
            "permits",
            "queue",
            "state",
            "stats"
        ]
    );
    assert_eq!(json["holder"]["pod"], "web-a");
    assert_eq!(json["holder"]["owner"], "ReplicaSet/web-5d8f");
    assert_eq!(json["holder"]["token"], 1_764_590_000_123_i64);
    assert_eq!(json["holder"]["heldSeconds"], 120.0);
    assert_eq!(json["queue"][0]["position"], 1);
    assert_eq!(json["queue"][0]["waitingSeconds"], 110.0);
    assert_eq!(json["queue"][0]["claim"], format!("orders.{UID_B}"));
    assert_eq!(json["conditions"][1]["reason"], "LeaseOwned");
}

#[test]
fn ages() {
    for (seconds, text) in [
        (0.0, "0s"),
        (59.9, "59s"),
        (60.0, "1m0s"),
        (3599.0, "59m59s"),
        (3600.0, "1h0m"),
        (90_061.0, "1d1h"),
        (-5.0, "0s"),
    ] {
        assert_eq!(age(seconds), text, "{seconds}");
    }
}

#[test]
fn rows_of_several_locks() {
    let held = lock(json!({
        "holder": {"identity": format!("web-a_{UID_A}"), "pod": "web-a", "fencingToken": 7,
            "acquiredAt": "2026-12-01T11:55:00Z", "waitedSeconds": 0.2},
        "queueLength": 3,
        "conditions": [{"type": "Ready", "status": "True", "reason": "LeaseOwned", "message": "",
            "lastTransitionTime": "2026-12-01T10:00:00Z"}],
    }));
    let mut free = lock(json!({}));
    free.metadata.name = Some("alpha".into());
    let rows = [lock_row(&held, now()), lock_row(&free, now())];
    assert_eq!(
        rows_text(&rows),
        "NAMESPACE  LOCK    HOLDER  TOKEN  HELD  WAITERS  READY\n\
         shop       alpha   -       -      -     0        -\n\
         shop       orders  web-a   7      5m0s  3        LeaseOwned\n"
    );
}
