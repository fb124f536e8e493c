//! Admission plumbing for tests: a controller serving the webhooks over https on
//! 127.0.0.1 with a certificate from the test CA, registered with `clientConfig.url` and
//! the CA bundle, scoped to one namespace; and the Lease guard policy bound to one
//! namespace.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingWebhookConfiguration,
};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use leasehold::crd::{LockClaim, LockClaimSpec};
use serde_json::{Value, json};

use crate::{Env, LeaseholdProcess, free_port};

/// A controller serving the webhooks, and where its certificate files are.
pub struct WebhookController {
    /// The process.
    pub process: LeaseholdProcess,
    /// The webhook address.
    pub addr: SocketAddr,
    /// Certificate file.
    pub cert: PathBuf,
    /// Key file.
    pub key: PathBuf,
}

/// Writes a fresh serving certificate for 127.0.0.1 into `cert`/`key`, atomically.
pub fn write_cert(env: &Env, cert: &PathBuf, key: &PathBuf) -> String {
    let (pem, key_pem) = env.cp.issue_serving_cert(&["127.0.0.1", "localhost"]);
    for (path, contents) in [(key, &key_pem), (cert, &pem)] {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, contents).expect("write");
        std::fs::rename(&tmp, path).expect("rename");
    }
    pem
}

impl Env {
    /// Starts a controller serving the webhooks (as `kubeconfig`, or the admin), and
    /// registers them for this namespace.
    pub async fn webhook_controller(&self, kubeconfig: Option<&std::path::Path>, extra: &[&str]) -> WebhookController {
        let dir = self.log_dir();
        let (cert, key) = (dir.join("webhook.crt"), dir.join("webhook.key"));
        write_cert(self, &cert, &key);
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut args = vec![
            "--leader-elect=false".to_owned(),
            format!("--webhook-addr={addr}"),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-key-file={}", key.display()),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let process = self.controller_as(kubeconfig, &args).await;
        self.register_webhooks(addr).await;
        WebhookController { process, addr, cert, key }
    }

    /// Registers the webhooks at `addr` for this namespace only.
    pub async fn register_webhooks(&self, addr: SocketAddr) {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.cp.ca_pem());
        let scope = json!({"matchLabels": {"kubernetes.io/metadata.name": self.name()}});
        let hook = |name: &str, path: &str, rules: Value, object_selector: Value| {
            json!({
                "name": format!("{name}.leasehold.dev"),
                "clientConfig": {"url": format!("https://{addr}{path}"), "caBundle": ca},
                "rules": rules,
                "namespaceSelector": scope,
                "objectSelector": object_selector,
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
            })
        };
        let name = format!("leasehold-{}", self.name());
        let mutating = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                hook("inject", "/mutate/pods",
                    json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]),
                    json!({"matchLabels": {"leasehold.dev/inject": "true"}})),
                hook("force-release", "/mutate/distributedlocks",
                    json!([{"apiGroups": ["leasehold.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["distributedlocks"]}]),
                    json!({})),
                hook("force-release-requests", "/mutate/forcereleaserequests",
                    json!([{"apiGroups": ["leasehold.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["forcereleaserequests"]}]),
                    json!({})),
            ],
        });
        let validating = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [hook("fenced", "/validate/fenced",
                json!([{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["*"]}]),
                json!({"matchExpressions": [{"key": "leasehold.dev/fenced-by", "operator": "Exists"}]}))],
        });
        let params = PatchParams::apply("leasehold-e2e").force();
        let mutating_api: Api<MutatingWebhookConfiguration> = Api::all(self.ns.client.clone());
        mutating_api.patch(&name, &params, &Patch::Apply(&mutating)).await.expect("register the mutating webhooks");
        let validating_api: Api<ValidatingWebhookConfiguration> = Api::all(self.ns.client.clone());
        validating_api
            .patch(&name, &params, &Patch::Apply(&validating))
            .await
            .expect("register the validating webhook");

        // Probe with a dry-run Pod until the webhook answers (the apiserver picks the
        // configuration up asynchronously).
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.ns.client.clone(), self.name());
        leasehold_harness::eventually("the injection webhook answers", Duration::from_secs(30), || async {
            if injects(&pods, "webhook-probe").await? { Ok(()) } else { Err("not injected yet".to_owned()) }
        })
        .await;
    }

    /// Applies the guard (both policies) exempting `controller_user`, bound to this
    /// namespace only, and waits until it denies.
    pub async fn apply_lease_guard(&self, controller_user: &str) {
        let cleanup = leasehold::webhook::guard::CLEANUP_USERS;
        self.apply_guard(leasehold::webhook::guard::Exempt { controller: controller_user, cleanup: &cleanup }).await;
    }

    /// Applies the guard with the given exemptions, bound to this namespace only, and
    /// waits until it denies.
    pub async fn apply_guard(&self, exempt: leasehold::webhook::guard::Exempt<'_>) {
        self.apply_policies(leasehold::webhook::guard::policies_exempting(exempt).into()).await;
    }

    /// Applies the guard as the `leasehold` binary `bin` writes it (`leasehold lease-guard`)
    /// for `controller_user`, bound to this namespace only, and waits until it denies: a
    /// build of the guard other than this test's own.
    pub async fn apply_lease_guard_of(&self, bin: &str, controller_user: &str) {
        let output = std::process::Command::new(bin)
            .args(["lease-guard", "--controller-user", controller_user])
            .output()
            .expect("run leasehold lease-guard");
        assert!(output.status.success(), "{bin} lease-guard: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8(output.stdout).expect("UTF-8 manifests");
        let policies = text
            .split("---\n")
            .map(|doc| serde_saphyr::from_str::<Value>(doc).expect("a YAML document"))
            .filter(|doc| doc["kind"] == "ValidatingAdmissionPolicy")
            .collect();
        self.apply_policies(policies).await;
    }

    /// Applies `policies`, each bound to this namespace only, and waits until they deny.
    async fn apply_policies(&self, policies: Vec<Value>) {
        let params = PatchParams::apply("leasehold-e2e").force();
        let labels = json!({"kubernetes.io/metadata.name": self.name()});
        for mut policy in policies {
            let name = format!("{}-{}", policy["metadata"]["name"].as_str().expect("a name"), self.name());
            policy["metadata"]["name"] = json!(name);
            let mut binding = leasehold::webhook::guard::binding(&name, labels.as_object());
            binding["metadata"]["name"] = json!(name);
            let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.ns.client.clone());
            policies.patch(&name, &params, &Patch::Apply(&policy)).await.expect("apply the policy");
            let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.ns.client.clone());
            bindings.patch(&name, &params, &Patch::Apply(&binding)).await.expect("apply the binding");
        }
        // Wait until the policy denies: a dry-run lock Lease created by the admin.
        let leases: Api<DynamicObject> = Api::namespaced_with(
            self.ns.client.clone(),
            self.name(),
            &ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&()),
        );
        let mut probe =
            DynamicObject::new("guard-probe", &ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&()));
        probe.metadata.labels =
            Some([("leasehold.dev/lock".into(), "probe".into()), ("leasehold.dev/role".into(), "lock".into())].into());
        probe.data = json!({"spec": {}});
        leasehold_harness::eventually("the Lease guard denies", Duration::from_secs(30), || async {
            match leases.create(&PostParams { dry_run: true, field_manager: None }, &probe).await {
                Err(kube::Error::Api(s)) if s.message.contains("only the Leasehold controller") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        // And the claim guard: the admin's claim must be named `<lock>.u-<suffix>`.
        let claims: Api<LockClaim> = Api::namespaced(self.ns.client.clone(), self.name());
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
        let spec = LockClaimSpec {
            lock: "probe".into(),
            claimant: "probe".into(),
            pod: None,
            request_time: now.clone(),
            renew_time: now,
            ttl_seconds: 30,
            mode: None,
        };
        let claim = LockClaim::new("probe.x", spec);
        leasehold_harness::eventually("the claim guard denies", Duration::from_secs(30), || async {
            match claims.create(&PostParams { dry_run: true, field_manager: None }, &claim).await {
                Err(kube::Error::Api(s)) if s.message.contains("must be named") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
}

/// Whether the injection webhook adds the sidecar to an opted-in Pod named `name`,
/// created as a dry run in `pods` (nothing is stored).
pub async fn injects(pods: &Api<k8s_openapi::api::core::v1::Pod>, name: &str) -> Result<bool, String> {
    let probe: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"leasehold.dev/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }))
    .expect("pod");
    let stored =
        pods.create(&PostParams { dry_run: true, field_manager: None }, &probe).await.map_err(|e| e.to_string())?;
    Ok(stored.spec.and_then(|s| s.init_containers).is_some_and(|c| c.iter().any(|c| c.name == "leasehold-sidecar")))
}
