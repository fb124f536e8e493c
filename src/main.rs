//! `leasehold`: one binary, several roles. Parses arguments, installs logging and signal
//! handling, and hands over to the role's `run`.

use clap::{Parser, Subcommand};
use leasehold::telemetry::{self, LogFormat};
use tokio_util::sync::CancellationToken;

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
    /// Run a command while holding a lock.
    Run(leasehold::run::Config),
    /// Revoke a lock's current hold, audited: `release <namespace>/<name> --force --reason "..."`.
    Release(leasehold::cli::Release),
    /// Print the DistributedLock CustomResourceDefinition (YAML), or its reference (Markdown).
    Crd {
        /// `yaml` (the CRD) or `markdown` (the field reference in docs/).
        #[arg(long, default_value = "yaml", value_parser = ["yaml", "markdown"])]
        format: String,
    },
    /// Print the Lease guard ValidatingAdmissionPolicy and binding as YAML.
    LeaseGuard {
        /// The controller's user name, exempt from the guard.
        #[arg(long, default_value = "system:serviceaccount:leasehold-system:leasehold-controller")]
        controller_user: String,
    },
}

/// Cancels `token` on SIGTERM or SIGINT.
fn on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("signal received, shutting down");
        token.cancel();
    });
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::LeaseGuard { controller_user } => {
            print!("{}", leasehold::webhook::guard::manifests(&controller_user));
            Ok(())
        }
        Command::Release(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            match runtime.block_on(leasehold::cli::release(args)) {
                Ok(message) => {
                    println!("{message}");
                    Ok(())
                }
                Err(e) => {
                    eprintln!("leasehold release: {e:#}");
                    std::process::exit(1)
                }
            }
        }
        Command::Crd { format } => {
            match format.as_str() {
                "markdown" => print!("{}", leasehold::crd_docs::reference()),
                _ => print!("{}", leasehold::crd::crd_yaml()),
            }
            Ok(())
        }
        Command::Sidecar(config) => {
            telemetry::init(cli.log_format);
            // One thread: the sidecar rides in every opted-in pod.
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                on_signal(shutdown.clone());
                leasehold::sidecar::run(config, shutdown).await
            })
        }
        Command::Run(config) => {
            telemetry::init(cli.log_format);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let code = runtime.block_on(async {
                let shutdown = CancellationToken::new();
                on_signal(shutdown.clone());
                leasehold::run::run(config, shutdown).await
            })?;
            std::process::exit(code)
        }
        Command::Controller(config) => {
            telemetry::init(cli.log_format);
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                on_signal(shutdown.clone());
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
