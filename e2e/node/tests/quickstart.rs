//! The README's quickstart, command by command and as written, on the real node (the
//! image loaded as `kind load` would, the chart installed by [`crate::support::installed`]
//! with the README's own `helm install` line).

use crate::support::{as_user, installed, node, quickstart_commands};

#[tokio::test]
async fn the_readme_quickstart_runs_as_written() {
    let node = node();
    crate::examples::import_example_images();
    installed();
    let ns = node.namespace("quickstart").await;
    let commands = quickstart_commands();
    assert!(commands.len() >= 6, "the quickstart block was not found whole: {commands:?}");
    let mut outputs = Vec::new();
    for line in commands.iter().filter(|l| !l.starts_with("helm install")) {
        let output = as_user(line, &ns.name);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "`{line}` failed ({}):\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        outputs.push((line.clone(), stdout));
    }
    let output_of = |prefix: &str| {
        outputs
            .iter()
            .find(|(l, _)| l.contains(prefix))
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| panic!("no quickstart command contains {prefix}"))
    };
    let acquired: serde_json::Value =
        serde_json::from_str(output_of("/acquire").trim()).expect("the acquire answer is JSON");
    let token = acquired["fencingToken"].as_i64().expect("a fencing token");
    assert!(acquired["remainingMs"].as_i64().is_some_and(|ms| ms > 0), "{acquired}");
    let table = output_of("get dlock");
    assert!(table.contains("HOLDER") && table.contains(&token.to_string()), "kubectl get dlock:\n{table}");
    let released: serde_json::Value = serde_json::from_str(output_of("/release").trim()).expect("JSON");
    assert_eq!((released["released"].as_bool(), released["wasHeld"].as_bool()), (Some(true), Some(true)), "{released}");
}
