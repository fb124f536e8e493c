//! Who owns a hold inside the pod, and what ends it besides a release.
//!
//! Every grant goes to one caller of the local API and names it with an owner handle. The
//! caller chooses at acquire time what else ends the hold ([`Terms`]):
//! - **pod-scoped** (the default): nothing but a release, a loss, the end of the pod — or a
//!   restart of the app container that took it ([`Binding`]);
//! - **session-bound**: the acquire's response streams, and the hold ends the moment that
//!   connection closes — a process that dies closes its sockets;
//! - **heartbeat**: the caller keeps a TTL of its own alive with cheap keep-alives; when it
//!   lapses the hold ends at once.
//!
//! Each of these endings is the app letting go: the app can no longer believe it holds (its
//! process or container is gone, or its TTL — which bounds what it was told — has run out),
//! so the lock may be handed on at once. A hold lost while its owner may still believe
//! (revoked under it) is kept until the owner lets go or until everything it was told has
//! run out ([`belief_end`]).

use std::time::{Duration, Instant};

use rand::Rng;

use crate::crd::ClaimMode;

/// Names one hold handed to one caller: `h` and 32 lowercase hex digits (128 random bits).
/// It orders nothing and proves nothing outside the pod: it only keeps one caller's
/// release, keep-alive or view from touching another caller's hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct Handle(String);

impl Handle {
    /// A fresh random handle.
    pub fn random() -> Handle {
        let bits: u128 = rand::rng().random();
        Handle(format!("h{bits:032x}"))
    }

    /// Reads a handle sent by a caller; the error names what is wrong with it.
    pub fn parse(text: &str) -> Result<Handle, String> {
        let hex = text.strip_prefix('h').filter(|rest| rest.len() == 32);
        match hex {
            Some(hex) if hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
                Ok(Handle(text.to_owned()))
            }
            _ => {
                let shown: String = text.chars().take(80).collect();
                Err(format!(
                    "{shown:?} is not an owner handle ('h' and 32 lowercase hex digits, as the grant returned)"
                ))
            }
        }
    }

    /// The handle as sent to callers.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which app container a pod-scoped hold belongs to: when that container's instance that
/// was running at the grant has ended (it restarted, or stopped), the hold is released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// Not tied to a container.
    None,
    /// The container the caller named.
    Container(String),
    /// The pod's only app container, if it has exactly one (callers normally run there).
    OnlyAppContainer,
}

/// What, besides a release or a loss, ends a hold: chosen by the caller at acquire time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terms {
    /// The hold lasts while the acquire's response stream stays open.
    pub session: bool,
    /// The caller's own TTL, kept alive by keep-alives.
    pub ttl: Option<Duration>,
    /// The app container whose restart ends the hold.
    pub binding: Binding,
    /// The mode the hold is taken in.
    pub mode: ClaimMode,
}

impl Terms {
    /// A pod-scoped hold as callers get it by default: bound to the only app container.
    pub fn pod() -> Terms {
        Terms { session: false, ttl: None, binding: Binding::OnlyAppContainer, mode: ClaimMode::Read }
    }

    /// A hold owned by the sidecar itself (hold mode), which lets go on its own terms.
    pub fn sidecar() -> Terms {
        Terms { session: false, ttl: None, binding: Binding::None, mode: ClaimMode::Read }
    }

    /// Whether a caller with a handle owns it: a session or a heartbeat. Such a hold is
    /// released only with its handle, never by lock name alone.
    pub fn caller_owned(&self) -> bool {
        self.session || self.ttl.is_some()
    }
}

/// Why a hold ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Its owner released it.
    Released,
    /// Its session (the acquire's response stream) closed.
    SessionClosed,
    /// No keep-alive arrived within the caller's TTL.
    HeartbeatLapsed {
        /// The TTL.
        ttl: Duration,
    },
    /// The app container that took it has restarted or stopped since.
    ContainerEnded {
        /// The container.
        container: String,
    },
    /// Hold mode gave leadership up: the app was not running and ready for too long.
    AppDown {
        /// What was wrong with it.
        why: String,
    },
    /// The caller went away before the grant reached it.
    CallerGone,
    /// The hold was lost earlier, and everything its owner was told has run out.
    BeliefEnded {
        /// Why it was lost.
        lost: String,
    },
    /// The sidecar is shutting down.
    Shutdown,
}

impl Ending {
    /// Whether this ending is a release the owner asked for.
    pub fn by_owner(&self) -> bool {
        matches!(self, Ending::Released)
    }

    /// A short label for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Ending::Released => "released",
            Ending::SessionClosed => "session_closed",
            Ending::HeartbeatLapsed { .. } => "heartbeat_lapsed",
            Ending::ContainerEnded { .. } => "container_ended",
            Ending::AppDown { .. } => "app_down",
            Ending::CallerGone => "caller_gone",
            Ending::BeliefEnded { .. } => "belief_ended",
            Ending::Shutdown => "shutdown",
        }
    }
}

/// Label set of [`OwnerMetrics::ended`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct EndingLabel {
    /// [`Ending::code`].
    pub reason: String,
}

/// How holds end, counted.
#[derive(Clone, Default)]
pub struct OwnerMetrics {
    /// Holds given back, by why they ended.
    pub ended: prometheus_client::metrics::family::Family<EndingLabel, prometheus_client::metrics::counter::Counter>,
}

impl OwnerMetrics {
    /// Registers them under `leasehold_sidecar_`.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> OwnerMetrics {
        let metrics = OwnerMetrics::default();
        registry.sub_registry_with_prefix("leasehold_sidecar").register(
            "holds_ended",
            "Holds given back, by why they ended (released, session_closed, heartbeat_lapsed, container_ended, app_down, caller_gone, belief_ended, shutdown)",
            metrics.ended.clone(),
        );
        metrics
    }

    /// Counts one ending.
    pub fn count(&self, ending: &Ending) {
        self.ended.get_or_create(&EndingLabel { reason: ending.code().to_owned() }).inc();
    }
}

impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ending::Released => f.write_str("released by its owner"),
            Ending::SessionClosed => f.write_str("its session closed (the acquire's connection ended)"),
            Ending::HeartbeatLapsed { ttl } => {
                write!(f, "its heartbeat lapsed: no keep-alive within ttlSeconds {}", ttl.as_secs_f64())
            }
            Ending::ContainerEnded { container } => {
                write!(f, "container {container}, which took it, has restarted or stopped since")
            }
            Ending::AppDown { why } => write!(f, "hold mode gave leadership up: {why}"),
            Ending::CallerGone => f.write_str("the caller went away before the grant reached it"),
            Ending::BeliefEnded { lost } => {
                write!(f, "lost ({lost}); let go once everything its owner was told had run out")
            }
            Ending::Shutdown => f.write_str("the sidecar shut down"),
        }
    }
}

/// Time left to report to the owner of a hold: the hold's own time left, never past the
/// caller's TTL deadline.
pub fn remaining(hold_left: Duration, caller_deadline: Option<Instant>, now: Instant) -> Duration {
    match caller_deadline {
        Some(deadline) => hold_left.min(deadline.saturating_duration_since(now)),
        None => hold_left,
    }
}

/// When the owner of a lost hold can no longer believe it holds: the latest deadline any
/// answer implied (`told_until`), or its caller deadline if that comes first; `None` if it
/// was never told anything (it cannot believe at all).
pub fn belief_end(told_until: Option<Instant>, caller_deadline: Option<Instant>) -> Option<Instant> {
    match (told_until, caller_deadline) {
        (Some(told), Some(caller)) => Some(told.min(caller)),
        (told, None) => told,
        (None, Some(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_random_and_parse_back() {
        let (a, b) = (Handle::random(), Handle::random());
        assert_ne!(a, b);
        assert_eq!(Handle::parse(a.as_str()), Ok(a.clone()));
        assert_eq!(a.as_str().len(), 33);
        for bad in ["", "h", "0123", &format!("x{}", &a.as_str()[1..]), &a.as_str().to_uppercase(), &format!("{a}0")] {
            let e = Handle::parse(bad).expect_err(bad);
            assert!(e.contains("not an owner handle"), "{e}");
        }
    }

    #[test]
    fn remaining_never_passes_the_caller_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs;
        let cases = [
            (s(9), None, s(9)),
            (s(9), Some(now + s(5)), s(5)),
            (s(3), Some(now + s(5)), s(3)),
            (s(9), Some(now), s(0)),
            // A deadline already behind the clock: nothing left.
            (s(9), now.checked_sub(s(1)), s(0)),
        ];
        for (hold_left, caller, expected) in cases {
            assert_eq!(remaining(hold_left, caller, now), expected, "{hold_left:?} {caller:?}");
        }
    }

    #[test]
    fn belief_ends_at_the_earlier_of_what_was_told_and_the_ttl() {
        let now = Instant::now();
        let (told, ttl) = (now + Duration::from_secs(8), now + Duration::from_secs(3));
        assert_eq!(belief_end(Some(told), Some(ttl)), Some(ttl));
        assert_eq!(belief_end(Some(ttl), Some(told)), Some(ttl));
        assert_eq!(belief_end(Some(told), None), Some(told));
        assert_eq!(belief_end(None, Some(ttl)), None);
        assert_eq!(belief_end(None, None), None);
    }

    #[test]
    fn only_sessions_and_heartbeats_need_their_handle() {
        assert!(!Terms::pod().caller_owned());
        assert!(!Terms::sidecar().caller_owned());
        assert!(Terms { session: true, ..Terms::pod() }.caller_owned());
        assert!(Terms { ttl: Some(Duration::from_secs(1)), ..Terms::pod() }.caller_owned());
    }

    #[test]
    fn the_ending_metric_is_documented() {
        let mut registry = prometheus_client::registry::Registry::default();
        OwnerMetrics::register(&mut registry).count(&Ending::SessionClosed);
        let text = crate::metrics::render(&registry);
        assert!(text.contains("leasehold_sidecar_holds_ended_total{reason=\"session_closed\"} 1"), "{text}");
        let doc = include_str!("../../docs/metrics.md");
        assert!(doc.contains("`leasehold_sidecar_holds_ended_total`"), "docs/metrics.md lacks it");
        for ending in [
            Ending::Released,
            Ending::SessionClosed,
            Ending::HeartbeatLapsed { ttl: Duration::ZERO },
            Ending::ContainerEnded { container: String::new() },
            Ending::AppDown { why: String::new() },
            Ending::CallerGone,
            Ending::BeliefEnded { lost: String::new() },
            Ending::Shutdown,
        ] {
            assert!(doc.contains(&format!("`{}`", ending.code())), "docs/metrics.md lacks {}", ending.code());
        }
    }

    #[test]
    fn endings_say_why() {
        let lapsed = Ending::HeartbeatLapsed { ttl: Duration::from_millis(2500) };
        assert_eq!(lapsed.to_string(), "its heartbeat lapsed: no keep-alive within ttlSeconds 2.5");
        assert!(Ending::ContainerEnded { container: "app".into() }.to_string().contains("container app"));
        assert!(Ending::Released.by_owner() && !Ending::SessionClosed.by_owner());
    }
}
