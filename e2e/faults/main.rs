//! The fault-injection suite: the whole system — control plane, two controller replicas,
//! worker pods with sidecars, hold-mode pods, `leasehold run` pods, fenced resources
//! (PostgreSQL, a webhook-fenced ConfigMap) — under pauses, crashes, restarts,
//! partitions, clock faults, deletions, forced releases, timing edits and adversarial
//! writes, with a checker of what every app believed and what every resource applied
//! ([`checker`]).
//!
//! `short_fault_run` (in `make test`) injects at least 100 faults including every kind;
//! `full_fault_run` (`make test-faults`) at least 1,000. The scenario tests each pair a
//! run of the real product with a run of a build broken on purpose (test-only cargo
//! features), which the checker must catch (`make test-faults` builds and runs them;
//! `long_holds_cut_off_from_the_apiserver_self_fence` also runs in `make test`). Worlds
//! run one at a time.

use leasehold_e2e_support as support;

mod adversary;
mod app;
mod beliefs;
mod checker;
mod global;
mod history;
mod holdapp;
mod inject;
mod record;
mod runjob;
mod world;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use history::{Fault, Resource};
use tokio::sync::RwLock;
use world::{ELECTION, Layout, World};

/// One world at a time in this test binary: each runs a control plane and a dozen
/// processes, and the checks are about timing; worlds competing for the CPU would test
/// the machine.
static ONE_WORLD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many faults of each kind, at least, and in all.
struct Plan {
    total: usize,
    min_local: usize,
    min_global: usize,
    /// Pause between global faults.
    global_every: Duration,
    limit: Duration,
}

/// The checker's bounds for these worlds.
const BOUNDS: checker::Bounds = checker::Bounds {
    slack: Duration::from_secs(2),
    election: ELECTION,
    // One retry period (1 s) for the next renewal to be refused, and 1 s of slack.
    notify: Duration::from_secs(2),
};

fn counts(faults: &[Fault]) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for f in faults {
        *counts.entry(f.kind).or_insert(0) += 1;
    }
    counts
}

fn done(world: &World, plan: &Plan) -> bool {
    let faults = world.history.faults();
    let c = counts(&faults);
    faults.len() >= plan.total
        && inject::local_kinds(&world.layout).iter().all(|k| c.get(k).copied().unwrap_or(0) >= plan.min_local)
        && global::GLOBAL.iter().all(|k| c.get(k).copied().unwrap_or(0) >= plan.min_global)
}

/// Records a fault and waits until each affected lock works again: granted again, or its
/// holder told it still holds it (or the bound, with slack, passes: the checker reports
/// it). Pacing only: the checker judges recovery from the history.
async fn settle(world: &World, fault: Fault) {
    world.history.fault(fault.clone());
    if checker::class(fault.kind) == checker::Class::Refused {
        return;
    }
    let limit = checker::recovery_bound(fault.kind, fault.lease, &BOUNDS).unwrap_or_default() + Duration::from_secs(8);
    // Told "held" after the injection is over: answers from before prove nothing.
    let after = fault.recover_from.max(Instant::now()) + Duration::from_millis(100);
    for lock in &fault.locks {
        tokio::select! {
            _ = world.leases.wait_grant_after(lock, fault.recover_from, limit) => {}
            _ = world.history.wait_told_held(lock, after, limit) => {}
        }
    }
}

async fn run(plan: Plan, layout: Layout) -> checker::Report {
    let _alone = ONE_WORLD.lock().await;
    let started = Instant::now();
    let world = World::start(layout).await;
    eprintln!("faults: system up in {:.1}s", started.elapsed().as_secs_f64());
    let started = Instant::now();
    let gate = Arc::new(RwLock::new(()));
    let plan = Arc::new(plan);
    let anchors = {
        let world = world.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                world.anchor().await;
            }
        })
    };
    let mut loops = Vec::new();
    let locks = world.all_locks();
    for (i, lock) in locks.iter().cloned().enumerate() {
        let (world, gate, plan) = (world.clone(), gate.clone(), plan.clone());
        let kinds = inject::kinds_for(&lock);
        // Each ordinary lock starts at a different place in the list: every kind comes
        // early in the run.
        let mut n = i * kinds.len() / world.locks.len().max(1);
        loops.push(tokio::spawn(async move {
            while !done(&world, &plan) && started.elapsed() < plan.limit {
                let kind = kinds[n % kinds.len()];
                n += 1;
                // A global fault waits until this one has been injected and the lock
                // works again: its recovery is judged undisturbed.
                let _shared = gate.read().await;
                world.ensure_workers(&lock).await;
                match inject::local(&world, kind, &lock).await {
                    Some(fault) => settle(&world, fault).await,
                    None => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }));
    }
    {
        let (world, gate, plan) = (world.clone(), gate.clone(), plan.clone());
        loops.push(tokio::spawn(async move {
            let mut n = 0;
            while !done(&world, &plan) && started.elapsed() < plan.limit {
                tokio::time::sleep(plan.global_every).await;
                let kind = global::GLOBAL[n % global::GLOBAL.len()];
                n += 1;
                // Outages of the apiserver, etcd or every controller, and re-creating a lock,
                // wait for the faults on single locks to be done (their API calls would fail
                // for reasons of their own); a controller killed, paused or with its clock
                // moved is one more fault among the others.
                let _exclusive = if global::EXCLUSIVE.contains(&kind) { Some(gate.write().await) } else { None };
                eprintln!("faults: {} global {kind}", World::since(started));
                let fault = global::global(&world, kind).await;
                settle(&world, fault).await;
            }
        }));
    }
    for l in loops {
        l.await.expect("a fault loop panicked");
    }
    anchors.abort();
    let (report, entries, faults) = finish(&world).await;
    eprintln!("faults: finished in {:.1}s\n{report}", started.elapsed().as_secs_f64());
    show_violations(&report, &entries, &faults, &world.leases.history());
    report
}

/// Prints the history around the first violations (and the faults and Lease states near
/// them).
fn show_violations(
    report: &checker::Report,
    entries: &[history::Entry],
    faults: &[Fault],
    leases: &record::LeaseHistory,
) {
    let Some(base) = entries.iter().map(|e| e.at).chain(faults.iter().map(|f| f.start)).min() else { return };
    for (lock, from, to, violation) in &report.windows {
        let slots =
            leases.states.iter().filter(|(name, _)| leasehold::lease::slot::of_lease_name(lock, name).is_some());
        for (lease, s) in slots
            .flat_map(|(name, l)| l.iter().map(move |s| (name, s)))
            .filter(|(_, s)| s.seen >= *from && s.seen <= *to)
        {
            eprintln!(
                "    +{:>8} ms lease {lease}: exists {} holder {:?} token {:?} draining {:?} revoked {:?}",
                history::signed_ms(base, s.seen),
                s.exists,
                s.holder,
                s.token,
                s.draining,
                s.revoked
            );
        }
        eprintln!("violation: {violation}");
        for f in faults.iter().filter(|f| f.locks.contains(lock) && f.start <= *to && f.recover_from + f.lease >= *from)
        {
            eprintln!(
                "  fault {} on {} at +{} ms, recovery from +{} ms: {}",
                f.kind,
                f.victim.as_deref().unwrap_or("-"),
                history::signed_ms(base, f.start),
                history::signed_ms(base, f.recover_from),
                f.note
            );
        }
        eprintln!("{}", checker::window(entries, lock, *from, *to, base));
    }
}

/// Stops the apps and checks what they did: the report, with the histories it read.
async fn finish(world: &World) -> (checker::Report, Vec<history::Entry>, Vec<Fault>) {
    world.stop_workers().await;
    world.anchor().await;
    runjob::collect(world).await;
    let applied = applied(world).await;
    let entries = world.history.entries();
    let faults = world.history.faults();
    let leases = world.leases.history();
    let identities: HashMap<String, String> =
        world.identities.lock().expect("lock").iter().map(|(a, i)| (a.clone(), i.clone())).collect();
    let permits: HashMap<String, usize> =
        world.all_locks().into_iter().filter_map(|l| world::permits_of(&l).map(|n| (l, n))).collect();
    let writers: HashSet<String> = world.writers.lock().expect("lock").iter().cloned().collect();
    let inputs = checker::Inputs {
        entries: &entries,
        faults: &faults,
        leases: &leases,
        identities: &identities,
        permits: &permits,
        writers: &writers,
        applied: &applied,
        bounds: BOUNDS,
    };
    let mut report = checker::check(&inputs);
    report.landed_after_failure = world
        .configmaps
        .versions()
        .iter()
        .filter(|v| v.name.starts_with("inventory-") && !v.deleted && !world.configmaps.answered(v.rv))
        .filter(|v| v.writer.as_deref().is_some_and(|w| !w.ends_with("/adversary")))
        .count();
    (report, entries, faults)
}

/// What each resource applied, in commit order.
async fn applied(world: &World) -> checker::Applied {
    let mut applied = checker::Applied::new();
    for (table, resource) in [("fenced_audit", Resource::Postgres), ("unfenced_audit", Resource::Unfenced)] {
        let rows =
            world.db.query(&format!("SELECT id, writer, token FROM {table} ORDER BY seq"), &[]).await.expect("audit");
        for row in rows {
            applied
                .entry((row.get(0), resource))
                .or_default()
                .push(checker::AppliedWrite { writer: row.get(1), token: row.get(2) });
        }
    }
    for v in world.configmaps.versions() {
        let (Some(lock), Some(token), Some(writer)) = (v.name.strip_prefix("inventory-"), v.token, v.writer) else {
            continue;
        };
        // Versions moved out of the lock's fence are not its (an accepted move is reported
        // as such).
        if !v.deleted && v.fenced_by.as_deref() == Some(lock) {
            applied
                .entry((lock.to_owned(), Resource::ConfigMap))
                .or_default()
                .push(checker::AppliedWrite { writer, token });
        }
    }
    applied
}

fn assert_clean(report: &checker::Report, total: usize, layout: &Layout) {
    let injected: usize = report.faults.values().sum();
    assert!(injected >= total, "only {injected} faults injected:\n{report}");
    for kind in inject::local_kinds(layout).iter().chain(global::GLOBAL) {
        assert!(report.faults.get(kind).copied().unwrap_or(0) > 0, "no {kind} fault injected:\n{report}");
    }
    assert!(report.grants > injected / 2, "too few grants for a meaningful run:\n{report}");
    assert!(report.zombies.2 > 0, "no zombie write was exercised:\n{report}");
    assert!(report.violations.is_empty(), "violations:\n{report}");
    if layout.permits {
        // The locks with several permits were shared, and written alone.
        for lock in [world::SEMAPHORE_LOCK, world::RW_LOCK] {
            let most = report.permits.get(lock).map_or(0, |p| p.0);
            assert_eq!(most, world::PERMITS, "lock {lock} never had all its permits believed at once:\n{report}");
        }
        let writes = report.permits.get(world::RW_LOCK).map_or(0, |p| p.1);
        assert!(writes > 0, "no app believed it held lock {} in write mode:\n{report}", world::RW_LOCK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_fault_run() {
    let layout = Layout::full(3, 3);
    let plan = Plan {
        total: 110,
        min_local: 1,
        min_global: 1,
        global_every: Duration::from_secs(2),
        limit: Duration::from_secs(300),
    };
    let report = run(plan, layout.clone()).await;
    assert_clean(&report, 100, &layout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by `make test-faults`"]
async fn full_fault_run() {
    let layout = Layout::full(4, 3);
    let plan = Plan {
        total: 1050,
        min_local: 10,
        min_global: 5,
        global_every: Duration::from_secs(10),
        limit: Duration::from_secs(3600),
    };
    let report = run(plan, layout.clone()).await;
    assert_clean(&report, 1000, &layout);
}

/// Runs `kinds` in turn, `times` times, on the first lock of a world with `layout`.
async fn scenario(layout: Layout, kinds: &[&'static str], times: usize) -> checker::Report {
    let _alone = ONE_WORLD.lock().await;
    let world = World::start(layout).await;
    for _ in 0..times {
        for &kind in kinds {
            let lock = match kind {
                "max-hold" => world::MAX_HOLD_LOCK.to_owned(),
                _ if world.locks.is_empty() => world::RW_LOCK.to_owned(),
                _ => world.locks[0].clone(),
            };
            world.ensure_workers(&lock).await;
            let fault = if global::GLOBAL.contains(&kind) {
                Some(global::global(&world, kind).await)
            } else {
                inject::local(&world, kind, &lock).await
            };
            if let Some(fault) = fault {
                settle(&world, fault).await;
            }
        }
    }
    let (report, entries, faults) = finish(&world).await;
    show_violations(&report, &entries, &faults, &world.leases.history());
    report
}

/// Long critical sections (every one longer than the lease), apps that trust only answers.
fn long_holds(holder_bin: Option<String>, controller_bin: Option<String>) -> Layout {
    Layout { sections: world::Sections::long(), views_only: true, holder_bin, controller_bin, ..Layout::plain(1, 3) }
}

/// The binary named by environment variable `var` (set by `make test-faults`).
fn broken(var: &str) -> Option<String> {
    Some(std::env::var(var).unwrap_or_else(|_| panic!("{var} names the broken binary (make test-faults builds it)")))
}

/// Holders cut off from the apiserver in the middle of long critical sections self-fence
/// in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_holds_cut_off_from_the_apiserver_self_fence() {
    let report = scenario(long_holds(None, None), &["network-blackhole"], 3).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.faults.get("network-blackhole"), Some(&3), "{report}");
}

/// A sidecar built with `broken-ignore-renew-deadline` keeps saying "held" after its renew
/// deadline: cut off from the apiserver, it goes on while the controller grants the lock
/// to another pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken sidecar binary: run by `make test-faults`"]
async fn broken_sidecar_is_caught() {
    let layout = long_holds(broken("LEASEHOLD_BROKEN_SIDECAR"), None);
    let report = scenario(layout, &["network-blackhole"], 3).await;
    eprintln!("broken sidecar run:\n{report}");
    assert!(report.violations.iter().any(|v| v.contains("both believed they held")), "{report}");
}

/// Forced releases, holds outliving `maxHoldSeconds` and force-deleted Pods revoke holds
/// whose apps may still believe: the next grant waits until they cannot.
fn revocations(controller_bin: Option<String>) -> Layout {
    Layout { max_hold: true, ..long_holds(None, controller_bin) }
}

const REVOKING: &[&str] = &["force-release", "max-hold", "pod-force-deleted", "max-hold"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "with its broken counterpart: run by `make test-faults`"]
async fn revoked_holds_drain_before_the_next_grant() {
    let report = scenario(revocations(None), REVOKING, 2).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.faults.get("force-release").is_some_and(|n| *n > 0), "{report}");
    assert!(report.faults.get("max-hold").is_some_and(|n| *n > 0), "{report}");
}

/// A controller built with `broken-regrant-at-once` grants the next holder in the revoking
/// write: the revoked app, still inside the `remainingMs` it was given, overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken controller binary: run by `make test-faults`"]
async fn broken_controller_regrant_is_caught() {
    let report = scenario(revocations(broken("LEASEHOLD_BROKEN_CONTROLLER")), REVOKING, 2).await;
    eprintln!("broken controller run:\n{report}");
    assert!(report.violations.iter().any(|v| v.contains("both believed they held")), "{report}");
}

/// Two workers, short and long sections, apps that trust only answers: a worker claiming
/// behind a short section is granted within the retry period (1 s), so its grant is
/// answered before it is confirmed, and half of those holds outlast the confirm timeout
/// while the other worker waits. The controllers' confirm timeout (300 ms) is shorter than
/// the retry period, so such a grant is always still unconfirmed past it.
fn answered_early(controller_bin: Option<String>) -> Layout {
    let sections = world::Sections { mix: vec![(1, 200, 600), (1, 2000, 4000)], step: (250, 500) };
    let confirm_timeout = Some(Duration::from_millis(300));
    Layout { sections, views_only: true, controller_bin, confirm_timeout, ..Layout::plain(1, 2) }
}

const EARLY_FAULTS: &[&str] = &["network-delay", "clock-ahead", "clock-behind"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "with its broken counterpart: run by `make test-faults`"]
async fn a_grant_answered_before_its_confirmation_is_never_granted_again_under_it() {
    let report = scenario(answered_early(None), EARLY_FAULTS, 3).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
}

/// A controller built with `broken-unconfirmed-at-once` revokes a grant its holder has not
/// confirmed within the confirm timeout, though the holder answered it at once (its first
/// renewal is a retry period after its claim): the next holder overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken controller binary: run by `make test-faults`"]
async fn broken_unconfirmed_revocation_is_caught() {
    let report = scenario(answered_early(broken("LEASEHOLD_BROKEN_UNCONFIRMED")), EARLY_FAULTS, 3).await;
    eprintln!("broken unconfirmed revocation run:\n{report}");
    assert!(report.violations.iter().any(|v| v.contains("both believed they held")), "{report}");
}

/// The semaphore and the read-write lock alone (no ordinary lock): faults run on the
/// read-write lock, whose writers and readers come and go meanwhile. Sections are long,
/// so that readers overlap and a writer often waits while one of them still holds.
fn readers_and_writers(controller_bin: Option<String>) -> Layout {
    Layout { permits: true, sections: world::Sections::long(), controller_bin, ..Layout::plain(0, 3) }
}

const RW_FAULTS: &[&str] = &["holder-sigstop", "waiter-sigstop", "holder-sigkill"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "with its broken counterpart: run by `make test-faults`"]
async fn a_writer_never_holds_beside_readers() {
    let report = scenario(readers_and_writers(None), RW_FAULTS, 4).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.permits.get(world::RW_LOCK).is_some_and(|(_, writes)| *writes > 0), "no writer held:\n{report}");
}

/// A controller built with `broken-writer-shares` serves a writer once slot 0 is free,
/// beside the readers holding the other slots. Only a writer granted while readers hold
/// shows it, and a short run may grant a single writer with no reader on: twelve faults
/// make the run long enough for several writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken controller binary: run by `make test-faults`"]
async fn broken_writer_sharing_is_caught() {
    let report = scenario(readers_and_writers(broken("LEASEHOLD_BROKEN_SERVE")), RW_FAULTS, 12).await;
    eprintln!("broken serving run:\n{report}");
    assert!(report.violations.iter().any(|v| v.contains("beside writer")), "{report}");
}

/// Force-deleted Pods whose containers keep running, with the controllers down: the
/// holder learns its hold is gone only when its renewals are refused with its token (its
/// authentication stays cached up to 10 s after the Pod is gone).
const POD_DELETIONS: &[&str] = &["pod-deleted-controllers-down"];

/// Critical sections long enough (25–30 s) that the holder still works when its token is
/// refused.
fn longest_holds(holder_bin: Option<String>) -> Layout {
    Layout {
        sections: world::Sections { mix: vec![(1, 25_000, 30_000)], step: (250, 500) },
        ..long_holds(holder_bin, None)
    }
}

/// A force-deleted Pod's sidecar reports the hold lost as soon as its token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "with its broken counterpart: run by `make test-faults`"]
async fn a_force_deleted_pods_sidecar_reports_lost_promptly() {
    let report = scenario(longest_holds(None), POD_DELETIONS, 3).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert_eq!(report.faults.get("pod-deleted-controllers-down"), Some(&3), "{report}");
}

/// A holder built with `broken-401-transient` retries a renewal refused with 401 until its
/// renew deadline, telling its app "held" meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken holder binary: run by `make test-faults`"]
async fn broken_holder_401_is_caught() {
    let report = scenario(longest_holds(broken("LEASEHOLD_BROKEN_HOLDER")), POD_DELETIONS, 3).await;
    eprintln!("broken holder run:\n{report}");
    assert!(
        report.violations.iter().any(|v| v.contains("after the apiserver began refusing its pod's token")),
        "{report}"
    );
}

const FENCE_ATTACKS: &[&str] = &["adv-fenced-relabel", "adv-fenced-unlabel", "adv-fenced-delete"];

/// Moving a fenced object out of its fence (relabel, unlabel) or deleting it with a stale
/// token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "with its broken counterpart: run by `make test-faults`"]
async fn fenced_objects_cannot_be_moved_out_of_their_fence() {
    let report = scenario(Layout::plain(1, 3), FENCE_ATTACKS, 2).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    for kind in FENCE_ATTACKS {
        assert!(report.adversaries.get(kind).is_some_and(|(refused, _, _)| *refused > 0), "{kind}:\n{report}");
    }
}

/// A webhook built with `broken-fence-new-label` judges a write by the lock its new object
/// names: relabelling a fenced object to another lock, with that lock's token, gets
/// through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken webhook binary: run by `make test-faults`"]
async fn broken_webhook_relabel_is_caught() {
    let layout = Layout { controller_bin: broken("LEASEHOLD_BROKEN_WEBHOOK"), ..Layout::plain(1, 3) };
    let report = scenario(layout, &["adv-fenced-relabel"], 2).await;
    eprintln!("broken webhook run:\n{report}");
    assert!(
        report.violations.iter().any(|v| v.contains("adv-fenced-relabel by") && v.contains("was accepted")),
        "{report}"
    );
}

/// A holder cannot hand its lock on to a waiter it chooses, or with a token it chooses:
/// only the grant the controller recorded for the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "with its broken counterpart: run by `make test-faults`"]
async fn a_holder_cannot_hand_its_lock_to_whom_it_chooses() {
    let report = scenario(Layout::plain(1, 3), &["adv-forged-handoff"], 4).await;
    eprintln!("{report}");
    assert!(report.violations.is_empty(), "{report}");
    assert!(report.adversaries.get("adv-forged-handoff").is_some_and(|(refused, _, _)| *refused > 0), "{report}");
}

/// A guard built with `broken-guard-handoff` lets a holder hand its lock on as it likes:
/// the forged handoff gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the broken guard's binary: run by `make test-faults`"]
async fn broken_guard_handoff_is_caught() {
    let layout = Layout { guard_bin: broken("LEASEHOLD_BROKEN_GUARD"), ..Layout::plain(1, 3) };
    let report = scenario(layout, &["adv-forged-handoff"], 2).await;
    eprintln!("broken guard run:\n{report}");
    assert!(
        report.violations.iter().any(|v| v.contains("adv-forged-handoff by") && v.contains("was accepted")),
        "{report}"
    );
}

/// Diagnosis helper: a sequence of faults (`FAULT_KIND`, comma-separated), `FAULT_TIMES`
/// times, on one lock of a full world; prints what happened around each violation (around
/// every fault with `FAULT_HISTORY` set) and fails on any violation. Not part of any suite (`make test-faults` skips it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "diagnosis only"]
async fn repeat_one_fault() {
    let kinds = std::env::var("FAULT_KIND").expect("FAULT_KIND names the faults to repeat, comma-separated");
    let kinds: Vec<&'static str> = kinds.split(',').map(|k| &*Box::leak(k.to_owned().into_boxed_str())).collect();
    let times = std::env::var("FAULT_TIMES").ok().and_then(|n| n.parse().ok()).unwrap_or(3);
    let world = World::start(Layout::full(1, 3)).await;
    for _ in 0..times {
        for &kind in &kinds {
            let fault = if global::GLOBAL.contains(&kind) {
                Some(global::global(&world, kind).await)
            } else {
                let lock = world
                    .all_locks()
                    .into_iter()
                    .find(|l| inject::kinds_for(l).contains(&kind))
                    .expect("a lock for this fault");
                world.ensure_workers(&lock).await;
                inject::local(&world, kind, &lock).await
            };
            if let Some(fault) = fault {
                settle(&world, fault).await;
            }
            // FAULT_PAUSE (seconds) spaces the faults out, to tell their effects apart.
            let pause = std::env::var("FAULT_PAUSE").ok().and_then(|p| p.parse().ok()).unwrap_or(0);
            tokio::time::sleep(Duration::from_secs(pause)).await;
        }
    }
    let (report, entries, faults) = finish(&world).await;
    eprintln!("{report}");
    show_violations(&report, &entries, &faults, &world.leases.history());
    let base = faults.iter().map(|f| f.start).min().expect("faults");
    for f in faults.iter().filter(|_| std::env::var_os("FAULT_HISTORY").is_some()) {
        for lock in &f.locks {
            let to = f.recover_from + Duration::from_secs(15);
            eprintln!(
                "fault {} on {lock} ({}):\n{}",
                f.kind,
                f.note,
                checker::window(&entries, lock, f.start, to, base)
            );
        }
    }
    assert!(report.violations.is_empty(), "{report}");
}
