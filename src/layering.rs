//! The crate's layering, checked: shared foundations import no component, components
//! import each other only where the table below allows, and front ends import anything.
//! The test reads every source file under `src/` and names the file and line of each
//! import that points the wrong way. `docs/design.md` ("Layering") says the same in prose.

use std::path::{Path, PathBuf};

/// The parts of the crate, from the bottom up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// Shared foundations: CRD types, Lease primitives, names, clients, observability.
    Foundation,
    /// The claimant library the sidecar and `leasehold run` use.
    Claim,
    /// The arbiter.
    Controller,
    /// The per-pod agent and its local HTTP API.
    Sidecar,
    /// Admission: fence, inject, guard, force.
    Webhook,
    /// Commands and whole-crate checks that put the parts together.
    FrontEnd,
}

use Part::{Claim, Controller, Foundation, FrontEnd, Sidecar, Webhook};

/// Every top-level module and the part it belongs to. A new module must be placed here.
const MODULES: &[(&str, Part)] = &[
    ("admin", Foundation), // the /livez /readyz /metrics server the controller and the sidecar host
    ("boottime", Foundation),
    ("crd", Foundation),
    ("crd_docs", Foundation),
    ("crd_force", Foundation),
    ("duration", Foundation),
    ("kube_client", Foundation),
    ("lease", Foundation),
    ("metrics", Foundation),
    ("names", Foundation),
    ("supervise", Foundation),
    ("telemetry", Foundation),
    ("claim", Claim),
    ("controller", Controller),
    ("sidecar", Sidecar),
    ("webhook", Webhook),
    ("check", FrontEnd),
    ("cli", FrontEnd),
    ("run", FrontEnd),
    ("main", FrontEnd),
    ("bin", FrontEnd), // src/bin/leasehold-sidecar.rs: the sidecar alone
    ("layering", FrontEnd),
    ("metrics_doc", FrontEnd), // checks docs/metrics.md against every component's registry
];

/// The rules: what each part may not import, and why.
const RULES: &[(Part, &[Part], &str)] = &[
    (
        Foundation,
        &[Claim, Controller, Sidecar, Webhook, FrontEnd],
        "foundations are shared by every component and import none",
    ),
    (
        Claim,
        &[Controller, Sidecar, Webhook, FrontEnd],
        "the claimant library stands alone: the sidecar, `leasehold run` and other programs build on it",
    ),
    (
        Sidecar,
        &[Controller, Webhook, FrontEnd],
        "the sidecar runs in app pods and speaks to the controller only through Kubernetes objects",
    ),
    (Webhook, &[Controller, Sidecar, FrontEnd], "admission decides from the request and shared foundations alone"),
    (
        Controller,
        &[Sidecar, FrontEnd],
        "the controller may import webhook (it hosts the webhook server) and claim (the lock Lease's \
         claimant-side shape, `claim::edit`), never the sidecar",
    ),
    (FrontEnd, &[], "front ends put the parts together and may import anything"),
];

/// The part a top-level module belongs to.
fn part_of(module: &str) -> Option<Part> {
    MODULES.iter().find(|(name, _)| *name == module).map(|(_, part)| *part)
}

/// Why `from` may not import `to`, or `None` if it may.
fn forbidden(from: Part, to: Part) -> Option<&'static str> {
    RULES
        .iter()
        .find(|(part, _, _)| *part == from)
        .filter(|(_, denied, _)| denied.contains(&to))
        .map(|(_, _, why)| *why)
}

/// The top-level module a source file belongs to: `src/sidecar/api.rs` → `sidecar`.
fn module_of(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    Some(first.strip_suffix(".rs").unwrap_or(first).to_owned())
}

/// The top-level modules `text` names through paths from the crate root, with the line
/// (1-based) each is named on, in a file `depth` modules below the root (`src/x.rs` and
/// `src/x/mod.rs`: 1, `src/x/y.rs`: 2). Reads `crate::x::...`, `crate::{x::..., y}` (over
/// several lines too) and `super::` chains that reach the root; skips `//` comments and
/// `$crate`. A `mod` block inside a file is not counted in its depth, so a `super::` chain
/// in one is read as reaching higher than it does: stricter, never looser. Text, not a
/// syntax tree, so that paths inside macro calls (`tokio::select!`) and attributes
/// (`#[arg(value_parser = ...)]`) count too.
fn imports(text: &str, depth: usize) -> Vec<(usize, String)> {
    // Comments blanked, so that offsets keep their lines.
    let code: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => format!("{}{}\n", &line[..at], " ".repeat(line.len() - at)),
            None => format!("{line}\n"),
        })
        .collect();
    let starts_a_path = |at: usize| {
        !code[..at].chars().next_back().is_some_and(|c| matches!(c, '$' | '_' | ':') || c.is_alphanumeric())
    };
    // Offsets just past a prefix that names the crate root.
    let mut roots: Vec<usize> = code
        .match_indices("crate::")
        .filter(|(at, _)| starts_a_path(*at))
        .map(|(at, prefix)| at + prefix.len())
        .collect();
    for (at, prefix) in code.match_indices("super::") {
        if !starts_a_path(at) {
            continue;
        }
        let mut end = at;
        let mut up = 0;
        while code[end..].starts_with(prefix) {
            end += prefix.len();
            up += 1;
        }
        if up >= depth {
            roots.push(end);
        }
    }
    roots.sort_unstable();
    let line_at = |offset: usize| code[..offset].matches('\n').count() + 1;
    let mut found = Vec::new();
    for start in roots {
        match code[start..].strip_prefix('{') {
            Some(group) => {
                for (offset, name) in group_items(group) {
                    found.push((line_at(start + 1 + offset), name));
                }
            }
            None => {
                let name = identifier(&code[start..]);
                if !name.is_empty() {
                    found.push((line_at(start), name));
                }
            }
        }
    }
    found
}

/// How many modules below the crate root a file under `src/` is: `x.rs` and `x/mod.rs` 1,
/// `x/y.rs` 2.
fn depth_of(relative: &Path) -> usize {
    let components = relative.components().count();
    if relative.file_name().is_some_and(|n| n == "mod.rs") { components - 1 } else { components }
}

/// The first identifier of each top-level item of a `{...}` group (`text` starts just after
/// its `{`), with the item's offset in `text`; `self` is skipped.
fn group_items(text: &str) -> Vec<(usize, String)> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut at_item_start = true;
    for (at, c) in text.char_indices() {
        if at_item_start {
            if c.is_whitespace() {
                continue;
            }
            let name = identifier(&text[at..]);
            if !name.is_empty() && name != "self" {
                items.push((at, name));
            }
            at_item_start = false;
        }
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_item_start = true,
            _ => {}
        }
    }
    items
}

/// The identifier `text` starts with (empty if none).
fn identifier(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("failed to list {}: {e}", dir.display())).path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The upward imports in the source files under `src`, one line each: file, line, what
/// imports what, and the rule broken.
fn violations(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for path in sources(src) {
        let relative = path.strip_prefix(src).expect("listed under src");
        if relative == Path::new("lib.rs") {
            continue; // the crate root declares every module
        }
        let shown = Path::new("src").join(relative);
        let Some(module) = module_of(relative) else { continue };
        let Some(from) = part_of(&module) else {
            found.push(format!("{}: module {module} is not placed in the layering table", shown.display()));
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()));
        for (line, imported) in imports(&text, depth_of(relative)) {
            if imported == module {
                continue;
            }
            let Some(to) = part_of(&imported) else { continue };
            if let Some(why) = forbidden(from, to) {
                found.push(format!(
                    "{}:{line}: {module} ({from:?}) imports {imported} ({to:?}), which it may not: {why}",
                    shown.display()
                ));
            }
        }
    }
    found
}

#[test]
fn no_module_imports_upward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "imports that point the wrong way:\n{}", found.join("\n"));
}

#[test]
fn every_part_has_one_rule_and_no_part_forbids_itself() {
    for part in [Foundation, Claim, Controller, Sidecar, Webhook, FrontEnd] {
        let rules: Vec<_> = RULES.iter().filter(|(p, _, _)| *p == part).collect();
        assert_eq!(rules.len(), 1, "{part:?} has {} rules", rules.len());
        assert!(!rules[0].1.contains(&part), "{part:?} forbids itself");
    }
}

#[test]
fn the_rules_say_who_may_import_whom() {
    // (importer, imported, allowed)
    let cases = [
        (Foundation, Foundation, true),
        (Foundation, Controller, false),
        (Foundation, Sidecar, false),
        (Foundation, FrontEnd, false),
        (Claim, Foundation, true),
        (Claim, Controller, false),
        (Claim, Sidecar, false),
        (Claim, Webhook, false),
        (Sidecar, Claim, true),
        (Sidecar, Controller, false),
        (Sidecar, Webhook, false),
        (Webhook, Foundation, true),
        (Webhook, Sidecar, false),
        (Webhook, Controller, false),
        (Controller, Webhook, true),
        (Controller, Claim, true),
        (Controller, Sidecar, false),
        (Controller, FrontEnd, false),
        (FrontEnd, Controller, true),
        (FrontEnd, Sidecar, true),
    ];
    for (from, to, allowed) in cases {
        assert_eq!(forbidden(from, to).is_none(), allowed, "{from:?} → {to:?}");
    }
}

#[test]
fn imports_are_read_from_paths_groups_and_not_comments() {
    let text = "\
use crate::lease::Identity;
use crate::{crd::LockClaim, metrics::{ClientMetrics, WebhookMetrics}};
use crate::{
    names::validate_lock_name,
    sidecar,
};
    let x = crate::controller::parse(crate::names::X);
// see crate::webhook for why
$crate::telemetry::init();
use super::request::{self, MIN_TTL};
let y = not_crate::cli::run();
use super::super::webhook::lock;
let z = x::super::run::go();
";
    let expected = [
        (1, "lease"),
        (2, "crd"),
        (2, "metrics"),
        (4, "names"),
        (5, "sidecar"),
        (7, "controller"),
        (7, "names"),
        (12, "webhook"),
    ];
    // As read in a file two modules down (`src/x/y.rs`).
    let found = imports(text, 2);
    let found: Vec<(usize, &str)> = found.iter().map(|(line, name)| (*line, name.as_str())).collect();
    assert_eq!(found, expected);
}

#[test]
fn super_reaches_the_root_only_from_deep_enough() {
    let text = "use super::super::controller::X;\nuse super::sidecar::Y;\n";
    // (depth of the file, modules read)
    let cases: [(usize, &[&str]); 3] = [(1, &["controller", "sidecar"]), (2, &["controller"]), (3, &[])];
    for (depth, expected) in cases {
        let found = imports(text, depth);
        let found: Vec<&str> = found.iter().map(|(_, name)| name.as_str()).collect();
        assert_eq!(found, expected, "depth {depth}");
    }
}

#[test]
fn depth_counts_modules_not_files() {
    for (path, depth) in
        [("metrics.rs", 1), ("sidecar/mod.rs", 1), ("sidecar/api.rs", 2), ("webhook/guard/claim.rs", 3)]
    {
        assert_eq!(depth_of(Path::new(path)), depth, "{path}");
    }
}

#[test]
fn files_belong_to_their_top_level_module() {
    for (path, module) in
        [("sidecar/api.rs", "sidecar"), ("metrics.rs", "metrics"), ("webhook/guard/claim.rs", "webhook")]
    {
        assert_eq!(module_of(Path::new(path)).as_deref(), Some(module), "{path}");
    }
}
