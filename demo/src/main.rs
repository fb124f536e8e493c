//! `leasehold-demo`: see the library docs. `make demo` runs it.

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

fn usage() -> ! {
    eprintln!("usage: leasehold-demo --leasehold PATH --helm PATH [--chart DIR] [--scripted]");
    eprintln!("       leasehold-demo --cluster --image ARCHIVE --helm PATH [--scripted]   (on a real node)");
    std::process::exit(64)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut leasehold, mut helm, mut chart, mut scripted) = (None, None, None, false);
    let (mut cluster, mut image) = (false, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--leasehold" => leasehold = args.next().map(PathBuf::from),
            "--helm" => helm = args.next().map(PathBuf::from),
            "--chart" => chart = args.next().map(PathBuf::from),
            "--scripted" => scripted = true,
            "--cluster" => cluster = true,
            "--image" => image = args.next().map(PathBuf::from),
            _ => usage(),
        }
    }
    if cluster {
        let (Some(image), Some(helm)) = (image, helm) else { usage() };
        return on_the_node(image, helm, scripted);
    }
    let (Some(leasehold), Some(helm)) = (leasehold, helm) else { usage() };
    let live = !scripted && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let options = leasehold_demo::Options {
        leasehold,
        helm,
        chart: chart.unwrap_or_else(|| leasehold_demo::setup::repo_root().join("charts/leasehold")),
        scripted,
        live,
        handoffs_before_freeze: 3,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let stop = CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            on_signal.cancel();
        });
        if live {
            // The live view owns rows 1-3; the event log scrolls below it.
            print!("\x1b[2J\x1b[5;r\x1b[5;1H");
        }
        let mut out = std::io::stdout();
        let outcome = leasehold_demo::run(options, &mut out, stop).await;
        if live {
            print!("\x1b[r");
        }
        let outcome = outcome?;
        if scripted && (outcome.stale_rejected.is_none() || outcome.expired_to.is_none()) {
            anyhow::bail!("the scripted demo did not show everything: {outcome:?}");
        }
        anyhow::Ok(())
    })
}

/// `make demo-cluster`: the demo with real pods on a real node.
fn on_the_node(image: PathBuf, helm: PathBuf, scripted: bool) -> anyhow::Result<()> {
    let options =
        leasehold_demo::cluster::ClusterOptions { image, helm, repo: leasehold_demo::setup::repo_root(), scripted };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let stop = CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            on_signal.cancel();
        });
        let mut out = std::io::stdout();
        let outcome = leasehold_demo::cluster::run(options, &mut out, stop).await?;
        if scripted && outcome.stale_rejected.is_none() {
            anyhow::bail!("the scripted demo did not show a rejected stale write: {outcome:?}");
        }
        anyhow::Ok(())
    })
}
