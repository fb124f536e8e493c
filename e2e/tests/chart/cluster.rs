//! A dedicated control plane with the chart installed (or about to be), and the release's
//! objects as the tests read them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use leasehold_harness::ControlPlane;

use super::helm::{Helm, NAMESPACE, RELEASE, chart_dir};

/// Name of the DistributedLock CRD.
pub const CRD: &str = "distributedlocks.leasehold.dev";
/// Name of the LockClaim CRD.
pub const CLAIM_CRD: &str = "lockclaims.leasehold.dev";
/// The ForceReleaseRequest CRD's name.
pub const REQUEST_CRD: &str = "forcereleaserequests.leasehold.dev";

/// A control plane of its own, an admin client, and Helm pointed at it.
pub struct ChartCluster {
    /// The control plane.
    pub cp: ControlPlane,
    /// Admin client.
    pub admin: kube::Client,
    /// Helm as the admin.
    pub helm: Helm,
}

impl ChartCluster {
    /// Starts a control plane and creates the release namespace, enforcing the
    /// `restricted` Pod Security Standard (so that a Pod made from the chart's template
    /// is admitted only if it complies).
    pub async fn start() -> ChartCluster {
        let cp = ControlPlane::start().expect("start a control plane for the chart");
        let admin = cp.admin_client().await;
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.into()),
                labels: Some(BTreeMap::from([
                    ("pod-security.kubernetes.io/enforce".to_owned(), "restricted".to_owned()),
                    ("pod-security.kubernetes.io/enforce-version".to_owned(), "latest".to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(admin.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("create the release namespace");
        let helm = Helm::for_cluster(&cp);
        ChartCluster { cp, admin, helm }
    }

    /// A client acting as `user` (the admin impersonating it).
    pub async fn impersonating(&self, user: &str) -> kube::Client {
        crate::support::locks::impersonating(self.cp.kubeconfig_path(), user).await
    }

    /// `helm install` (or `upgrade`, with `verb`) of the chart with extra arguments;
    /// waits until the CRD, if any, is established.
    pub async fn helm_apply(&self, verb: &str, extra: &[&str]) -> String {
        self.helm_apply_chart(&chart_dir(), verb, extra).await
    }

    /// Like [`Self::helm_apply`], of `chart`: a chart directory or a packaged chart.
    pub async fn helm_apply_chart(&self, chart: &std::path::Path, verb: &str, extra: &[&str]) -> String {
        // No kubelet runs the hooks' Pods here: the tests that need `helm test` or the
        // install check run their `leasehold check` as a local process.
        let mut args =
            vec![verb, RELEASE, chart.to_str().expect("a UTF-8 path"), "--namespace", NAMESPACE, "--no-hooks"];
        args.extend(extra);
        let output = self.helm.must(&args).await;
        let crds: Api<CustomResourceDefinition> = Api::all(self.admin.clone());
        for crd in [CRD, CLAIM_CRD] {
            if crds.get_opt(crd).await.expect("read the CRD").is_some() {
                tokio::time::timeout(
                    Duration::from_secs(30),
                    await_condition(crds.clone(), crd, conditions::is_crd_established()),
                )
                .await
                .expect("the CRD is established within 30 s")
                .expect("watch the CRD");
            }
        }
        output
    }

    /// `helm install` with `--set` values.
    pub async fn install(&self, sets: &[&str]) -> String {
        let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s]).collect();
        self.helm_apply("install", &args).await
    }

    /// `helm uninstall`.
    pub async fn uninstall(&self) -> String {
        self.helm.must(&["uninstall", RELEASE, "--namespace", NAMESPACE]).await
    }

    /// The data of the webhook certificate Secret.
    pub async fn tls_secret(&self) -> BTreeMap<String, Vec<u8>> {
        let secret = Api::<Secret>::namespaced(self.admin.clone(), NAMESPACE)
            .get("leasehold-webhook-tls")
            .await
            .expect("the webhook certificate Secret");
        secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()
    }
}
