//! ForceReleaseRequests on the real apiserver, with real identities (ServiceAccount
//! tokens) and real RBAC: the webhook stamps who asks and who approves, a SubjectAccessReview
//! decides who may approve, and the controller acts only on an approved, unexpired request
//! whose target still holds — through the ordinary Forced revocation.

use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use leasehold::claim::{Hold, LostReason};
use leasehold::crd::{
    ANNOTATION_APPROVE, ANNOTATION_FORCE_RELEASE, DistributedLock, DistributedLockSpec, ForceReleasePolicy,
    ForceReleaseRequest, ForceReleaseRequestSpec, Phase,
};
use serde_json::json;

use super::{LOCK, WAIT, denial};
use crate::support::watch::until;
use crate::support::{Env, TestPod, leasehold_bin};

/// A lock needing `approvals`, and the request verbs for `requesters` and approvers:
/// `approvers` get the approve verb on forcereleaserequests/approval, `others` may patch
/// requests but not approve.
async fn people(env: &Env, approvals: i32, requesters: &[&TestPod], approvers: &[&TestPod], others: &[&TestPod]) {
    people_on(env, DistributedLockSpec::default(), approvals, requesters, approvers, others).await;
}

/// [`people`], on a lock made from `spec`.
async fn people_on(
    env: &Env,
    spec: DistributedLockSpec,
    approvals: i32,
    requesters: &[&TestPod],
    approvers: &[&TestPod],
    others: &[&TestPod],
) {
    let spec = DistributedLockSpec { force_release: Some(ForceReleasePolicy { approvals: Some(approvals) }), ..spec };
    env.lock(LOCK, spec).await;
    let roles: Api<Role> = Api::namespaced(env.ns.client.clone(), env.name());
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let grant = |name: &str, rules: serde_json::Value, who: &[&TestPod]| {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name}, "rules": rules});
        let subjects: Vec<_> = who
            .iter()
            .map(|p| json!({"kind": "ServiceAccount", "name": p.service_account, "namespace": env.name()}))
            .collect();
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}, "subjects": subjects});
        (name.to_owned(), role, binding)
    };
    let requests = json!([{"apiGroups": ["leasehold.dev"], "resources": ["forcereleaserequests"],
        "verbs": ["get", "list", "watch", "create", "patch", "update"]},
        {"apiGroups": ["leasehold.dev"], "resources": ["distributedlocks"], "verbs": ["get", "list", "watch"]}]);
    let approve =
        json!([{"apiGroups": ["leasehold.dev"], "resources": ["forcereleaserequests/approval"], "verbs": ["approve"]}]);
    let everyone: Vec<&TestPod> = requesters.iter().chain(approvers).chain(others).copied().collect();
    for (name, role, binding) in [grant("frr-users", requests, &everyone), grant("frr-approvers", approve, approvers)] {
        roles.patch(&name, &PatchParams::apply("e2e"), &Patch::Apply(&role)).await.expect("role");
        bindings.patch(&name, &PatchParams::apply("e2e"), &Patch::Apply(&binding)).await.expect("binding");
    }
    for pod in &everyone {
        env.wait_allowed(pod, "create", "leasehold.dev", "forcereleaserequests", None).await;
    }
}

fn user(env: &Env, pod: &TestPod) -> String {
    format!("system:serviceaccount:{}:{}", env.name(), pod.service_account)
}

fn requests_of(pod: &TestPod, env: &Env) -> Api<ForceReleaseRequest> {
    Api::namespaced(pod.client.clone(), env.name())
}

fn request(reason: &str, ttl_seconds: i32) -> ForceReleaseRequest {
    ForceReleaseRequest::new(
        "stuck",
        ForceReleaseRequestSpec {
            lock: LOCK.into(),
            reason: reason.into(),
            target_holder: None,
            target_token: None,
            ttl_seconds,
            requester: None,
            expires_at: None,
            approvals: vec![],
            denial: None,
        },
    )
}

async fn approve(api: &Api<ForceReleaseRequest>, name: &str) -> kube::Result<ForceReleaseRequest> {
    let patch = json!({"metadata": {"annotations": {ANNOTATION_APPROVE: "true"}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
}

/// Waits until the controller has judged request `name` into `phase`.
async fn phase(env: &Env, name: &str, phase: Phase) -> ForceReleaseRequest {
    let api: Api<ForceReleaseRequest> = Api::namespaced(env.ns.client.clone(), env.name());
    until(&api, name, WAIT, &format!("request {name} {phase:?}"), move |r: &ForceReleaseRequest| {
        r.status.as_ref().and_then(|s| s.phase) == Some(phase)
    })
    .await
}

/// Runs `leasehold <args>` as `pod`; returns (success, stdout + stderr).
async fn cli(env: &Env, pod: &TestPod, args: &[&str]) -> (bool, String) {
    let kubeconfig = env.log_dir().join(format!("kubeconfig-{}", pod.name));
    env.ns.kubeconfig_for_token(&pod.token, &kubeconfig).expect("kubeconfig");
    let output = tokio::process::Command::new(leasehold_bin())
        .args(args)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("run leasehold");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// `pod` asks for a force release of [`LOCK`] with `leasehold release --force`, on a lock
/// whose policy needs approvals: the CLI's output, and the one request it made, Pending.
async fn ask(env: &Env, pod: &TestPod) -> (String, ForceReleaseRequest) {
    let lock = format!("{}/{LOCK}", env.name());
    let (ok, out) = cli(env, pod, &["release", &lock, "--force", "--reason", "worker frozen"]).await;
    assert!(ok && out.contains("Pending"), "{out}");
    let api = Api::<ForceReleaseRequest>::namespaced(env.ns.client.clone(), env.name());
    let listed = api.list(&Default::default()).await.expect("list");
    assert_eq!(listed.items.len(), 1, "one request: {listed:?}");
    (out, listed.items[0].clone())
}

/// Waits until `hold` learns it was revoked.
async fn revoked(hold: &Hold) {
    match tokio::time::timeout(WAIT, hold.lost()).await {
        Ok(Some(LostReason::Revoked(_))) => {}
        other => panic!("the holder learns its hold was revoked: {other:?}"),
    }
}

async fn counted(env: &Env, controller: &crate::support::admission::WebhookController, outcome: &str) -> f64 {
    let (_, body) = controller.process.admin_get("/metrics").await.unwrap_or_default();
    let series = format!("leasehold_controller_force_release_requests_total{{outcome=\"{outcome}\"}}");
    let _ = env;
    body.lines()
        .find(|l| l.starts_with(&series))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_force_release_request_needs_a_second_persons_approval_then_revokes_the_hold() {
    let env = Env::new("adm-frr").await;
    let controller = env.webhook_controller(None, &[]).await;
    let (alice, bob, eve, holder) =
        (env.pod("alice").await, env.pod("bob").await, env.pod("eve").await, env.pod("a").await);
    // Alice asks and also holds the approve verb: her own request is still not hers to approve.
    people(&env, 1, &[], &[&alice, &bob], &[&eve]).await;
    env.wait_claim_rbac(&holder).await;
    let hold = holder.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds the lock");
    let token = hold.token();

    // Alice asks, with the CLI: the policy needs an approval, so it makes a request.
    let (out, stored) = ask(&env, &alice).await;
    assert!(out.contains("leasehold approve"), "{out}");
    let api = Api::<ForceReleaseRequest>::namespaced(env.ns.client.clone(), env.name());
    let name = stored.name_any();
    assert_eq!(stored.spec.requester.as_deref(), Some(user(&env, &alice).as_str()), "stamped from userInfo");
    assert_eq!(
        (stored.spec.target_holder.as_deref(), stored.spec.target_token),
        (Some(holder.identity().id.as_str()), Some(token)),
        "targets the hold at admission"
    );
    assert!(stored.spec.expires_at.is_some());

    // Without an approval nothing happens: judged Pending, the hold untouched.
    let pending = phase(&env, &name, Phase::Pending).await;
    assert_eq!(pending.status.as_ref().and_then(|s| s.approvals_text.as_deref()), Some("0/1"));
    let lock = env.locks().get(LOCK).await.expect("lock");
    let status = lock.status.expect("status");
    assert_eq!(status.holder.as_ref().map(|h| h.fencing_token), Some(token), "still held");
    assert_eq!(status.fencing_token, Some(token), "no token raised");
    assert_eq!(status.force_release_approvals, Some(1));
    assert!(hold.is_held(), "the holder still holds");

    // Self-approval is refused, even with the verb.
    let message = denial(approve(&requests_of(&alice, &env), &name).await);
    assert!(message.contains("cannot approve"), "{message}");
    // Eve may patch requests but lacks the approve verb.
    let message = denial(approve(&requests_of(&eve, &env), &name).await);
    assert!(message.contains("forcereleaserequests/approval") && message.contains(&user(&env, &eve)), "{message}");
    // Nobody writes an approval by hand, in anyone's name (their own included).
    let forged = json!({"spec": {"approvals": [{"by": user(&env, &bob), "at": "2030-01-01T00:00:00Z"}]}});
    let message = denial(requests_of(&bob, &env).patch(&name, &PatchParams::default(), &Patch::Merge(&forged)).await);
    assert!(message.contains("only by the admission webhook"), "{message}");
    let unchanged = api.get(&name).await.expect("request");
    assert!(unchanged.spec.approvals.is_empty(), "{:?}", unchanged.spec.approvals);
    assert_eq!(env.locks().get(LOCK).await.expect("lock").status.and_then(|s| s.fencing_token), Some(token));

    // Bob approves, with the CLI: recorded under his name, carried out.
    let (ok, out) = cli(&env, &bob, &["approve", &format!("{}/{name}", env.name())]).await;
    assert!(ok && out.contains("Executed"), "{out}");
    let done = phase(&env, &name, Phase::Executed).await;
    let approvals: Vec<String> = done.spec.approvals.iter().map(|a| a.by.clone()).collect();
    assert_eq!(approvals, [user(&env, &bob)], "stamped by the webhook");
    let status = done.status.expect("status");
    assert_eq!(status.revoked_token, Some(token));
    assert_eq!(status.approvals.iter().map(|a| a.by.clone()).collect::<Vec<_>>(), [user(&env, &bob)]);

    // The lock: token raised past the revoked one, recorded with requester and approver.
    let lock = until(&env.locks(), LOCK, WAIT, "the force release recorded", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some()
    })
    .await;
    let status = lock.status.expect("status");
    let record = status.last_force_release.clone().expect("recorded");
    assert_eq!(record.request.as_deref(), Some(name.as_str()));
    assert_eq!((record.by.as_str(), record.revoked_token), (user(&env, &alice).as_str(), Some(token)));
    assert_eq!(record.approved_by, [user(&env, &bob)]);
    assert!(status.fencing_token.expect("token") > token, "the token was raised at once");
    let history: Vec<(String, Option<String>)> =
        status.force_release_history.iter().map(|e| (e.event.clone(), e.by.clone())).collect();
    for (event, by) in
        [("Requested", user(&env, &alice)), ("Approved", user(&env, &bob)), ("Executed", user(&env, &alice))]
    {
        assert!(history.contains(&(event.to_owned(), Some(by.clone()))), "{event} by {by} in {history:?}");
    }
    // The holder is told (the drain path of every revocation).
    revoked(&hold).await;
    for reason in ["ForceReleaseRequested", "ForceReleaseApproved", "ForceReleased"] {
        env.event(reason, WAIT).await;
    }
    assert_eq!(counted(&env, &controller, "executed").await, 1.0);

    // A final request changes no more.
    let message = denial(approve(&requests_of(&eve, &env), &name).await);
    assert!(message.contains("forcereleaserequests/approval") || message.contains("already Executed"), "{message}");
}

#[tokio::test]
async fn an_expired_request_and_one_whose_target_changed_do_nothing() {
    let env = Env::new("adm-frr-stale").await;
    let controller = env.webhook_controller(None, &[]).await;
    let (alice, bob, a, b) = (env.pod("alice").await, env.pod("bob").await, env.pod("a").await, env.pod("b").await);
    people(&env, 1, &[&alice], &[&bob], &[]).await;
    env.wait_claim_rbac(&a).await;
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds the lock");
    let token = hold.token();
    let as_alice = requests_of(&alice, &env);
    let as_bob = requests_of(&bob, &env);

    // Expired before anyone approved: it ends Expired, an approval after that is refused,
    // and the hold is untouched.
    as_alice.create(&PostParams::default(), &request("short fuse", 5)).await.expect("request");
    let expired = phase(&env, "stuck", Phase::Expired).await;
    assert!(expired.status.and_then(|s| s.message).is_some_and(|m| m.contains("expired")));
    let message = denial(approve(&as_bob, "stuck").await);
    assert!(message.contains("already Expired"), "{message}");
    let status = env.locks().get(LOCK).await.expect("lock").status.expect("status");
    assert_eq!((status.holder.map(|h| h.fencing_token), status.fencing_token), (Some(token), Some(token)));
    assert!(hold.is_held());

    // A request about a's hold; a lets go and b takes the lock: the request ends
    // Superseded, and an approval that would have revoked a never reaches b.
    let mut about_a = request("a is stuck", 3600);
    about_a.metadata.name = Some("about-a".into());
    as_alice.create(&PostParams::default(), &about_a).await.expect("request");
    phase(&env, "about-a", Phase::Pending).await;
    hold.release().await;
    env.wait_claim_rbac(&b).await;
    let b_hold = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b takes the lock");
    let superseded = phase(&env, "about-a", Phase::Superseded).await;
    let message = superseded.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains(&a.identity().id) && message.contains("no longer holds"), "{message}");
    let message = denial(approve(&as_bob, "about-a").await);
    assert!(message.contains("already Superseded"), "{message}");
    let status = env.locks().get(LOCK).await.expect("lock").status.expect("status");
    assert_eq!(status.holder.as_ref().map(|h| h.fencing_token), Some(b_hold.token()), "b still holds");
    assert!(b_hold.is_held());
    assert!(status.last_force_release.is_none(), "nothing was revoked: {:?}", status.last_force_release);
    let events: Vec<String> = status.force_release_history.iter().map(|e| e.event.clone()).collect();
    assert!(events.contains(&"Expired".to_owned()) && events.contains(&"Superseded".to_owned()), "{events:?}");

    // Naming a target that is not the holder is refused at creation.
    let mut wrong = request("wrong target", 3600);
    wrong.metadata.name = Some("wrong".into());
    wrong.spec.target_holder = Some(a.identity().id);
    let message = denial(as_alice.create(&PostParams::default(), &wrong).await);
    assert!(message.contains(&format!("held by {}", b.identity().id)), "{message}");
    assert_eq!(counted(&env, &controller, "expired").await, 1.0);
    assert_eq!(counted(&env, &controller, "superseded").await, 1.0);
    b_hold.release().await;
}

#[tokio::test]
async fn the_zero_approval_policy_acts_at_once_as_before() {
    let env = Env::new("adm-frr-zero").await;
    let _controller = env.webhook_controller(None, &[]).await;
    let (alice, a) = (env.pod("alice").await, env.pod("a").await);
    people(&env, 0, &[&alice], &[], &[]).await;
    env.wait_claim_rbac(&a).await;

    // The one-step annotation, as today: stamped, carried out, cleared.
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds the lock");
    let token = hold.token();
    let patch = json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: "break glass"}}});
    env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotation admitted");
    let lock = until(&env.locks(), LOCK, WAIT, "the force release recorded", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some_and(|r| r.reason == "break glass")
    })
    .await;
    let record = lock.status.as_ref().and_then(|s| s.last_force_release.clone()).expect("recorded");
    assert_eq!((record.revoked_token, record.request), (Some(token), None));
    assert!(!lock.annotations().contains_key(ANNOTATION_FORCE_RELEASE));
    revoked(&hold).await;
    hold.release().await;

    // A request needs no approval either: carried out at once.
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds the lock again");
    let token = hold.token();
    requests_of(&alice, &env).create(&PostParams::default(), &request("break glass", 600)).await.expect("request");
    let done = phase(&env, "stuck", Phase::Executed).await;
    assert_eq!(done.status.and_then(|s| s.revoked_token), Some(token));
    // The CLI lists it with its outcome.
    let (ok, listed) = cli(&env, &alice, &["requests", env.name()]).await;
    let row = listed.lines().find(|l| l.starts_with("stuck ")).unwrap_or_default();
    assert!(ok && row.contains(" Executed ") && row.contains(&format!("(token {token})")), "{listed}");
    revoked(&hold).await;
    hold.release().await;

    // The same lock with a policy of one: the annotation is refused, naming the way.
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds the lock a third time");
    let one = json!({"spec": {"forceRelease": {"approvals": 1}}});
    env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&one)).await.expect("policy of one");
    let message = denial(env.locks().patch(LOCK, &PatchParams::default(), &Patch::Merge(&patch)).await);
    assert!(message.contains("needs 1 approval") && message.contains("ForceReleaseRequest"), "{message}");
    assert!(hold.is_held());
    hold.release().await;
}

/// The chart's two ClusterRoles, as `helm template` renders them, under names of this
/// test's own (ClusterRoles are cluster-wide), bound in the test's namespace: `requester`
/// to the requesters, `approver` to the approvers.
async fn chart_roles(env: &Env, requesters: &[&TestPod], approvers: &[&TestPod]) -> Vec<String> {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let rendered = crate::chart::helm::Helm::offline().template(&[]).await;
    let roles: Api<ClusterRole> = Api::all(env.ns.client.clone());
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let mut names = Vec::new();
    for (role, who) in [("force-release-requester", requesters), ("force-release-approver", approvers)] {
        let chart_name = format!("{}-{role}", crate::chart::helm::RELEASE);
        let mut object = crate::chart::helm::find(&rendered, "ClusterRole", &chart_name)
            .unwrap_or_else(|| panic!("the chart renders the ClusterRole {chart_name}"))
            .clone();
        let name = format!("{}-{role}", env.name());
        object["metadata"] = json!({"name": name});
        roles.patch(&name, &PatchParams::apply("e2e"), &Patch::Apply(&object)).await.expect("cluster role");
        let subjects: Vec<_> = who
            .iter()
            .map(|p| json!({"kind": "ServiceAccount", "name": p.service_account, "namespace": env.name()}))
            .collect();
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}, "subjects": subjects});
        bindings.patch(role, &PatchParams::apply("e2e"), &Patch::Apply(&binding)).await.expect("role binding");
        names.push(name);
    }
    for pod in requesters {
        env.wait_allowed(pod, "create", "leasehold.dev", "forcereleaserequests", None).await;
    }
    for pod in approvers {
        env.wait_allowed(pod, "patch", "leasehold.dev", "forcereleaserequests", None).await;
    }
    names
}

#[tokio::test]
async fn the_charts_requester_and_approver_roles_suffice_and_a_denied_request_revokes_nothing() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let env = Env::new("adm-frr-deny").await;
    let controller = env.webhook_controller(None, &[]).await;
    let (alice, bob, holder) = (env.pod("alice").await, env.pod("bob").await, env.pod("a").await);
    env.lock(
        LOCK,
        DistributedLockSpec {
            force_release: Some(ForceReleasePolicy { approvals: Some(1) }),
            ..DistributedLockSpec::default()
        },
    )
    .await;
    let roles = chart_roles(&env, &[&alice], &[&bob]).await;
    env.wait_claim_rbac(&holder).await;
    let hold = holder.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds the lock");
    let token = hold.token();

    // The requester role asks; it cannot approve.
    let name = ask(&env, &alice).await.1.name_any();
    let message = denial(approve(&requests_of(&alice, &env), &name).await);
    assert!(message.contains(&user(&env, &alice)), "{message}");
    // The approver role decides; it cannot ask.
    let message = denial(requests_of(&bob, &env).create(&PostParams::default(), &request("bob asks", 600)).await);
    assert!(message.contains("forbidden") || message.contains("cannot create"), "{message}");

    // Bob denies, with the CLI: the request ends Denied under his name, and nothing is revoked.
    let (ok, out) = cli(&env, &bob, &["deny", &format!("{}/{name}", env.name()), "--reason", "it is working"]).await;
    assert!(ok && out.contains("Denied"), "{out}");
    let denied = phase(&env, &name, Phase::Denied).await;
    let denial_record = denied.spec.denial.clone().expect("the denial is recorded");
    assert_eq!(denial_record.by, user(&env, &bob), "stamped by the webhook");
    // The request's status and the lock's are two writes: the lock's history follows.
    let bob_user = user(&env, &bob);
    let lock = until(&env.locks(), LOCK, WAIT, "the denial in the lock's history", move |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| {
            s.force_release_history.iter().any(|e| e.event == "Denied" && e.by.as_deref() == Some(bob_user.as_str()))
        })
    })
    .await;
    let status = lock.status.expect("status");
    assert_eq!(
        (status.holder.as_ref().map(|h| h.fencing_token), status.fencing_token),
        (Some(token), Some(token)),
        "still held, no token raised"
    );
    assert!(status.last_force_release.is_none(), "nothing was revoked: {:?}", status.last_force_release);
    assert!(hold.is_held(), "the holder still holds");
    env.event("ForceReleaseDenied", WAIT).await;
    assert_eq!(counted(&env, &controller, "denied").await, 1.0);

    // A denied request stays denied: a later approval is refused.
    let message = denial(approve(&requests_of(&bob, &env), &name).await);
    assert!(message.contains("already Denied"), "{message}");
    assert!(hold.is_held());
    hold.release().await;
    let cluster_roles: Api<ClusterRole> = Api::all(env.ns.client.clone());
    for role in roles {
        cluster_roles.delete(&role, &Default::default()).await.expect("remove the test's ClusterRole");
    }
}

#[tokio::test]
async fn on_a_semaphore_a_force_release_names_the_holder_it_revokes_by_token() {
    let env = Env::new("adm-frr-sem").await;
    let _controller = env.webhook_controller(None, &[]).await;
    let (alice, a, b) = (env.pod("alice").await, env.pod("a").await, env.pod("b").await);
    // No approval needed: the request is carried out as soon as it is admitted.
    people_on(&env, DistributedLockSpec { permits: 2, ..DistributedLockSpec::default() }, 0, &[&alice], &[], &[]).await;
    env.wait_claim_rbac(&a).await;
    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a holds a permit");
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b holds the other");
    assert_ne!(hold_a.slot(), hold_b.slot());

    // Two holders and no token named: refused, listing both; nothing is revoked.
    let lock = format!("{}/{LOCK}", env.name());
    let (ok, out) = cli(&env, &alice, &["release", &lock, "--force", "--reason", "b is stuck"]).await;
    assert!(!ok, "{out}");
    for part in ["has 2 holders", &hold_a.token().to_string(), &hold_b.token().to_string(), "--token"] {
        assert!(out.contains(part), "missing {part:?} in {out}");
    }
    let api = Api::<ForceReleaseRequest>::namespaced(env.ns.client.clone(), env.name());
    assert!(api.list(&Default::default()).await.expect("list").items.is_empty(), "a refused request was stored");
    // A token nobody holds: refused by name.
    let (ok, out) = cli(&env, &alice, &["release", &lock, "--force", "--reason", "b is stuck", "--token", "7"]).await;
    assert!(!ok && out.contains("no hold with token 7"), "{out}");

    // b's token: b's hold alone is revoked.
    let token_b = hold_b.token().to_string();
    let (ok, out) =
        cli(&env, &alice, &["release", &lock, "--force", "--reason", "b is stuck", "--token", &token_b]).await;
    assert!(ok && out.contains(&token_b), "{out}");
    let stored = api.list(&Default::default()).await.expect("list").items;
    assert_eq!(
        stored.iter().map(|r| (r.spec.target_holder.as_deref(), r.spec.target_token)).collect::<Vec<_>>(),
        [(Some(b.identity().id.as_str()), Some(hold_b.token()))]
    );
    revoked(&hold_b).await;
    assert!(hold_a.is_held(), "the other holder keeps its permit");

    // `--all`: one request per holder, every hold revoked.
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b holds again");
    until(&env.locks(), LOCK, WAIT, "both holders in the status", |l: &DistributedLock| {
        l.status.as_ref().is_some_and(|s| s.holders.len() == 2)
    })
    .await;
    let (ok, out) = cli(&env, &alice, &["release", &lock, "--force", "--reason", "all stuck", "--all"]).await;
    assert!(ok, "{out}");
    for token in [hold_a.token(), hold_b.token()] {
        assert!(out.contains(&token.to_string()), "missing token {token} in {out}");
    }
    revoked(&hold_a).await;
    revoked(&hold_b).await;
}
