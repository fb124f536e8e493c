//! `leasehold-sidecar`: the sidecar alone, the binary the injection webhook runs in app
//! pods. It takes the same arguments as `leasehold sidecar` (`leasehold-sidecar sidecar
//! --listen ...`), and is built from the same library; it leaves out the controller, the
//! webhooks and the operator commands, so that the pages it maps, most of its resident
//! memory, are the sidecar's own (docs/design.md, "The sidecar's memory").

use clap::{Parser, Subcommand};
use leasehold::supervise::cancel_on_signal;
use leasehold::telemetry::{self, LogFormat};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "leasehold-sidecar",
    version,
    about = "The Leasehold sidecar: a local lock API renewing on behalf of its pod"
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
    /// Run the sidecar: a local lock API renewing on behalf of its pod.
    Sidecar(leasehold::sidecar::Config),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let Command::Sidecar(config) = cli.command;
    telemetry::init(cli.log_format);
    // One thread: the sidecar rides in every opted-in pod.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let shutdown = CancellationToken::new();
        cancel_on_signal(shutdown.clone());
        leasehold::sidecar::run(config, shutdown).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap checks the whole command tree (unique ids, valid defaults) here rather than
    /// at the first invocation.
    #[test]
    fn command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
