//! Strict JSON schemas for `kubeconform`, generated from the pinned release's own OpenAPI
//! document (`/openapi/v2` of a running kube-apiserver), because the published schema
//! collections cannot be downloaded here.
//!
//! One file per built-in kind, in kubeconform's standard layout
//! (`<root>/v<version>-standalone-strict/<kind>[-<group>]-<version>.json`), each
//! self-contained: the kind's definition at the root and every definition it reaches under
//! `definitions` (recursive types such as `JSONSchemaProps` need no inlining). The
//! conversion follows what the published collections do (openapi2jsonschema
//! `--kubernetes --strict`), with two differences on purpose:
//! - strict: every object schema that lists `properties` and declares no
//!   `additionalProperties` (and does not preserve unknown fields) gets
//!   `additionalProperties: false`, so a misspelt or misplaced field fails;
//! - `null` is not accepted for optional fields (a chart that renders `null` has a bug).
//!
//! `IntOrString` accepts a string or an integer and `Quantity` a string or a number, as the
//! apiserver does; `apiVersion` and `kind` must name the kind the file is for.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use serde_json::{Map, Value, json};

/// Bumped whenever the conversion changes, so that cached schemas are regenerated.
pub const FORMAT: &str = "strict-1";

const INT_OR_STRING: &str = "io.k8s.apimachinery.pkg.util.intstr.IntOrString";
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// Where the schemas of every release live: `${LEASEHOLD_CACHE:-$HOME/.cache/leasehold}/schemas/<FORMAT>`.
/// Pass it to kubeconform as
/// `-schema-location '<root>/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json'`.
pub fn root() -> anyhow::Result<PathBuf> {
    // The same rule as `binaries.rs` and the build scripts.
    let cache = match std::env::var_os("LEASEHOLD_CACHE").filter(|value| !value.is_empty()) {
        Some(cache) => PathBuf::from(cache),
        None => PathBuf::from(std::env::var_os("HOME").context("neither LEASEHOLD_CACHE nor HOME is set")?)
            .join(".cache/leasehold"),
    };
    Ok(cache.join("schemas").join(FORMAT))
}

/// The release pinned in `e2e/controlplane/go.mod` (e.g. `v1.36.3`) — or in the `go.mod`
/// of the directory that `LEASEHOLD_KUBE_RELEASE` names, as the control plane runs — read
/// without building anything (the rule of `build.sh`: the first `k8s.io/kubernetes`
/// requirement).
pub fn pinned_release() -> anyhow::Result<String> {
    let mut go_mod = Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane");
    if let Some(release) = std::env::var(crate::binaries::RELEASE_ENV).ok().filter(|r| !r.is_empty()) {
        go_mod.push(release);
    }
    let go_mod = go_mod.join("go.mod");
    let text = std::fs::read_to_string(&go_mod).with_context(|| format!("failed to read {}", go_mod.display()))?;
    text.lines()
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            if fields.next() == Some("k8s.io/kubernetes") { fields.next().map(str::to_owned) } else { None }
        })
        .with_context(|| format!("no k8s.io/kubernetes requirement in {}", go_mod.display()))
}

/// The directory of one release's strict schemas under [`root`], e.g. `v1.36.3-standalone-strict`.
pub fn release_dir(root: &Path, version: &str) -> PathBuf {
    root.join(format!("{version}-standalone-strict"))
}

/// Makes sure the schemas of `control_plane`'s release are in the cache, generating them
/// from its `/openapi/v2` if not; returns [`root`]. Several processes may race: each
/// writes a private directory and renames it into place, and the loser discards its own.
pub async fn ensure(control_plane: &crate::ControlPlane) -> anyhow::Result<PathBuf> {
    let root = root()?;
    let dir = release_dir(&root, control_plane.version());
    if dir.is_dir() {
        return Ok(root);
    }
    let client = control_plane.admin_client().await;
    let request = http::Request::get("/openapi/v2").body(Vec::new()).context("failed to build the request")?;
    let text = client.request_text(request).await.context("failed to read /openapi/v2")?;
    let document: Value = serde_json::from_str(&text).context("/openapi/v2 is not JSON")?;
    let files = convert(&document)?;
    write_atomically(&dir, &files)?;
    Ok(root)
}

fn write_atomically(dir: &Path, files: &BTreeMap<String, Value>) -> anyhow::Result<()> {
    let parent = dir.parent().context("a schema directory has a parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("failed to create {}", parent.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix(".schemas-")
        .tempdir_in(parent)
        .with_context(|| format!("failed to create a scratch directory in {}", parent.display()))?;
    for (name, schema) in files {
        let path = scratch.path().join(name);
        let bytes = serde_json::to_vec(schema).context("a schema always serializes")?;
        std::fs::write(&path, bytes).with_context(|| format!("failed to write {}", path.display()))?;
    }
    let scratch = scratch.keep();
    if std::fs::rename(&scratch, dir).is_err() {
        // Another process finished first (the target exists): keep theirs.
        let _ = std::fs::remove_dir_all(&scratch);
        if !dir.is_dir() {
            bail!("failed to move the schemas into {}", dir.display());
        }
    }
    Ok(())
}

/// Converts an OpenAPI v2 document into kubeconform schema files, by file name.
/// Only built-in kinds (`io.k8s.*` definitions with exactly one group-version-kind) get a
/// file: custom resources are the business of their own CRDs.
pub fn convert(document: &Value) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut definitions =
        document.get("definitions").and_then(Value::as_object).cloned().context("no definitions in the document")?;
    definitions.insert(INT_OR_STRING.into(), json!({"oneOf": [{"type": "string"}, {"type": "integer"}]}));
    definitions.insert(QUANTITY.into(), json!({"oneOf": [{"type": "string"}, {"type": "number"}]}));
    for schema in definitions.values_mut() {
        tighten(schema);
    }

    let mut files = BTreeMap::new();
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    for (name, definition) in &definitions {
        let Some((group, version, kind)) = single_gvk(name, definition) else { continue };
        let file = file_name(&group, &version, &kind);
        if let Some(other) = owners.insert(file.clone(), name.clone()) {
            bail!("definitions {other} and {name} would both be written to {file}");
        }
        let api_version = if group.is_empty() { version.clone() } else { format!("{group}/{version}") };
        let mut root = definition.clone();
        if let Some(properties) = root.get_mut("properties").and_then(Value::as_object_mut) {
            if let Some(field) = properties.get_mut("apiVersion").and_then(Value::as_object_mut) {
                field.insert("enum".into(), json!([api_version]));
            }
            if let Some(field) = properties.get_mut("kind").and_then(Value::as_object_mut) {
                field.insert("enum".into(), json!([kind]));
            }
        }
        let reached = reachable(&root, &definitions)?;
        let embedded: Map<String, Value> = reached.into_iter().map(|n| (n.clone(), definitions[&n].clone())).collect();
        if let Some(object) = root.as_object_mut() {
            object.insert("definitions".into(), Value::Object(embedded));
        }
        files.insert(file, root);
    }
    if files.is_empty() {
        bail!("the document defines no built-in kinds");
    }
    Ok(files)
}

/// kubeconform's file name for a kind: `<kind>-<first label of the group>-<version>`, or
/// `<kind>-<version>` for the core group (all lower case).
pub fn file_name(group: &str, version: &str, kind: &str) -> String {
    let kind = kind.to_lowercase();
    let version = version.to_lowercase();
    match group.split('.').next().filter(|g| !g.is_empty()) {
        Some(label) => format!("{kind}-{}-{version}.json", label.to_lowercase()),
        None => format!("{kind}-{version}.json"),
    }
}

fn single_gvk(name: &str, definition: &Value) -> Option<(String, String, String)> {
    if !name.starts_with("io.k8s.") {
        return None;
    }
    let gvks = definition.get("x-kubernetes-group-version-kind")?.as_array()?;
    let [gvk] = gvks.as_slice() else { return None };
    let field = |key: &str| gvk.get(key).and_then(Value::as_str).map(str::to_owned);
    Some((field("group")?, field("version")?, field("kind")?))
}

/// Makes a schema strict, recursively (see the module documentation).
fn tighten(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else { return };
    if object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        object.remove("type");
        object.remove("format");
        object.insert("oneOf".into(), json!([{"type": "string"}, {"type": "integer"}]));
    }
    let preserves = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if object.contains_key("properties") && !object.contains_key("additionalProperties") && !preserves {
        object.insert("additionalProperties".into(), Value::Bool(false));
    }
    for key in ["properties", "patternProperties", "definitions"] {
        if let Some(children) = object.get_mut(key).and_then(Value::as_object_mut) {
            children.values_mut().for_each(tighten);
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = object.get_mut(key) {
            match child {
                Value::Array(items) => items.iter_mut().for_each(tighten),
                other => tighten(other),
            }
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(items)) = object.get_mut(key) {
            items.iter_mut().for_each(tighten);
        }
    }
}

/// Names of the definitions `schema` refers to, transitively.
fn reachable(schema: &Value, definitions: &Map<String, Value>) -> anyhow::Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    let mut pending = Vec::new();
    refs(schema, &mut pending);
    while let Some(name) = pending.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let target = definitions.get(&name).with_context(|| format!("dangling reference to {name}"))?;
        refs(target, &mut pending);
    }
    Ok(seen)
}

fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            for (key, child) in object {
                match (key.as_str(), child) {
                    ("$ref", Value::String(target)) => {
                        if let Some(name) = target.strip_prefix("#/definitions/") {
                            out.push(name.to_owned());
                        }
                    }
                    _ => refs(child, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| refs(item, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Value {
        json!({"swagger": "2.0", "definitions": {
            "io.k8s.api.apps.v1.Deployment": {
                "type": "object",
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"},
                },
                "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Deployment", "version": "v1"}],
            },
            "io.k8s.api.apps.v1.DeploymentSpec": {
                "type": "object",
                "properties": {
                    "replicas": {"type": "integer"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "strategy": {"$ref": format!("#/definitions/{INT_OR_STRING}")},
                    "self": {"$ref": "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"},
                    "open": {"type": "object", "properties": {"a": {}}, "x-kubernetes-preserve-unknown-fields": true},
                    "port": {"x-kubernetes-int-or-string": true, "type": "string"},
                },
            },
            "io.k8s.api.core.v1.Service": {
                "type": "object",
                "properties": {"kind": {"type": "string"}},
                "x-kubernetes-group-version-kind": [{"group": "", "kind": "Service", "version": "v1"}],
            },
            "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions": {
                "type": "object",
                "x-kubernetes-group-version-kind": [
                    {"group": "", "kind": "DeleteOptions", "version": "v1"},
                    {"group": "apps", "kind": "DeleteOptions", "version": "v1"},
                ],
            },
            "dev.leasehold.v1alpha1.DistributedLock": {
                "type": "object",
                "x-kubernetes-group-version-kind": [{"group": "leasehold.dev", "kind": "DistributedLock", "version": "v1alpha1"}],
            },
            INT_OR_STRING: {"type": "string", "format": "int-or-string"},
            QUANTITY: {"type": "string"},
        }})
    }

    #[test]
    fn files_are_named_like_kubeconform_expects() {
        let files = convert(&document()).expect("converts");
        let names: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(names, ["deployment-apps-v1.json", "service-v1.json"], "built-in, single-GVK kinds only");
        assert_eq!(
            file_name("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration"),
            "validatingwebhookconfiguration-admissionregistration-v1.json"
        );
    }

    #[test]
    fn schemas_are_strict_and_self_contained() {
        let files = convert(&document()).expect("converts");
        let deployment = &files["deployment-apps-v1.json"];
        assert_eq!(deployment["additionalProperties"], json!(false));
        assert_eq!(deployment["properties"]["kind"]["enum"], json!(["Deployment"]));
        assert_eq!(deployment["properties"]["apiVersion"]["enum"], json!(["apps/v1"]));
        let definitions = deployment["definitions"].as_object().expect("embedded definitions");
        let embedded: Vec<&str> = definitions.keys().map(String::as_str).collect();
        assert_eq!(
            embedded,
            ["io.k8s.api.apps.v1.DeploymentSpec", INT_OR_STRING],
            "reachable ones, recursion included"
        );
        let spec = &definitions["io.k8s.api.apps.v1.DeploymentSpec"];
        assert_eq!(spec["additionalProperties"], json!(false));
        assert_eq!(spec["properties"]["labels"]["additionalProperties"], json!({"type": "string"}), "maps stay maps");
        assert!(spec["properties"]["open"].get("additionalProperties").is_none(), "preserved fields stay open");
        assert_eq!(spec["properties"]["port"]["oneOf"], json!([{"type": "string"}, {"type": "integer"}]));
        assert_eq!(definitions[INT_OR_STRING]["oneOf"][1], json!({"type": "integer"}));
        assert_eq!(files["service-v1.json"]["properties"]["kind"]["enum"], json!(["Service"]));
    }

    #[test]
    fn dangling_references_are_errors() {
        let mut doc = document();
        doc["definitions"]["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["x"] =
            json!({"$ref": "#/definitions/nope"});
        let error = convert(&doc).expect_err("dangling");
        assert!(format!("{error:#}").contains("nope"));
    }
}
