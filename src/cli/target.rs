//! Naming a lock on the command line: `<namespace>/<name>`, or `<name>` alone inside a Pod,
//! where the namespace is the Pod's own (`POD_NAMESPACE`, else the service account's
//! namespace file).

/// The namespace file of a Pod's service account.
pub const NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// A lock argument that names no namespace where none can be found.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    /// Not `<namespace>/<name>` nor a lock name.
    #[error("{0:?} is not <namespace>/<name> (or <name> inside a Pod)")]
    Malformed(String),
    /// `<name>` alone outside a Pod.
    #[error(
        "lock {0:?} names no namespace, and this is not a Pod: neither POD_NAMESPACE is set nor {NAMESPACE_FILE} exists; write <namespace>/{0}"
    )]
    NoNamespace(String),
}

/// Where the Pod's own namespace is found, as read from the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNamespace {
    /// `POD_NAMESPACE`.
    pub env: Option<String>,
    /// The service account's namespace file.
    pub file: Option<String>,
}

impl PodNamespace {
    /// Reads `POD_NAMESPACE` and the namespace file.
    pub fn read() -> PodNamespace {
        PodNamespace { env: std::env::var("POD_NAMESPACE").ok(), file: std::fs::read_to_string(NAMESPACE_FILE).ok() }
    }

    /// The Pod's namespace: `POD_NAMESPACE` first (set explicitly), then the file.
    pub fn get(&self) -> Option<String> {
        [&self.env, &self.file].into_iter().flatten().map(|s| s.trim()).find(|s| !s.is_empty()).map(str::to_owned)
    }
}

/// Parses a lock argument: `<namespace>/<name>`, or `<name>` in the Pod's namespace.
pub fn resolve(arg: &str, pod: &PodNamespace) -> Result<(String, String), TargetError> {
    let malformed = || TargetError::Malformed(arg.to_owned());
    match arg.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        Some(_) => Err(malformed()),
        None if arg.is_empty() => Err(malformed()),
        None => pod.get().map(|ns| (ns, arg.to_owned())).ok_or_else(|| TargetError::NoNamespace(arg.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_arguments() {
        let pod = |env: Option<&str>, file: Option<&str>| PodNamespace {
            env: env.map(str::to_owned),
            file: file.map(str::to_owned),
        };
        let ok = |ns: &str, name: &str| Ok((ns.to_owned(), name.to_owned()));
        let cases = [
            ("shop/orders", pod(None, None), ok("shop", "orders")),
            ("shop/orders", pod(Some("other"), None), ok("shop", "orders")),
            ("orders", pod(Some("shop"), Some("file-ns\n")), ok("shop", "orders")),
            ("orders", pod(None, Some("file-ns\n")), ok("file-ns", "orders")),
            ("orders", pod(Some(""), Some("file-ns")), ok("file-ns", "orders")),
            ("orders", pod(None, None), Err(TargetError::NoNamespace("orders".into()))),
            ("orders", pod(Some(" "), Some("")), Err(TargetError::NoNamespace("orders".into()))),
            ("/orders", pod(Some("shop"), None), Err(TargetError::Malformed("/orders".into()))),
            ("shop/", pod(Some("shop"), None), Err(TargetError::Malformed("shop/".into()))),
            ("a/b/c", pod(Some("shop"), None), Err(TargetError::Malformed("a/b/c".into()))),
            ("", pod(Some("shop"), None), Err(TargetError::Malformed(String::new()))),
        ];
        for (arg, pod, expected) in cases {
            assert_eq!(resolve(arg, &pod), expected, "{arg:?} {pod:?}");
        }
        let message = resolve("orders", &pod(None, None)).expect_err("no namespace").to_string();
        assert!(message.contains("POD_NAMESPACE") && message.contains(NAMESPACE_FILE), "{message}");
    }
}
