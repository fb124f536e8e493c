//! What a Dockerfile's final stage puts into its image: `USER`, `ENTRYPOINT`, `CMD`,
//! `LABEL`s and `COPY`s — read so that a test can hold the Dockerfile and the image
//! builder to the same contents. Only the forms the project's Dockerfile uses are
//! understood (exec-form JSON arrays, `key="value"` labels, line continuations); anything
//! else in the final stage is an error, so the check cannot pass by ignoring a line.

use std::collections::BTreeMap;

/// The final stage, as far as the image's contents go.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FinalStage {
    /// `FROM` of the final stage.
    pub base: String,
    /// `USER`.
    pub user: Option<String>,
    /// `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
    /// `CMD` (exec form).
    pub cmd: Vec<String>,
    /// `LABEL`s.
    pub labels: BTreeMap<String, String>,
    /// `COPY [--from=stage] source destination`: (stage, source, destination).
    pub copies: Vec<(Option<String>, String, String)>,
}

/// Joins continuation lines and drops comments and blank lines.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(part) = trimmed.strip_suffix('\\') {
            current.push_str(part.trim());
            current.push(' ');
        } else {
            current.push_str(trimmed);
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn exec_form(keyword: &str, args: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(args).map_err(|e| format!("{keyword} must be a JSON array (exec form): {args:?}: {e}"))
}

/// `key="value" key2="value2"`.
fn labels(args: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut rest = args.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").ok_or_else(|| format!("LABEL needs key=\"value\": {rest:?}"))?;
        let end = after.find('"').ok_or_else(|| format!("LABEL value not closed: {after:?}"))?;
        out.insert(key.trim().to_owned(), after[..end].to_owned());
        rest = after[end + 1..].trim_start();
    }
    Ok(out)
}

/// Reads the final stage of `text`.
pub fn final_stage(text: &str) -> Result<FinalStage, String> {
    let all = instructions(text);
    let start = all
        .iter()
        .rposition(|i| i.split_whitespace().next().is_some_and(|k| k.eq_ignore_ascii_case("FROM")))
        .ok_or("no FROM instruction")?;
    let mut stage = FinalStage::default();
    for instruction in &all[start..] {
        let (keyword, args) = instruction.split_once(char::is_whitespace).unwrap_or((instruction, ""));
        let args = args.trim();
        match keyword.to_ascii_uppercase().as_str() {
            "FROM" => stage.base = args.to_owned(),
            "USER" => stage.user = Some(args.to_owned()),
            "ENTRYPOINT" => stage.entrypoint = exec_form(keyword, args)?,
            "CMD" => stage.cmd = exec_form(keyword, args)?,
            "LABEL" => stage.labels.extend(labels(args)?),
            "COPY" => {
                let mut words: Vec<&str> = args.split_whitespace().collect();
                let from = match words.first().and_then(|w| w.strip_prefix("--from=")) {
                    Some(from) => {
                        let from = from.to_owned();
                        words.remove(0);
                        Some(from)
                    }
                    None => None,
                };
                match words.as_slice() {
                    [source, destination] => stage.copies.push((from, (*source).into(), (*destination).into())),
                    _ => return Err(format!("COPY needs one source and one destination: {instruction:?}")),
                }
            }
            other => return Err(format!("the final stage has {other}, which the image builder does not mirror")),
        }
    }
    Ok(stage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_final_stage_only() {
        let text = "FROM rust AS build\nRUN cargo build \\\n  --release\nUSER 0\n\n# the image\nFROM scratch\n\
                    COPY image/rootfs/ /\nCOPY --from=build /leasehold /leasehold\nUSER 65532:65532\n\
                    ENTRYPOINT [\"/leasehold\"]\nCMD [\"--help\"]\nLABEL a=\"x y\" \\\n      b=\"2\"\n";
        let stage = final_stage(text).expect("parsed");
        assert_eq!(stage.base, "scratch");
        assert_eq!(stage.user.as_deref(), Some("65532:65532"));
        assert_eq!(stage.entrypoint, ["/leasehold"]);
        assert_eq!(stage.cmd, ["--help"]);
        assert_eq!(stage.labels, BTreeMap::from([("a".into(), "x y".into()), ("b".into(), "2".into())]));
        assert_eq!(
            stage.copies,
            [
                (None, "image/rootfs/".into(), "/".into()),
                (Some("build".into()), "/leasehold".into(), "/leasehold".into())
            ]
        );
    }

    #[test]
    fn anything_it_cannot_mirror_is_an_error() {
        assert!(final_stage("FROM scratch\nRUN true\n").unwrap_err().contains("RUN"));
        assert!(final_stage("FROM scratch\nENTRYPOINT /leasehold\n").unwrap_err().contains("exec form"));
        assert!(final_stage("RUN x\n").unwrap_err().contains("FROM"));
    }
}
