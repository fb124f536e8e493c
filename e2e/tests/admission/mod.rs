//! Admission against the real apiserver, which calls the webhook server over https on
//! 127.0.0.1 with a CA bundle: injection and certificate rotation without restart here;
//! the guard policies ([`guard`]) and a release's handoff under them ([`handoff`]), client
//! RBAC ([`rbac`]), fenced objects ([`fence`]) and audited, targeted force release
//! ([`force`]), and force-release requests approved by a second person ([`requests`]);
//! per-pod sidecar settings ([`pod_settings`]).

mod fence;
mod force;
mod guard;
mod handoff;
mod pod_settings;
mod rbac;
mod requests;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::support::Env;

const LOCK: &str = "orders";
const WAIT: Duration = Duration::from_secs(30);

/// The apiserver's message refusing `result`; panics if it was admitted.
pub fn denial(result: kube::Result<impl std::fmt::Debug>) -> String {
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
