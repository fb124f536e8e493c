//! Trying a request again while the apiserver is busy, failing or unreachable, within the
//! caller's deadline: such a state passes, and should cost the caller time, not its work.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use super::cas::status_code;

/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
pub const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between tries before jitter: an apiserver back after a restart is
/// used within twice it.
pub const MAX_PAUSE: Duration = Duration::from_secs(2);
/// The longest pause between tries before jitter while the apiserver answers 429: it is
/// shedding load, and thousands of claimants it turned away together, each back within
/// [`MAX_PAUSE`], kept it busy turning them away. Reached only after five refusals in a
/// row (3 s of them at least).
pub const BUSY_MAX_PAUSE: Duration = Duration::from_secs(15);

/// Whether a request that failed with `error` may succeed if sent again: it got no HTTP
/// status (no answer, a broken connection), or 429 (busy) or a 5xx (failing). A write that
/// failed so may still have landed. A refusal (any other 4xx) is an answer, not a passing
/// state.
pub fn may_pass(error: &kube::Error) -> bool {
    status_code(error).is_none_or(|c| c == 429 || c >= 500)
}

/// Whether an apiserver error is 429: the apiserver is busy (priority and fairness turned
/// the request away, or its storage is not ready yet).
pub fn is_busy(error: &kube::Error) -> bool {
    status_code(error) == Some(429)
}

/// Runs `attempt` until it succeeds, fails with an error `transient` says will not pass,
/// or the next try would start at or past `deadline`; the last error is returned.
/// `retrying` is told of each error that will be tried again, with the pause before it.
///
/// Each pause is its nominal length (doubling from [`FIRST_PAUSE`] up to [`MAX_PAUSE`], or
/// up to [`BUSY_MAX_PAUSE`] for the errors `busy` says are the apiserver's 429s) plus a
/// random part of up to as much again: callers that failed together — thousands of
/// claimants of one overloaded apiserver — do not all try again at the same instant.
pub async fn within<T, E, Fut>(
    deadline: tokio::time::Instant,
    attempt: impl FnMut() -> Fut,
    transient: impl FnMut(&E) -> bool,
    busy: impl Fn(&E) -> bool,
    retrying: impl FnMut(&E, Duration),
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    let mut busy_pauses = pauses(BUSY_MAX_PAUSE);
    attempt
        .retry(growing(MAX_PAUSE))
        .sleep(tokio::time::sleep)
        .when(transient)
        .adjust(move |e, pause| {
            let pause = if busy(e) { busy_pauses.next() } else { pause };
            pause.filter(|p| tokio::time::Instant::now() + *p < deadline)
        })
        .notify(retrying)
        .await
}

/// Pauses from [`FIRST_PAUSE`], doubling up to `max`, each plus a random part of up to as
/// much again.
fn growing(max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// The pauses before each next try of a request repeated on a schedule of its own (a
/// waiting claimant's claim refresh) while it keeps failing: as [`within`]'s, but growing
/// up to `max`. A few tries a second from each of thousands of claimants turned away by a
/// busy apiserver would keep it busy turning them away.
pub fn pauses(max: Duration) -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    growing(max).build()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status { code, message: format!("status {code}"), ..kube::core::Status::default() }.boxed(),
        )
    }

    #[test]
    fn which_failures_may_pass() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let table = [
            ("a broken connection (no HTTP status)", kube::Error::Service(Box::new(reset)), true),
            ("busy", api_error(429), true),
            ("failing", api_error(500), true),
            ("unavailable", api_error(503), true),
            ("forbidden", api_error(403), false),
            ("unauthorized", api_error(401), false),
            ("not found", api_error(404), false),
            ("conflict", api_error(409), false),
            ("invalid", api_error(422), false),
        ];
        for (name, error, expected) in table {
            assert_eq!(may_pass(&error), expected, "{name}");
        }
    }

    /// Outcome of a run of `within` whose attempt fails `fails` times (transiently or
    /// not), then succeeds: the result, the tries made, the pauses told of.
    async fn run(fails: u32, transient: bool, wait: Duration) -> (Result<u32, String>, u32, Vec<Duration>) {
        run_busy(fails, transient, false, wait).await
    }

    /// As [`run`], every failure a 429 if `busy`.
    async fn run_busy(
        fails: u32,
        transient: bool,
        busy: bool,
        wait: Duration,
    ) -> (Result<u32, String>, u32, Vec<Duration>) {
        let tries = AtomicU32::new(0);
        let mut pauses = Vec::new();
        let deadline = tokio::time::Instant::now() + wait;
        let result = within(
            deadline,
            || async {
                let n = tries.fetch_add(1, Ordering::SeqCst) + 1;
                if n <= fails { Err(format!("failure {n}")) } else { Ok(n) }
            },
            |_: &String| transient,
            |_: &String| busy,
            |_, pause| pauses.push(pause),
        )
        .await;
        (result, tries.load(Ordering::SeqCst), pauses)
    }

    #[tokio::test(start_paused = true)]
    async fn tries_again_after_growing_jittered_pauses_until_it_succeeds_or_its_deadline() {
        let ms = Duration::from_millis;
        // (name, failures, transient, wait, result, pauses; None: as many as fit).
        let table = [
            ("succeeds at once", 0, true, ms(10_000), Some(Ok(1)), Some(0)),
            ("passes after three failures", 3, true, ms(10_000), Some(Ok(4)), Some(3)),
            ("pauses grow to 2 s, no further", 7, true, ms(60_000), Some(Ok(8)), Some(7)),
            ("a refusal is not tried again", 3, false, ms(10_000), Some(Err("failure 1".to_owned())), Some(0)),
            ("no try starts past the deadline", 100, true, ms(1_000), None, None),
        ];
        for (name, fails, transient, wait, expected, pauses) in table {
            let (result, tries, told) = run(fails, transient, wait).await;
            assert_eq!(tries as usize, told.len() + 1, "{name}");
            match expected {
                Some(expected) => assert_eq!(result, expected, "{name}"),
                None => assert_eq!(result, Err(format!("failure {tries}")), "{name}"),
            }
            // Pause n is its nominal length (100 ms doubling to 2 s) plus up to as much again.
            let nominal = [100u64, 200, 400, 800, 1600].into_iter().chain(std::iter::repeat(2000));
            for (n, (pause, at_least)) in told.iter().zip(nominal).enumerate() {
                assert!(*pause >= ms(at_least) && *pause <= ms(2 * at_least), "{name}: pause {n} was {pause:?}");
            }
            match pauses {
                Some(pauses) => assert_eq!(told.len(), pauses, "{name}"),
                // Each try started before the deadline: pauses of 100–200 and 200–400 ms
                // always fit in 1 s, a third of 400–800 ms may, a fourth never does.
                None => {
                    assert!(told.iter().sum::<Duration>() < wait, "{name}: {told:?}");
                    assert!((2..=3).contains(&told.len()), "{name}: {told:?}");
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_apiserver_is_asked_again_after_pauses_that_grow_to_15_s() {
        let ms = Duration::from_millis;
        let (result, tries, told) = run_busy(10, true, true, Duration::from_secs(600)).await;
        assert_eq!((result, tries), (Ok(11), 11));
        let nominal = [100u64, 200, 400, 800, 1600, 3200, 6400, 12_800, 15_000, 15_000];
        assert_eq!(told.len(), nominal.len());
        for (n, (pause, at_least)) in told.iter().zip(nominal).enumerate() {
            assert!(*pause >= ms(at_least) && *pause <= ms(2 * at_least), "pause {n} was {pause:?}");
        }
        assert!(is_busy(&api_error(429)) && !is_busy(&api_error(503)) && !is_busy(&api_error(404)));
    }

    #[tokio::test(start_paused = true)]
    async fn claimants_failing_together_do_not_try_again_together() {
        let mut firsts = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let (_, _, told) = run(1, true, Duration::from_secs(10)).await;
            firsts.insert(told[0]);
        }
        assert!(firsts.len() > 1, "twenty callers paused alike: {firsts:?}");
    }

    #[test]
    fn a_repeated_request_pauses_longer_while_it_fails_up_to_its_own_limit() {
        let ms = Duration::from_millis;
        // (limit, the nominal pauses: each may be up to as much again, and never above twice the limit).
        let table = [
            ("a 15 s refresh", ms(15_000), vec![100, 200, 400, 800, 1600, 3200, 6400, 12_800, 15_000, 15_000]),
            ("a limit below the first doubling", ms(150), vec![100, 150, 150]),
        ];
        for (name, limit, nominal) in table {
            let told: Vec<Duration> = pauses(limit).take(nominal.len()).collect();
            for (n, (pause, at_least)) in told.iter().zip(nominal).enumerate() {
                assert!(*pause >= ms(at_least) && *pause <= ms(2 * at_least), "{name}: pause {n} was {pause:?}");
            }
        }
        // Claimants turned away together do not come back together.
        let firsts: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| pauses(ms(15_000)).nth(3).unwrap()).collect();
        assert!(firsts.len() > 1, "twenty claimants paused alike: {firsts:?}");
    }
}
