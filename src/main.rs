//! `leasehold`: one binary, several roles. Parses arguments, installs logging and signal
//! handling, and hands over to the role's `run`.

use clap::{Parser, Subcommand};
use leasehold::supervise::cancel_on_signal;
use leasehold::telemetry::{self, LogFormat};
use tokio_util::sync::CancellationToken;

/// jemalloc, not glibc's malloc: the controller's heap is mostly many small, long-lived
/// cached objects, which jemalloc keeps in per-size slabs without a header per object
/// (10,000 idle locks: 63.2 → 57.2 MiB resident). The sidecar binary keeps glibc's malloc.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once at its start-up (`_RJEM_MALLOC_CONF` in the environment
/// still overrides them). One arena instead of four per core: the controller's work is a
/// few tasks, not many threads contending for the allocator, and every extra arena holds
/// partly used slabs of its own. A background thread purges freed pages on a one-second
/// decay, so the resident set falls after a burst (a relist, thousands of locks reconciled
/// at once) without waiting for the next allocation to trigger purging. jemalloc reads
/// this symbol as a NUL-terminated `const char *`, which a reference to a byte array is.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 53] = b"narenas:1,background_thread:true,dirty_decay_ms:1000\0";

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Safe distributed locks for Kubernetes: FIFO grants, fencing tokens, a renewal sidecar"
)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Plain, env = "LEASEHOLD_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller (the arbiter) and the admission webhooks.
    Controller(leasehold::controller::Config),
    /// Run the sidecar: a local lock API renewing on behalf of its pod.
    Sidecar(leasehold::sidecar::Config),
    /// Run a command while holding a lock: `run <namespace>/<lock> [--wait 30s | --try] -- <command>`.
    Run(leasehold::run::Config),
    /// Started by `run`: starts the command and answers for its process tree.
    #[command(hide = true)]
    RunGuard(leasehold::run::guard::Config),
    /// Revoke a lock's current hold, audited: `release <namespace>/<name> --force --reason "..."`
    /// (a ForceReleaseRequest where the lock's policy needs approvals).
    Release(leasehold::cli::Release),
    /// List the force-release requests of a namespace and where each stands.
    Requests(leasehold::cli::request::List),
    /// Approve a force-release request (another person's): `approve <namespace>/<request>`.
    Approve(leasehold::cli::request::Approve),
    /// Deny a force-release request: `deny <namespace>/<request> --reason "..."`.
    Deny(leasehold::cli::request::Deny),
    /// Show a lock: holder, token, hold age, the queue with each wait, conditions, recent
    /// force-release history and open requests (`status <namespace>/<lock>`); or the locks
    /// of a namespace (`status <namespace>`) or of every namespace (`status -A`) as a table.
    Status(leasehold::cli::status::Status),
    /// Wait until a lock is free, held, or granted to a claimant, on a watch (for scripts):
    /// `wait <namespace>/<lock> --for free|held|granted-to=<identity> --timeout 30s`.
    Wait(leasehold::cli::wait::Wait),
    /// Check an installation: Kubernetes version, CRDs, a controller replica leading, webhook
    /// CA bundles (present, valid, not near expiry), the Lease guard, and that the API server
    /// reaches every webhook (dry-run probes). Exit 1 if any check fails (with `--wait 2m`,
    /// if any still fails after two minutes of rounds). The chart runs it as `helm test`,
    /// and after installs and upgrades until every check passes.
    Check(leasehold::check::Config),
    /// Print the CustomResourceDefinitions (YAML), or their reference (Markdown).
    Crd {
        /// `yaml` (the CRDs) or `markdown` (the field reference in docs/, covering both).
        #[arg(long, default_value = "yaml", value_parser = ["yaml", "markdown"])]
        format: String,
        /// Which CRD to print as YAML: `distributedlock`, `lockclaim`,
        /// `forcereleaserequest`, or `all` (every one, as one YAML stream).
        #[arg(long, default_value = "all", value_parser = ["all", "distributedlock", "lockclaim", "forcereleaserequest"])]
        kind: String,
    },
    /// Print the guard (the lock Lease and LockClaim ValidatingAdmissionPolicies and their
    /// bindings) as YAML.
    LeaseGuard {
        /// The controller's user name, exempt from the guard.
        #[arg(long, default_value = "system:serviceaccount:leasehold-system:leasehold-controller")]
        controller_user: String,
    },
}

/// Runs an operator command: its message on stdout, or its error on stderr and exit 1.
fn one_shot(name: &str, command: impl std::future::Future<Output = anyhow::Result<String>>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match runtime.block_on(command) {
        Ok(message) => {
            println!("{message}");
            Ok(())
        }
        Err(e) => {
            eprintln!("leasehold {name}: {e:#}");
            std::process::exit(1)
        }
    }
}

/// The name to show in usage for the program invoked as `argv0`: installed (or linked) as
/// `kubectl-leasehold`, kubectl runs it for `kubectl leasehold ...`, and usage says so.
fn bin_name(argv0: Option<&std::ffi::OsStr>) -> &'static str {
    let file = argv0.map(std::path::Path::new).and_then(std::path::Path::file_name).and_then(|f| f.to_str());
    if file == Some("kubectl-leasehold") { "kubectl leasehold" } else { "leasehold" }
}

fn main() -> anyhow::Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    let argv0 = std::env::args_os().next();
    let matches = Cli::command().bin_name(bin_name(argv0.as_deref())).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::LeaseGuard { controller_user } => {
            print!("{}", leasehold::webhook::guard::manifests(&controller_user));
            Ok(())
        }
        Command::Release(args) => one_shot("release", leasehold::cli::release(args)),
        Command::Requests(args) => one_shot("requests", leasehold::cli::request::list(args)),
        Command::Status(args) => one_shot("status", leasehold::cli::status::status(args)),
        Command::Wait(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            match runtime.block_on(leasehold::cli::wait::wait(args)) {
                Ok((code, message)) => {
                    if !message.is_empty() {
                        eprintln!("leasehold wait: {message}");
                    }
                    std::process::exit(code)
                }
                Err(e) => {
                    eprintln!("leasehold wait: {e:#}");
                    std::process::exit(leasehold::run::EXIT_FAILED)
                }
            }
        }
        Command::Approve(args) => one_shot("approve", leasehold::cli::request::approve(args)),
        Command::Deny(args) => one_shot("deny", leasehold::cli::request::deny(args)),
        Command::Check(config) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            match runtime.block_on(leasehold::check::run_until_passing(&config)) {
                Ok(findings) => {
                    for finding in &findings {
                        println!("{finding}");
                    }
                    let failed = findings.iter().filter(|f| f.failed()).count();
                    if failed > 0 {
                        eprintln!("leasehold check: {failed} of {} checks failed", findings.len());
                        std::process::exit(1)
                    }
                    Ok(())
                }
                Err(e) => {
                    eprintln!("leasehold check: {e:#}");
                    std::process::exit(1)
                }
            }
        }
        Command::Crd { format, kind } => {
            match (format.as_str(), kind.as_str()) {
                ("markdown", _) => print!("{}", leasehold::crd_docs::reference()),
                (_, "distributedlock") => print!("{}", leasehold::crd::crd_yaml()),
                (_, "lockclaim") => print!("{}", leasehold::crd::lock_claim_crd_yaml()),
                (_, "forcereleaserequest") => print!("{}", leasehold::crd::force_release_request_crd_yaml()),
                _ => print!(
                    "{}---\n{}---\n{}",
                    leasehold::crd::crd_yaml(),
                    leasehold::crd::lock_claim_crd_yaml(),
                    leasehold::crd::force_release_request_crd_yaml()
                ),
            }
            Ok(())
        }
        Command::Sidecar(config) => {
            telemetry::init(cli.log_format);
            // One thread: the sidecar rides in every opted-in pod.
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                cancel_on_signal(shutdown.clone());
                leasehold::sidecar::run(config, shutdown).await
            })
        }
        Command::Run(config) => {
            telemetry::init(cli.log_format);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let code = runtime.block_on(async {
                let shutdown = CancellationToken::new();
                cancel_on_signal(shutdown.clone());
                leasehold::run::run(config, shutdown).await
            })?;
            std::process::exit(code)
        }
        Command::RunGuard(config) => {
            // No logging setup: the command owns the terminal; the guard speaks only to
            // say why it stops the command.
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let code = runtime.block_on(leasehold::run::guard::run(config));
            std::process::exit(code)
        }
        Command::Controller(config) => {
            telemetry::init(cli.log_format);
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                cancel_on_signal(shutdown.clone());
                leasehold::controller::run(config, shutdown).await
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap checks the whole command tree (unique ids, valid defaults) here rather than
    /// at the first invocation of a subcommand.
    #[test]
    fn command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// The binary, the chart and its image are released as one version, under the licence
    /// Cargo declares, and the changelog has an entry for it.
    #[test]
    fn the_crate_the_chart_the_licence_and_the_changelog_agree() {
        let chart = include_str!("../charts/leasehold/Chart.yaml");
        let field = |name: &str| {
            chart
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().trim_matches('"').to_owned())
                .unwrap_or_else(|| panic!("Chart.yaml has no {name}"))
        };
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(field("version:"), version, "the chart's version is the crate's");
        assert_eq!(field("appVersion:"), version, "the chart's appVersion is the crate's");
        assert_eq!(env!("CARGO_PKG_LICENSE"), "Apache-2.0");
        let licence = include_str!("../LICENSE");
        assert!(licence.contains("Apache License") && licence.contains("Version 2.0, January 2004"), "LICENSE");
        let changelog = include_str!("../CHANGELOG.md");
        assert!(changelog.contains(&format!("## [{version}]")), "CHANGELOG.md has no entry for {version}");
    }

    #[test]
    fn usage_names_the_kubectl_plugin_when_invoked_as_one() {
        use std::ffi::OsStr;
        for (argv0, name) in [
            (Some("kubectl-leasehold"), "kubectl leasehold"),
            (Some("/usr/local/bin/kubectl-leasehold"), "kubectl leasehold"),
            (Some("/usr/local/bin/leasehold"), "leasehold"),
            (Some("leasehold"), "leasehold"),
            (Some("kubectl-leasehold-0.1.0-linux-amd64"), "leasehold"),
            (None, "leasehold"),
        ] {
            assert_eq!(bin_name(argv0.map(OsStr::new)), name, "{argv0:?}");
        }
    }

    /// Every `make` target and `leasehold` subcommand the README names exists.
    #[test]
    fn the_readme_names_only_commands_that_exist() {
        use clap::CommandFactory;
        let readme = include_str!("../README.md");
        let makefile = include_str!("../Makefile");
        let command = Cli::command();
        // Commands appear in code: inline spans, and lines of code blocks.
        let mut code: Vec<&str> = readme.split('`').skip(1).step_by(2).collect();
        let mut in_block = false;
        for line in readme.lines() {
            if line.starts_with("```") {
                in_block = !in_block;
            } else if in_block {
                code.push(line);
            }
        }
        let (mut targets, mut subcommands) = (0, 0);
        for snippet in code {
            let words: Vec<&str> = snippet.split_whitespace().collect();
            for pair in words.windows(2) {
                if pair[0] == "make" {
                    let target = pair[1];
                    assert!(
                        makefile.lines().any(|l| l.starts_with(&format!("{target}:"))),
                        "README names `make {target}`, which the Makefile lacks"
                    );
                    targets += 1;
                }
            }
            if words.first() == Some(&"leasehold") && words.len() > 1 {
                for sub in words[1].split('|') {
                    assert!(
                        command.find_subcommand(sub).is_some(),
                        "README names `leasehold {sub}`, which does not exist"
                    );
                    subcommands += 1;
                }
            }
        }
        assert!(
            targets >= 4 && subcommands >= 3,
            "the README names too few commands to check ({targets} targets, {subcommands} subcommands)"
        );
    }
}
