//! The faults that hit one lock: its holder, a waiter, its Lease, its timing. Each
//! returns the fault record (from when recovery is measured, the lease duration the
//! affected hold was granted under), or `None` if there was nothing to hit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use leasehold::crd::{ANNOTATION_FORCE_RELEASE, DistributedLock};
use leasehold_harness::Fault as NetFault;
use serde_json::json;

use super::history::Fault;
use super::world::{
    AppKind, CALLER_TTL, HOLD_LOCK, JOB_LOCK, LEASE, MAX_HOLD_LOCK, MAX_HOLD_SECONDS, RW_LOCK, SEMAPHORE_LOCK, Worker,
    World, set_clock,
};

/// How long a fault on a caller-owned hold waits for an app of that kind to hold the lock.
const OWNER_WAIT: Duration = Duration::from_secs(30);

/// Faults on an ordinary lock (worker pods with sidecars).
pub const SIDECAR: &[&str] = &[
    "holder-sigstop",
    "adv-lease-delete",
    "force-release",
    "waiter-sigstop",
    "adv-claim-delete",
    "holder-sigkill",
    "pod-force-deleted",
    "adv-fenced-relabel",
    "network-blackhole",
    "timing-shorter",
    "adv-free-lease-write",
    "holder-pod-deleted",
    "clock-ahead",
    "adv-fenced-unlabel",
    "lease-deleted",
    "holder-sigterm",
    "adv-lease-recreate",
    "network-drop",
    "timing-longer",
    "adv-fenced-delete",
    "clock-behind",
    "network-delay",
    "lease-deleted-twice",
    "app-sigkill",
    "app-hung",
    "adv-forged-handoff",
];

/// Faults on the semaphore and the read-write lock: those on an ordinary lock but the
/// adversaries of fenced objects (their holders write to no shared fenced resource).
pub const PERMIT: &[&str] = &[
    "holder-sigstop",
    "adv-lease-delete",
    "force-release",
    "waiter-sigstop",
    "adv-claim-delete",
    "holder-sigkill",
    "pod-force-deleted",
    "network-blackhole",
    "timing-shorter",
    "adv-free-lease-write",
    "holder-pod-deleted",
    "clock-ahead",
    "lease-deleted",
    "holder-sigterm",
    "adv-lease-recreate",
    "network-drop",
    "timing-longer",
    "clock-behind",
    "network-delay",
    "lease-deleted-twice",
    "app-sigkill",
    "app-hung",
    "adv-forged-handoff",
];

/// Faults on the max-hold lock.
pub const MAX_HOLD: &[&str] = &["max-hold"];
/// Faults on the hold-mode lock.
pub const HOLD: &[&str] = &["hold-sidecar-sigkill", "hold-sidecar-sigstop"];
/// Faults on the job lock.
pub const JOB: &[&str] = &["run-sigkill", "run-grandchild"];

/// The faults that apply to `lock`.
pub fn kinds_for(lock: &str) -> &'static [&'static str] {
    match lock {
        MAX_HOLD_LOCK => MAX_HOLD,
        HOLD_LOCK => HOLD,
        JOB_LOCK => JOB,
        SEMAPHORE_LOCK | RW_LOCK => PERMIT,
        _ => SIDECAR,
    }
}

/// Every local kind a world with `layout`'s locks injects.
pub fn local_kinds(layout: &super::world::Layout) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    if layout.locks > 0 {
        kinds.extend(SIDECAR);
    }
    for (on, list) in [(layout.max_hold, MAX_HOLD), (layout.hold, HOLD), (layout.job, JOB)] {
        if on {
            kinds.extend(list);
        }
    }
    kinds
}

/// Waits for `d`: the fault's duration (it holds a component stopped or a link broken).
async fn hold_fault(d: Duration) {
    tokio::time::sleep(d).await;
}

/// A fault on `lock` injected at `start`, recovering from `recover_from`.
fn record(kind: &'static str, lock: &str, start: Instant, recover_from: Instant) -> Fault {
    Fault { kind, locks: vec![lock.to_owned()], start, recover_from, lease: LEASE, victim: None, note: String::new() }
}

/// Sets the lock's timing (the DistributedLock's spec), as an operator would.
async fn set_timing(world: &World, lock: &str, lease: i32, renew: i32, retry: i32) -> Result<(), kube::Error> {
    let patch =
        json!({"spec": {"leaseDurationSeconds": lease, "renewDeadlineSeconds": renew, "retryPeriodSeconds": retry}});
    world.env.locks().patch(lock, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
}

/// Restores the lock's timing, trying for a while (the apiserver may be busy).
async fn restore_timing(world: &World, lock: &str) {
    let base = super::world::timing();
    for _ in 0..20 {
        let restored = set_timing(
            world,
            lock,
            base.lease_duration_seconds,
            base.renew_deadline_seconds,
            base.retry_period_seconds,
        );
        if restored.await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("could not restore the timing of lock {lock}");
}

/// Injects local fault `kind` on `lock`.
pub async fn local(world: &Arc<World>, kind: &'static str, lock: &str) -> Option<Fault> {
    if kind.starts_with("adv-") {
        return super::adversary::attempt(world, kind, lock).await;
    }
    match kind {
        "waiter-sigstop" => {
            let holder = world.holder(lock).map(|w| w.name.clone());
            let waiter = world.other_worker(lock, holder.as_deref())?;
            let start = Instant::now();
            world.signal_sidecar(&waiter, libc::SIGSTOP);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            world.signal_sidecar(&waiter, libc::SIGCONT);
            return Some(record(kind, lock, start, start));
        }
        "lease-deleted" => {
            let start = Instant::now();
            let answer = gc_delete(world, lock).await;
            return Some(Fault { note: answer, ..record(kind, lock, start, start) });
        }
        "lease-deleted-twice" => return lease_deleted_twice(world, lock).await,
        "app-sigkill" => {
            // A session-bound holder's app dies: its connection closes with it.
            let target = world.wait_holder_of(lock, AppKind::Session, OWNER_WAIT).await?;
            let start = Instant::now();
            world.restart_app(&target).await;
            return Some(Fault { victim: Some(target.name.clone()), ..record(kind, lock, start, start) });
        }
        "app-hung" => {
            // A heartbeat holder's app hangs past its TTL with its sockets open.
            let target = world.wait_holder_of(lock, AppKind::Heartbeat, OWNER_WAIT).await?;
            let start = Instant::now();
            *target.hung_until.lock().expect("lock") = Some(start + CALLER_TTL + Duration::from_secs(1));
            return Some(Fault { victim: Some(target.name.clone()), ..record(kind, lock, start, start) });
        }
        "max-hold" => return max_hold(world, lock).await,
        "timing-longer" => return timing_longer(world, lock).await,
        _ => {}
    }
    let target = world.wait_holder(lock).await?;
    let start = Instant::now();
    let mut fault = Fault { victim: Some(target.name.clone()), ..record(kind, lock, start, start) };
    match kind {
        "holder-sigstop" | "hold-sidecar-sigstop" => {
            let token = *target.last_token.lock().expect("lock");
            world.signal_sidecar(&target, libc::SIGSTOP);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            world.signal_sidecar(&target, libc::SIGCONT);
            if let Some(token) = token.filter(|_| kind == "holder-sigstop") {
                super::app::zombie(world, &target, token).await;
            }
        }
        "holder-sigkill" => {
            world.kill_sidecar(&target);
            world.start_sidecar(&target).await;
        }
        "hold-sidecar-sigkill" => {
            world.kill_sidecar(&target);
            // The kubelet restarts a crashed container after a pause; the hold file stays.
            tokio::time::sleep(Duration::from_secs(1)).await;
            world.start_sidecar(&target).await;
        }
        "holder-sigterm" => {
            // A container restart: the sidecar alone is stopped, its app keeps running.
            let process = target.sidecar.lock().expect("lock").take();
            if let Some(mut p) = process {
                p.terminate(Duration::from_secs(10)).await;
            }
            world.start_sidecar(&target).await;
        }
        "holder-pod-deleted" => {
            // A graceful deletion: the kubelet stops the app first (it releases), then the
            // sidecar (SIGTERM), then the Pod object goes.
            target.stop.cancel();
            let apps = std::mem::take(&mut *target.apps.lock().expect("lock"));
            for app in apps {
                let _ = tokio::time::timeout(Duration::from_secs(30), app).await;
            }
            let process = target.sidecar.lock().expect("lock").take();
            if let Some(mut p) = process {
                p.terminate(Duration::from_secs(10)).await;
            }
            delete_pod(world, &target.name).await;
            world.workers.lock().expect("lock").remove(&target.name);
        }
        "pod-force-deleted" => {
            force_delete(world, &target).await;
            let (world, target) = (world.clone(), target.clone());
            tokio::spawn(async move {
                refused(&world, &target).await;
                tokio::time::sleep(LEASE).await;
                world.retire(&target).await;
            });
        }
        "network-drop" => {
            target.proxy.set(NetFault::Drop);
            hold_fault(Duration::from_secs(3)).await;
            target.proxy.set(NetFault::Pass);
        }
        "network-delay" => {
            target.proxy.set(NetFault::Delay(Duration::from_millis(1500)));
            hold_fault(Duration::from_secs(5)).await;
            target.proxy.set(NetFault::Pass);
        }
        "network-blackhole" | "run-grandchild" => {
            // For a `leasehold run` pod: the hold is lost while the command and its
            // children run.
            target.proxy.set(NetFault::Blackhole);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            target.proxy.set(NetFault::Pass);
        }
        "run-sigkill" => {
            if !super::runjob::signal_run(&target, libc::SIGKILL) {
                return None;
            }
        }
        "clock-ahead" | "clock-behind" => {
            set_clock(&target.clock, if kind == "clock-ahead" { "+3600" } else { "-3600" });
            hold_fault(Duration::from_secs(4)).await;
            set_clock(&target.clock, "+0");
        }
        "force-release" => fault.note = force_release(world, lock).await,
        "timing-shorter" => {
            // The hold was granted under 5 s / 4 s; the lock now says 3 s / 2 s, and its
            // holder stops renewing.
            set_timing(world, lock, 3, 2, 1).await.ok()?;
            world.signal_sidecar(&target, libc::SIGSTOP);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            world.signal_sidecar(&target, libc::SIGCONT);
            restore_timing(world, lock).await;
        }
        other => panic!("unknown local fault {other}"),
    }
    Some(fault)
}

/// A hold granted under a longer timing (8 s / 6 s / 2 s); the lock goes back to 5 s /
/// 4 s / 1 s while it is held, and the holder stops renewing.
async fn timing_longer(world: &Arc<World>, lock: &str) -> Option<Fault> {
    let edited = Instant::now();
    set_timing(world, lock, 8, 6, 2).await.ok()?;
    let granted = world.leases.wait_grant_after(lock, edited, Duration::from_secs(20)).await;
    let target = match granted {
        Some(_) => world.wait_holder(lock).await,
        None => None,
    };
    restore_timing(world, lock).await;
    let target = target?;
    let start = Instant::now();
    world.signal_sidecar(&target, libc::SIGSTOP);
    hold_fault(Duration::from_secs(9)).await;
    world.signal_sidecar(&target, libc::SIGCONT);
    Some(Fault {
        lease: Duration::from_secs(8),
        victim: Some(target.name.clone()),
        ..record("timing-longer", lock, start, start)
    })
}

/// The Pod object of `target` is force-deleted (its node is unreachable); its containers
/// keep running, and their connections are reset as the node's network heals.
pub async fn force_delete(world: &World, target: &Worker) {
    delete_pod(world, &target.name).await;
    target.proxy.set(NetFault::Drop);
    tokio::time::sleep(Duration::from_millis(200)).await;
    target.proxy.set(NetFault::Pass);
}

/// Probes with `target`'s own token until the apiserver refuses it (its authentication
/// stays cached for up to 10 s after the Pod is gone), and records when: from then on its
/// sidecar's renewals are refused too. Gives up after 20 s.
pub async fn refused(world: &World, target: &Worker) -> Option<Instant> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(target.pod.client.clone(), world.env.name());
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let asked = Instant::now();
        if let Err(kube::Error::Api(s)) = leases.get_opt(&target.lock).await
            && s.code == 401
        {
            world.history.log_at(asked, &target.name, &target.lock, super::history::Op::TokenRefused);
            return Some(asked);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Force-deletes Pod `name` (grace period 0).
async fn delete_pod(world: &World, name: &str) {
    let pods: Api<Pod> = Api::namespaced(world.env.ns.client.clone(), world.env.name());
    let _ = pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await;
}

/// Deletes the lock Lease as kube-controller-manager's garbage collector would (the
/// admin impersonating it: the Lease guard lets nobody else delete a lock Lease).
pub async fn gc_delete(world: &World, lock: &str) -> String {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(world.env.cp.kubeconfig_path()).expect("the admin kubeconfig"),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("the admin kubeconfig");
    config.auth_info.impersonate = Some("system:serviceaccount:kube-system:generic-garbage-collector".into());
    let client = kube::Client::try_from(config).expect("an impersonating client");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, world.env.name());
    match leases.delete(lock, &DeleteParams::default()).await {
        Ok(_) => "deleted".into(),
        Err(e) => format!("not deleted: {e}"),
    }
}

/// Two deletions of the lock Lease with no grant in between: the second as soon as the
/// controller has re-created it.
async fn lease_deleted_twice(world: &Arc<World>, lock: &str) -> Option<Fault> {
    let start = Instant::now();
    let first = gc_delete(world, lock).await;
    let gone = world.leases.wait_seen(lock, start, Duration::from_secs(10), |s| !s.exists).await;
    let recreated = match gone {
        Some(gone) => world.leases.wait_seen(lock, gone.seen, Duration::from_secs(10), |s| s.exists).await,
        None => None,
    };
    let second = match recreated {
        Some(s) if !s.is_grant() => gc_delete(world, lock).await,
        Some(_) => "skipped: re-created with a grant".into(),
        None => "skipped: not deleted and re-created within 10 s".into(),
    };
    let end = Instant::now();
    Some(Fault { note: format!("first {first}; second {second}"), ..record("lease-deleted-twice", lock, start, end) })
}

/// An operator's forced release: `leasehold release --force` on even requests, the
/// annotation on odd ones.
async fn force_release(world: &World, lock: &str) -> String {
    static COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let reason = "fault suite: force release under load";
    if COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).is_multiple_of(2) {
        let output = tokio::process::Command::new(crate::support::leasehold_bin())
            .args([
                "release",
                &format!("{}/{lock}", world.env.name()),
                "--force",
                "--reason",
                reason,
                "--timeout",
                "30s",
            ])
            .env("KUBECONFIG", world.env.cp.kubeconfig_path())
            .output()
            .await
            .expect("run leasehold release");
        let text = if output.status.success() { output.stdout } else { output.stderr };
        format!("leasehold release: {}", String::from_utf8_lossy(&text).trim())
    } else {
        let patch = json!({"metadata": {"annotations": {ANNOTATION_FORCE_RELEASE: reason}}});
        let locks: Api<DistributedLock> = world.env.locks();
        match locks.patch(lock, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => "annotated".into(),
            Err(e) => format!("annotation refused: {e}"),
        }
    }
}

/// Waits for a hold on the max-hold lock to be revoked for outliving `maxHoldSeconds`.
async fn max_hold(world: &Arc<World>, lock: &str) -> Option<Fault> {
    world.wait_holder(lock).await?;
    let start = Instant::now();
    let token = world.leases.current(lock).and_then(|s| s.token).unwrap_or_default();
    let limit = Duration::from_secs(u64::try_from(MAX_HOLD_SECONDS).unwrap_or(3)) + LEASE * 2;
    let revoked = world
        .leases
        .wait_seen(lock, start, limit, |s| {
            s.revoked.as_deref() == Some("MaxHold") && s.token.is_some_and(|t| t > token)
        })
        .await?;
    Some(Fault { note: format!("revoked token {token}"), ..record("max-hold", lock, start, revoked.seen) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_faults_are_the_ordinary_ones_but_the_attacks_on_fenced_objects() {
        let expected: Vec<&str> = SIDECAR.iter().copied().filter(|k| !k.starts_with("adv-fenced-")).collect();
        assert_eq!(PERMIT, expected.as_slice());
    }
}
