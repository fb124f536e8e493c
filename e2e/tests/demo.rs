//! `make demo`'s scripted path, run non-interactively: it must show handoffs between the
//! workers, the expiry of a frozen holder with a higher token for the next, and the
//! frozen worker's stale write rejected — and leave nothing running.

use leasehold_harness::process_exists;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_shows_handoffs_an_expiry_and_a_rejected_stale_write() {
    let options = leasehold_demo::Options {
        leasehold: crate::support::leasehold_bin().into(),
        helm: crate::chart::helm::tool("helm"),
        chart: crate::chart::helm::chart_dir(),
        scripted: true,
        live: false,
        handoffs_before_freeze: 3,
    };
    let mut out = Vec::new();
    let outcome = leasehold_demo::run(options, &mut out, CancellationToken::new()).await.expect("the demo runs");
    let text = String::from_utf8_lossy(&out);

    // Handoffs: several workers held the lock in turn, with strictly increasing tokens.
    let holders: std::collections::BTreeSet<&str> = outcome.grants.iter().map(|(w, _)| w.as_str()).collect();
    assert!(holders.len() >= 3 && outcome.grants.len() >= 5, "{text}");
    assert!(outcome.grants.windows(2).all(|w| w[0].1 < w[1].1), "tokens must increase: {text}");
    // The expiry: while one worker was frozen, another got the lock with a higher token.
    let (frozen, old) = outcome.frozen.clone().expect("a holder was frozen");
    let (next, new) = outcome.expired_to.clone().expect("the frozen hold expired");
    assert!(next != frozen && new > old, "{text}");
    // The frozen worker's stale write was rejected by the database.
    assert_eq!(outcome.stale_rejected, Some((old, new)), "{text}");
    for line in ["FREEZE", "EXPIRED", "THAW", "REJECTED"] {
        assert!(text.contains(line), "no {line} in the output:\n{text}");
    }
    // Nothing left running.
    for pid in &outcome.processes {
        assert!(!process_exists(*pid), "process {pid} is still running after the demo:\n{text}");
    }
}
