//! Admission against the real apiserver, which calls the webhook server over https on
//! 127.0.0.1 with a CA bundle: injection, the Lease guard (a ValidatingAdmissionPolicy),
//! fenced objects, audited force release, and certificate rotation without restart.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use leasehold::claim::edit;
use leasehold::crd::{ANNOTATION_FORCE_RELEASE, ANNOTATION_TOKEN, DistributedLock, DistributedLockSpec};
use leasehold_harness::eventually;
use serde_json::json;

use crate::support::Env;
use crate::support::watch::until;

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

fn denial(result: kube::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn pod_json(name: &str, labels: serde_json::Value, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }))
    .expect("a pod")
}

#[tokio::test]
async fn opted_in_pods_get_a_native_sidecar_once_and_others_are_untouched() {
    let env = Env::new("adm-inject").await;
    let _controller = env.webhook_controller(None, &["--sidecar-image=example.com/leasehold:test"]).await;
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());

    let stored = pods
        .create(
            &PostParams::default(),
            &pod_json("web", json!({"leasehold.dev/inject": "true"}), json!({"leasehold.dev/hold": "leader"})),
        )
        .await
        .expect("create an opted-in pod");
    let spec = stored.spec.clone().expect("spec");
    let init = spec.init_containers.clone().expect("init containers");
    assert_eq!(init.len(), 1);
    let sidecar = &init[0];
    assert_eq!(sidecar.name, "leasehold-sidecar");
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"), "a native sidecar");
    assert_eq!(sidecar.image.as_deref(), Some("example.com/leasehold:test"));
    let env_names: Vec<&str> = sidecar.env.iter().flatten().map(|e| e.name.as_str()).collect();
    for name in ["POD_NAME", "POD_NAMESPACE", "POD_UID", "LEASEHOLD_HOLD"] {
        assert!(env_names.contains(&name), "{name} missing from {env_names:?}");
    }
    let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    assert!(volumes.contains(&"leasehold-token") && volumes.contains(&"leasehold-run"), "{volumes:?}");
    let token = spec.volumes.iter().flatten().find(|v| v.name == "leasehold-token").expect("token volume");
    assert!(
        token
            .projected
            .as_ref()
            .expect("projected")
            .sources
            .iter()
            .flatten()
            .any(|s| s.service_account_token.is_some())
    );

    // Admitting the injected spec again does not inject twice.
    let mut again = stored.clone();
    again.metadata = kube::api::ObjectMeta {
        name: Some("web-2".into()),
        labels: stored.metadata.labels.clone(),
        ..Default::default()
    };
    let again = pods.create(&PostParams::default(), &again).await.expect("create from the injected spec");
    let count = again
        .spec
        .expect("spec")
        .init_containers
        .expect("init")
        .iter()
        .filter(|c| c.name == "leasehold-sidecar")
        .count();
    assert_eq!(count, 1, "injected twice");

    // A pod that did not opt in is stored as sent.
    let plain =
        pods.create(&PostParams::default(), &pod_json("plain", json!({"app": "x"}), json!({}))).await.expect("create");
    let spec = plain.spec.expect("spec");
    assert!(spec.init_containers.is_none(), "{spec:?}");
    assert!(!spec.volumes.iter().flatten().any(|v| v.name.starts_with("leasehold")), "{spec:?}");
    assert!(spec.containers[0].env.is_none(), "{spec:?}");

    // A malformed leasehold annotation is refused, naming it.
    let message = denial(
        pods.create(
            &PostParams::default(),
            &pod_json("bad", json!({"leasehold.dev/inject": "true"}), json!({"leasehold.dev/hold": "Not_A_Lock"})),
        )
        .await,
    );
    assert!(message.contains("leasehold.dev/hold"), "{message}");
    assert!(pods.get_opt("bad").await.expect("get").is_none(), "nothing was created");
}

/// A ServiceAccount with cluster-admin for the controller, and a kubeconfig for it.
async fn controller_identity(env: &Env) -> (String, std::path::PathBuf) {
    let pod = env.pod("leasehold-controller").await;
    let bindings: Api<ClusterRoleBinding> = Api::all(env.ns.client.clone());
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("leasehold-e2e-{}", env.name())},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": pod.service_account, "namespace": env.name()}],
    });
    bindings
        .patch(&format!("leasehold-e2e-{}", env.name()), &PatchParams::apply("leasehold-e2e"), &Patch::Apply(&binding))
        .await
        .expect("bind");
    let kubeconfig = env.log_dir().join("kubeconfig-controller");
    env.ns.kubeconfig_for_token(&pod.token, &kubeconfig).expect("kubeconfig");
    (format!("system:serviceaccount:{}:{}", env.name(), pod.service_account), kubeconfig)
}

#[tokio::test]
async fn the_lease_guard_lets_only_the_controller_grant_and_only_the_holder_renew() {
    let env = Env::new("adm-guard").await;
    let (user, kubeconfig) = controller_identity(&env).await;
    env.apply_lease_guard(&user).await;
    let _controller = env.controller_as(Some(&kubeconfig), &["--leader-elect=false"]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;

    // The controller's ServiceAccount grants (holder and token written by it).
    let hold = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a is granted through the guard");
    let as_b: Api<Lease> = Api::namespaced(b.client.clone(), env.name());
    let lease = as_b.get(LOCK).await.expect("b may read");
    let b_id = b.identity().id;

    let mut take = lease.clone();
    take.spec.as_mut().expect("spec").holder_identity = Some(b_id.clone());
    let message = denial(as_b.replace(LOCK, &PostParams::default(), &take).await);
    assert!(message.contains("only the Leasehold controller grants"), "b made itself holder: {message}");

    let renew_other = edit::renewed(&lease, Timestamp::now());
    let message = denial(as_b.replace(LOCK, &PostParams::default(), &renew_other).await);
    assert!(message.contains("only its own hold"), "b renewed a's hold: {message}");

    let mut forged = lease.clone();
    forged.annotations_mut().insert(ANNOTATION_TOKEN.into(), "99999999999999".into());
    let message = denial(as_b.replace(LOCK, &PostParams::default(), &forged).await);
    assert!(message.contains("only the Leasehold controller"), "b changed the token: {message}");

    // Removing the labels is no way around it.
    let mut unlabelled = take.clone();
    unlabelled.metadata.labels = None;
    let message = denial(as_b.replace(LOCK, &PostParams::default(), &unlabelled).await);
    assert!(message.contains("labels"), "{message}");

    // Not even a's own pod may change its token.
    let as_a: Api<Lease> = Api::namespaced(a.client.clone(), env.name());
    let mut own_forged = as_a.get(LOCK).await.expect("lease");
    own_forged.annotations_mut().insert(ANNOTATION_TOKEN.into(), "99999999999999".into());
    denial(as_a.replace(LOCK, &PostParams::default(), &own_forged).await);

    // A claim must name its creator.
    let forged_claim = edit::claim_lease(LOCK, &a.identity(), 45, Timestamp::now());
    let mut forged_claim = forged_claim;
    forged_claim.metadata.name = Some(format!("{LOCK}.forged"));
    forged_claim.metadata.owner_references = None;
    let message = denial(as_b.create(&PostParams::default(), &forged_claim).await);
    assert!(message.contains("must name its creator"), "{message}");

    // The real holder renews (several times) and releases.
    let renewed_before = as_a.get(LOCK).await.expect("lease").spec.and_then(|s| s.renew_time);
    let renewed = until(&as_a, LOCK, WAIT, "a renewal by the holder", |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.renew_time.clone()) != renewed_before
    })
    .await;
    assert_eq!(edit::holder(&renewed), Some(a.identity().id.as_str()));
    assert!(hold.is_held());
    assert!(hold.release().await.was_held, "a released its own hold");
    let next = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b is granted by the controller");
    next.release().await;
}

async fn fenced_write(cms: &Api<ConfigMap>, token: Option<i64>, value: &str) -> kube::Result<ConfigMap> {
    let mut annotations = serde_json::Map::new();
    if let Some(t) = token {
        annotations.insert(ANNOTATION_TOKEN.into(), json!(t.to_string()));
    }
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "inventory", "labels": {"leasehold.dev/fenced-by": LOCK}, "annotations": annotations},
        "data": {"stock": value},
    });
    cms.patch("inventory", &PatchParams::apply("writer").force(), &Patch::Apply(&cm)).await
}

#[tokio::test]
async fn a_fenced_configmap_rejects_writes_with_an_old_token() {
    let env = Env::new("adm-fence").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());

    let hold_a = a.claimant(env.name()).acquire(LOCK, WAIT).await.expect("a acquires");
    let token_a = hold_a.token();
    fenced_write(&cms, Some(token_a), "10").await.expect("a write with the current token is admitted");
    let message = denial(fenced_write(&cms, None, "9").await);
    assert!(message.contains("no leasehold.dev/fencing-token"), "{message}");

    hold_a.release().await;
    let hold_b = b.claimant(env.name()).acquire(LOCK, WAIT).await.expect("b acquires");
    let token_b = hold_b.token();
    let message = denial(fenced_write(&cms, Some(token_a), "9").await);
    let lock = format!("{}/{LOCK}", env.name());
    for needle in [lock.as_str(), &token_a.to_string(), &token_b.to_string()] {
        assert!(message.contains(needle), "the rejection must name the lock and both tokens: {message}");
    }
    fenced_write(&cms, Some(token_b), "8").await.expect("b's write is admitted");
    let message = denial(fenced_write(&cms, Some(token_b + 1_000_000), "7").await);
    assert!(message.contains("higher than any token issued"), "{message}");
    let stored = cms.get("inventory").await.expect("cm");
    assert_eq!(stored.data.expect("data")["stock"], "8");
    hold_b.release().await;
}

#[tokio::test]
async fn a_force_release_is_audited_revokes_the_token_and_tells_the_holder() {
    let env = Env::new("adm-force").await;
    let _controller = env.webhook_controller(None, &[]).await;
    env.lock(LOCK, DistributedLockSpec::default()).await;
    let a = env.pod("a").await;
    env.wait_claim_rbac(&a).await;
    let sidecar = env.sidecar(&a, &[]).await;
    let (status, held) = sidecar.acquire(LOCK, 30.0).await;
    assert_eq!(status, 200, "{held}");
    let token_a = held["fencingToken"].as_i64().expect("token");
    let mut events = sidecar.events(LOCK).await;
    let cms: Api<ConfigMap> = Api::namespaced(env.ns.client.clone(), env.name());
    fenced_write(&cms, Some(token_a), "10").await.expect("admitted");

    // A named operator with rights on DistributedLocks only.
    let operator = env.pod("operator").await;
    let roles: Api<Role> = Api::namespaced(env.ns.client.clone(), env.name());
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "lock-operator"},
        "rules": [{"apiGroups": ["leasehold.dev"], "resources": ["distributedlocks"], "verbs": ["get", "list", "watch", "patch", "update"]}]});
    roles.patch("lock-operator", &PatchParams::apply("e2e"), &Patch::Apply(&role)).await.expect("role");
    let bindings: Api<RoleBinding> = Api::namespaced(env.ns.client.clone(), env.name());
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "lock-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lock-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": operator.service_account, "namespace": env.name()}]});
    bindings.patch("lock-operator", &PatchParams::apply("e2e"), &Patch::Apply(&binding)).await.expect("binding");
    let user = format!("system:serviceaccount:{}:{}", env.name(), operator.service_account);

    // An empty reason is refused, naming the annotation; nothing changes.
    let as_operator: Api<DistributedLock> = Api::namespaced(operator.client.clone(), env.name());
    let empty = json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: " "}}});
    let message = eventually("the operator's RBAC", WAIT, || async {
        match as_operator.patch(LOCK, &PatchParams::default(), &Patch::Merge(&empty)).await {
            Err(kube::Error::Api(s)) if s.code != 403 || s.message.contains(ANNOTATION_FORCE_RELEASE) => Ok(s.message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(message.contains(ANNOTATION_FORCE_RELEASE) && message.contains("reason"), "{message}");
    assert!(sidecar.view(LOCK).await["held"].as_bool().expect("held"), "an empty request revoked nothing");

    // The CLI, run with the operator's credentials.
    let kubeconfig = env.log_dir().join("kubeconfig-operator");
    env.ns.kubeconfig_for_token(&operator.token, &kubeconfig).expect("kubeconfig");
    let output = tokio::process::Command::new(crate::support::leasehold_bin())
        .args(["release", &format!("{}/{LOCK}", env.name()), "--force", "--reason", "node is gone"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("run leasehold release");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("revoked token {token_a}")) && stdout.contains(&user), "{stdout}");

    let lock = until(&env.locks(), LOCK, WAIT, "the force release recorded", |l: &DistributedLock| {
        l.status.as_ref().and_then(|s| s.last_force_release.as_ref()).is_some()
    })
    .await;
    let record = lock.status.clone().and_then(|s| s.last_force_release).expect("recorded");
    assert_eq!(
        (record.by.as_str(), record.reason.as_str(), record.revoked_token),
        (user.as_str(), "node is gone", Some(token_a))
    );
    assert!(!lock.annotations().contains_key(ANNOTATION_FORCE_RELEASE), "the annotation is cleared");
    assert!(lock.status.expect("status").fencing_token.expect("token") > token_a, "the token was raised");

    let lost = events.expect("lost", WAIT).await;
    assert_eq!(lost["fencingToken"].as_i64(), Some(token_a));
    assert_eq!(sidecar.view(LOCK).await["held"].as_bool(), Some(false));
    let message = denial(fenced_write(&cms, Some(token_a), "9").await);
    assert!(message.contains("stale"), "the revoked token is stale: {message}");

    let events_api: Api<Event> = Api::namespaced(env.ns.client.clone(), env.name());
    let event = eventually("a ForceReleased event", WAIT, || async {
        let list = events_api.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ForceReleased"))
            .ok_or_else(|| "none yet".to_owned())
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&user) && note.contains("node is gone"), "{note}");
}

/// The certificate a TLS server at `addr` presents, verified against the test CA.
async fn presented_certificate(env: &Env, addr: std::net::SocketAddr) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(env.cp.ca_pem().as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("add the CA");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let tls = connector.connect(name, tcp).await.expect("a verified TLS handshake");
    tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec()
}

#[tokio::test]
async fn the_webhook_serves_a_replaced_certificate_without_a_restart() {
    use rustls::pki_types::pem::PemObject;
    let env = Env::new("adm-rotate").await;
    let controller = env.webhook_controller(None, &[]).await;
    let first = rustls::pki_types::CertificateDer::from_pem_file(&controller.cert).expect("cert").to_vec();
    assert_eq!(presented_certificate(&env, controller.addr).await, first);

    let second_pem = crate::support::admission::write_cert(&env, &controller.cert, &controller.key);
    let second = rustls::pki_types::CertificateDer::from_pem_slice(second_pem.as_bytes()).expect("cert").to_vec();
    assert_ne!(first, second);
    assert_eq!(
        presented_certificate(&env, controller.addr).await,
        second,
        "the next handshake uses the new certificate"
    );

    // And the apiserver's next admission call goes through with it.
    let pods: Api<Pod> = Api::namespaced(env.ns.client.clone(), env.name());
    let stored = pods
        .create(
            &PostParams { dry_run: true, field_manager: None },
            &pod_json("after", json!({"leasehold.dev/inject": "true"}), json!({})),
        )
        .await
        .expect("admitted after rotation");
    assert!(stored.spec.and_then(|s| s.init_containers).is_some_and(|c| c[0].name == "leasehold-sidecar"));
}
