//! Logging: `tracing` to stderr, plain or JSON, filtered by `RUST_LOG` (default `info`).
//! The injected sidecar gets both from its controller (and per pod from annotations) as
//! the environment variables `RUST_LOG` and `LEASEHOLD_LOG_FORMAT`.

use tracing_subscriber::{EnvFilter, fmt};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The name `--log-format` and `LEASEHOLD_LOG_FORMAT` take.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        }
    }
}

/// The levels a filter directive may name on its own.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a log filter: a level (`error`, `warn`, `info`, `debug`, `trace`, `off`) or
/// comma-separated directives such as `info,leasehold=debug`, as `RUST_LOG` takes them.
pub fn check_filter(filter: &str) -> Result<(), String> {
    let accepted = "a level (error, warn, info, debug, trace, off) or directives such as info,leasehold=debug";
    if filter.trim().is_empty() {
        return Err(format!("{filter:?} is not a log filter: expected {accepted}"));
    }
    EnvFilter::builder()
        .parse(filter)
        .map_err(|e| format!("{filter:?} is not a log filter ({e}): expected {accepted}"))?;
    // The parser takes a lone word for a target to log at every level, so a misspelt level
    // ("debgu") would quietly log everything from nowhere: a lone word must be a level.
    if let Some(word) = filter
        .split(',')
        .map(str::trim)
        .find(|d| !d.is_empty() && !d.contains(['=', '[', ':']) && !LEVELS.contains(&d.to_ascii_lowercase().as_str()))
    {
        return Err(format!("{filter:?} is not a log filter ({word:?} is not a level): expected {accepted}"));
    }
    Ok(())
}

/// Installs the global subscriber. Call once, at start.
pub fn init(format: LogFormat) {
    // Whatever the parser takes is used as given (a lone target included); what it refuses
    // is said once logging is up, rather than silently replaced.
    let configured = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let parsed = configured.as_deref().map(|f| EnvFilter::builder().parse(f));
    let invalid = match &parsed {
        Some(Err(e)) => configured.as_deref().map(|f| format!("{f:?}: {e}")),
        _ => None,
    };
    let filter = match parsed {
        Some(Ok(filter)) => filter,
        _ => EnvFilter::new("info"),
    };
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    if let Some(problem) = invalid {
        tracing::warn!(%problem, "RUST_LOG is not a log filter; logging at info");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_levels_or_directives() {
        for good in [
            "error",
            "warn",
            "info",
            "debug",
            "trace",
            "off",
            "INFO",
            "info,leasehold=debug",
            "leasehold::sidecar=trace",
            "warn,kube[request]=debug",
        ] {
            assert_eq!(check_filter(good), Ok(()), "{good}");
        }
        for bad in ["", " ", "verbose", "debgu", "info,leasehold=loud", "info,chatty"] {
            let error = check_filter(bad).expect_err(bad);
            assert!(error.contains(&format!("{bad:?}")) && error.contains("info,leasehold=debug"), "{error}");
        }
    }

    #[test]
    fn formats_name_themselves_as_the_flag_takes_them() {
        for format in [LogFormat::Plain, LogFormat::Json] {
            assert_eq!(<LogFormat as clap::ValueEnum>::from_str(format.as_str(), false), Ok(format));
        }
    }
}
