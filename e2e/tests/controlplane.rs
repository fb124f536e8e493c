//! The test control plane itself: it must be the pinned release, with real optimistic
//! concurrency, real RBAC and pod-bound identities, and it must leave no processes behind.
//! Every other end-to-end test relies on these properties.

use std::time::Duration;

use k8s_openapi::{
    api::{
        authentication::v1::SelfSubjectReview,
        coordination::v1::{Lease, LeaseSpec},
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::api::{Api, DeleteParams, PostParams};
use leasehold_harness::{ControlPlane, eventually, process_exists, shared};

/// RBAC changes reach the authorizer's informer cache within milliseconds; this only
/// bounds a broken control plane.
const RBAC_PROPAGATION: Duration = Duration::from_secs(30);

/// The HTTP status of a failed API call, or a panic naming what was expected.
fn api_error_code<T: std::fmt::Debug>(result: kube::Result<T>, expected: &str) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("expected {expected}, got {other:?}"),
    }
}

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    }
}

fn with_holder(mut lease: Lease, holder: &str) -> Lease {
    lease.spec.get_or_insert_with(LeaseSpec::default).holder_identity = Some(holder.to_owned());
    lease
}

#[tokio::test]
async fn version_is_pinned_release() {
    let control_plane = shared();
    let client = control_plane.admin_client().await;

    let info = client.apiserver_version().await.expect("GET /version should succeed");

    let pinned = control_plane.version();
    assert_ne!(
        info.git_version, "v0.0.0-master",
        "kube-apiserver was built without version stamping (-ldflags -X ...gitVersion)"
    );
    assert_eq!(
        info.git_version, pinned,
        "kube-apiserver reports a different release than e2e/controlplane/go.mod pins"
    );
    let mut parts = pinned.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next(), parts.next());
    assert_eq!(Some(info.major.as_str()), major, "major version of {pinned}");
    assert_eq!(Some(info.minor.as_str()), minor, "minor version of {pinned}");
}

#[tokio::test]
async fn lease_compare_and_swap() {
    let namespace = shared().namespace("lease-cas").await;
    let leases = Api::<Lease>::namespaced(namespace.client.clone(), &namespace.name);
    let params = PostParams::default();

    let created = leases.create(&params, &lease("cas", "first")).await.expect("creating a Lease should succeed");
    let taken = leases
        .replace("cas", &params, &with_holder(created.clone(), "second"))
        .await
        .expect("an update carrying the current resourceVersion should succeed");
    assert_ne!(
        taken.metadata.resource_version, created.metadata.resource_version,
        "an update must produce a new resourceVersion"
    );

    let stale = leases.replace("cas", &params, &with_holder(created, "stale-writer")).await;
    assert_eq!(
        api_error_code(stale, "409 Conflict for a stale resourceVersion"),
        409,
        "an update carrying a stale resourceVersion must be rejected with 409 Conflict"
    );

    let renewed = leases
        .replace("cas", &params, &with_holder(taken, "third"))
        .await
        .expect("an update carrying the current resourceVersion should succeed");
    assert_eq!(
        renewed.spec.and_then(|spec| spec.holder_identity).as_deref(),
        Some("third"),
        "the successful update must be stored"
    );

    leases.delete("cas", &DeleteParams::default()).await.expect("deleting the Lease should succeed");
    assert_eq!(
        api_error_code(leases.get("cas").await, "404 Not Found after delete"),
        404,
        "a deleted Lease must be gone"
    );
}

#[tokio::test]
async fn rbac_is_real_for_pod_bound_tokens() {
    let control_plane = shared();
    let namespace = control_plane.namespace("rbac").await;
    namespace.service_account("locker").await;
    let pod = namespace.pod("locker-0", "locker", &[("app", "locker")]).await;
    let pod_name = pod.metadata.name.clone().expect("a stored Pod has a name");
    let pod_uid = pod.metadata.uid.clone().expect("a stored Pod has a uid");
    let token = namespace.pod_token("locker", &pod).await;
    let as_pod = control_plane.client_with_token(&token).await;

    let admin_leases = Api::<Lease>::namespaced(namespace.client.clone(), &namespace.name);
    let pod_leases = Api::<Lease>::namespaced(as_pod.clone(), &namespace.name);
    let params = PostParams::default();
    let guarded =
        admin_leases.create(&params, &lease("guarded", "nobody")).await.expect("the admin should create the Lease");

    let denied = pod_leases.replace("guarded", &params, &with_holder(guarded, &pod_name)).await;
    assert_eq!(
        api_error_code(denied, "403 Forbidden without a Role"),
        403,
        "a service account without a Role must not update Leases"
    );

    let role = Role {
        metadata: ObjectMeta { name: Some("lease-writer".to_owned()), ..ObjectMeta::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
            resources: Some(vec!["leases".to_owned()]),
            verbs: vec!["get".to_owned(), "update".to_owned()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(namespace.client.clone(), &namespace.name)
        .create(&params, &role)
        .await
        .expect("the admin should create the Role");
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("locker-writes-leases".to_owned()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: "lease-writer".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: "locker".to_owned(),
            namespace: Some(namespace.name.clone()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(namespace.client.clone(), &namespace.name)
        .create(&params, &binding)
        .await
        .expect("the admin should create the RoleBinding");

    let updated =
        eventually("the pod-bound token to update the Lease once bound to the Role", RBAC_PROPAGATION, || {
            let (pod_leases, params, pod_name) = (&pod_leases, &params, &pod_name);
            async move {
                let current = pod_leases.get("guarded").await?;
                pod_leases.replace("guarded", params, &with_holder(current, pod_name)).await
            }
        })
        .await;
    assert_eq!(
        updated.spec.and_then(|spec| spec.holder_identity).as_deref(),
        Some(pod_name.as_str()),
        "the update made with the pod-bound token must be stored"
    );

    let review = Api::<SelfSubjectReview>::all(as_pod)
        .create(&params, &SelfSubjectReview::default())
        .await
        .expect("any authenticated identity may create a SelfSubjectReview");
    let user =
        review.status.and_then(|status| status.user_info).expect("a SelfSubjectReview response carries the user info");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:locker", namespace.name).as_str()),
        "the token must authenticate as the service account"
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec![pod_name.clone()]),
        "a pod-bound token must carry the pod's name (extra: {extra:?})"
    );
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-uid"),
        Some(&vec![pod_uid]),
        "a pod-bound token must carry the pod's uid (extra: {extra:?})"
    );
}

#[tokio::test]
async fn teardown_leaves_no_processes() {
    let control_plane = ControlPlane::start().expect("a second control plane should start");
    let pids = control_plane.child_pids();
    assert_eq!(pids.len(), 3, "etcd, kube-apiserver and kube-controller-manager should be running: {pids:?}");
    for &pid in &pids {
        assert!(process_exists(pid), "child {pid} should be alive before drop");
    }

    drop(control_plane);

    for &pid in &pids {
        assert!(!process_exists(pid), "child {pid} must be killed and reaped when its ControlPlane is dropped");
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "/proc/{pid} must be gone after the ControlPlane is dropped"
        );
    }
}
