//! The packaged chart (what `make release` ships, from `e2e/tools/package-chart.sh`)
//! installed and uninstalled on the real control plane: after the uninstall, nothing of
//! Leasehold is left but the kept CRDs and the locks they hold — not the client Roles and
//! RoleBindings the controller created in app namespaces, nor its election Lease.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{Discovery, verbs};
use kube::{Resource, ResourceExt};
use leasehold::crd::{DistributedLock, DistributedLockSpec};

use super::cluster::{CLAIM_CRD, CRD, ChartCluster, REQUEST_CRD};
use super::helm::{NAMESPACE, repo};
use super::rbac::ChartController;
use crate::support::watch::{until, until_gone};

const WAIT: Duration = Duration::from_secs(60);
const CONTROLLER: &str = "leasehold-controller";

/// Every object the admin can list: `(group/kind, namespace, name)`. Events are left out
/// (they expire on their own).
async fn inventory(client: &kube::Client) -> BTreeSet<(String, String, String)> {
    let discovery = Discovery::new(client.clone()).run().await.expect("API discovery");
    let mut found = BTreeSet::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if !capabilities.supports_operation(verbs::LIST) || resource.kind == "Event" {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let list = api
                .list_metadata(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("list {}: {e}", resource.plural));
            for item in list.items {
                found.insert((
                    format!("{}/{}", resource.group, resource.kind),
                    item.namespace().unwrap_or_default(),
                    item.name_any(),
                ));
            }
        }
    }
    found
}

/// The packaged chart, as `make release` builds it.
fn package() -> PathBuf {
    let dest = std::env::temp_dir().join("leasehold-e2e").join(format!("package-{}", std::process::id()));
    let output = std::process::Command::new(repo().join("e2e/tools/package-chart.sh"))
        .arg(&dest)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run e2e/tools/package-chart.sh");
    assert!(output.status.success(), "packaging failed: {}", String::from_utf8_lossy(&output.stderr));
    let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    assert!(
        path.extension().is_some_and(|e| e == "tgz") && path.is_file(),
        "package-chart.sh printed no archive: {path:?}"
    );
    path
}

fn owned_by(meta: &kube::api::ObjectMeta, uid: &str) -> bool {
    meta.owner_references.iter().flatten().any(|o| o.kind == "ClusterRole" && o.name == CONTROLLER && o.uid == uid)
}

#[tokio::test]
async fn the_packaged_chart_uninstalls_leaving_only_the_kept_crds_and_their_locks() {
    let chart = package();
    let cluster = ChartCluster::start().await;
    let admin = cluster.admin.clone();
    let app = cluster.cp.namespace("app").await;
    // kube-controller-manager gives every new namespace its `default` ServiceAccount; the
    // inventory before the install must already hold it, or it counts as left behind.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), &app.name);
    until(&accounts, "default", WAIT, "the app namespace's default ServiceAccount", |_| true).await;
    let before = inventory(&admin).await;

    let notes = cluster.helm_apply_chart(&chart, "install", &[]).await;
    assert!(notes.contains("STATUS: deployed"), "{notes}");
    let owner = Api::<ClusterRole>::all(admin.clone()).get(CONTROLLER).await.expect("the chart's ClusterRole");
    let uid = owner.meta().uid.clone().expect("a UID");

    // The controller as the chart runs it (with the chart's ServiceAccount, arguments and
    // RBAC) prepares the app namespace for a lock, and leads.
    let controller = ChartController::start(&cluster, &app).await;
    let locks: Api<DistributedLock> = Api::namespaced(admin.clone(), &app.name);
    locks
        .create(&PostParams::default(), &DistributedLock::new("jobs", DistributedLockSpec::default()))
        .await
        .expect("a lock");
    let roles: Api<Role> = Api::namespaced(admin.clone(), &app.name);
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), &app.name);
    let elections: Api<Lease> = Api::namespaced(admin.clone(), NAMESPACE);
    until(&roles, "leasehold-client", WAIT, "the client Role, owned by the chart's ClusterRole", |r| {
        owned_by(r.meta(), &uid)
    })
    .await;
    until(&bindings, "leasehold-client", WAIT, "the client RoleBinding, owned by the chart's ClusterRole", |b| {
        owned_by(b.meta(), &uid)
    })
    .await;
    until(&elections, CONTROLLER, WAIT, "the election Lease, owned by the chart's ClusterRole", |l| {
        owned_by(l.meta(), &uid) && l.labels().get("app.kubernetes.io/managed-by").is_some_and(|v| v == "leasehold")
    })
    .await;
    until(&Api::<Lease>::namespaced(admin.clone(), &app.name), "jobs", WAIT, "the lock Lease", |_| true).await;
    let installed = inventory(&admin).await;
    for kind in ["rbac.authorization.k8s.io/Role", "rbac.authorization.k8s.io/RoleBinding"] {
        let object = (kind.to_owned(), app.name.clone(), "leasehold-client".to_owned());
        assert!(installed.contains(&object), "the inventory sees {object:?}");
    }

    // Uninstall while the controller still runs (as replicas do through their grace
    // period); then its stand-in Pod goes, and with it its token.
    cluster.uninstall().await;
    until_gone(&roles, "leasehold-client", WAIT, "the client Role deleted by the garbage collector").await;
    until_gone(&bindings, "leasehold-client", WAIT, "the client RoleBinding deleted by the garbage collector").await;
    until_gone(&elections, CONTROLLER, WAIT, "the election Lease deleted by the garbage collector").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    pods.delete(&format!("{CONTROLLER}-local"), &DeleteParams::default()).await.expect("delete the stand-in Pod");
    until_gone(&pods, &format!("{CONTROLLER}-local"), WAIT, "the stand-in Pod gone").await;
    let log = controller.log();
    drop(controller);

    // What is left beyond what was there before: the kept CRDs (with the APIService the
    // apiserver registers for their group, which goes with them), and the lock with its
    // Lease (user data, kept with them).
    let after = inventory(&admin).await;
    let left: BTreeSet<_> = after.difference(&before).cloned().collect();
    let kept: BTreeSet<(String, String, String)> = [
        ("apiextensions.k8s.io/CustomResourceDefinition", "", CRD),
        ("apiextensions.k8s.io/CustomResourceDefinition", "", CLAIM_CRD),
        ("apiextensions.k8s.io/CustomResourceDefinition", "", REQUEST_CRD),
        ("apiregistration.k8s.io/APIService", "", "v1alpha1.leasehold.dev"),
        ("leasehold.dev/DistributedLock", app.name.as_str(), "jobs"),
        ("coordination.k8s.io/Lease", app.name.as_str(), "jobs"),
    ]
    .into_iter()
    .map(|(k, n, o)| (k.to_owned(), n.to_owned(), o.to_owned()))
    .collect();
    assert_eq!(left, kept, "left behind by the uninstall (controller log:\n{log})");
}
