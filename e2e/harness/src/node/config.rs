//! The node's files: directories, configuration files rendered from `e2e/node/conf`, the
//! PKI, the token file and the kubeconfigs of every component.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::{APISERVER_PORT, CGROUP_ROOT, CLUSTER_CIDR, NODE_IP, NODE_NAME, NODE_POD_CIDR, POD_GATEWAY};
use crate::kubeconfig::Identity;
use crate::pki::Pki;

const CONTAINERD: &str = include_str!("../../../node/conf/containerd.toml");
const KUBELET: &str = include_str!("../../../node/conf/kubelet.yaml");
const KUBE_PROXY: &str = include_str!("../../../node/conf/kube-proxy.yaml");
const CNI: &str = include_str!("../../../node/conf/10-leasehold.conflist");

/// The users of the static token file: (component, user, groups).
const USERS: [(&str, &str, &str); 4] = [
    ("admin", "leasehold-admin", "system:masters"),
    ("kubelet", "system:node:leasehold-node", "system:nodes"),
    ("kube-proxy", "system:kube-proxy", ""),
    ("kube-scheduler", "system:kube-scheduler", ""),
];

/// Where everything of one node is. `dir` is kept across runs (logs, the kubeconfig);
/// `run` is emptied at every start.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The node's directory.
    pub dir: PathBuf,
}

impl Layout {
    /// State that lives only as long as one run.
    pub fn run(&self) -> PathBuf {
        self.dir.join("run")
    }
    /// Component logs of the current (or last) run.
    pub fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }
    /// Certificates, keys, tokens and the components' kubeconfigs.
    pub fn pki(&self) -> PathBuf {
        self.run().join("pki")
    }
    /// Process ids of the supervisor's children, one file each.
    pub fn pids(&self) -> PathBuf {
        self.run().join("pids")
    }
    /// The admin kubeconfig for the host (through the relay).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }
    /// The admin kubeconfig inside the node's network namespace.
    pub fn inner_kubeconfig(&self) -> PathBuf {
        self.pki().join("admin.kubeconfig")
    }
    /// [`super::NodeState`] of the running node, written once it is ready.
    pub fn state(&self) -> PathBuf {
        self.dir.join("node.json")
    }
    /// The supervisor's pid.
    pub fn supervisor_pid(&self) -> PathBuf {
        self.dir.join("supervisor.pid")
    }
    /// Host directories created as mount points (removed at teardown).
    pub fn created_mount_points(&self) -> PathBuf {
        self.dir.join("created-mount-points")
    }
    /// containerd's socket (a path on the host's file system: reachable from outside).
    pub fn containerd_socket(&self) -> PathBuf {
        self.run().join("containerd/containerd.sock")
    }
    /// Image archives imported at start.
    pub fn images(&self) -> PathBuf {
        self.run().join("images")
    }
}

/// Replaces the `@NAME@` placeholders of a template.
fn render(template: &str, layout: &Layout) -> String {
    let pki = layout.pki();
    let run = layout.run();
    [
        ("@RUN@", run.display().to_string()),
        ("@PKI@", pki.display().to_string()),
        ("@NODE_IP@", NODE_IP.to_owned()),
        ("@NODE_NAME@", NODE_NAME.to_owned()),
        ("@POD_CIDR@", CLUSTER_CIDR.to_owned()),
        ("@NODE_POD_CIDR@", NODE_POD_CIDR.to_owned()),
        ("@POD_GATEWAY@", POD_GATEWAY.to_owned()),
        ("@CGROUP_ROOT@", CGROUP_ROOT.to_owned()),
    ]
    .iter()
    .fold(template.to_owned(), |text, (key, value)| text.replace(key, value))
}

fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("failed to create {}", parent.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("failed to write {}", path.display()))
}

/// The tokens of the components, by component name.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// (component, token).
    pub by_component: Vec<(String, String)>,
}

impl Tokens {
    /// The token of `component`.
    pub fn of(&self, component: &str) -> &str {
        self.by_component.iter().find(|(c, _)| c == component).map(|(_, t)| t.as_str()).unwrap_or_default()
    }
}

/// Writes every file the node's components read. Returns the tokens.
pub fn write_all(layout: &Layout, pki: &Pki) -> anyhow::Result<Tokens> {
    let run = layout.run();
    let pki_dir = layout.pki();
    write(&run.join("containerd.toml"), &render(CONTAINERD, layout))?;
    write(&run.join("kubelet.yaml"), &render(KUBELET, layout))?;
    write(&run.join("kube-proxy.yaml"), &render(KUBE_PROXY, layout))?;
    write(&run.join("cni/net.d/10-leasehold.conflist"), &render(CNI, layout))?;
    // No cluster DNS: a resolver on the pods' own loopback, where nothing answers.
    write(&run.join("resolv.conf"), "nameserver 127.0.0.1\noptions ndots:1\n")?;

    write(&pki_dir.join("ca.crt"), pki.ca_pem())?;
    write(&pki_dir.join("sa.key"), pki.sa_private_pem())?;
    write(&pki_dir.join("sa.pub"), pki.sa_public_pem())?;
    let apiserver = pki.serving_cert(&[
        "127.0.0.1",
        "localhost",
        NODE_IP,
        super::APISERVER_SERVICE_IP,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ])?;
    write(&pki_dir.join("apiserver.crt"), &apiserver.cert_pem)?;
    write(&pki_dir.join("apiserver.key"), &apiserver.key_pem)?;
    let kubelet = pki.serving_cert(&[NODE_IP, NODE_NAME])?;
    write(&pki_dir.join("kubelet.crt"), &kubelet.cert_pem)?;
    write(&pki_dir.join("kubelet.key"), &kubelet.key_pem)?;
    // The apiserver's identity towards kubelet (logs, exec, port-forward).
    let client = pki.client_cert("kube-apiserver-kubelet-client", &["system:masters"])?;
    write(&pki_dir.join("apiserver-kubelet-client.crt"), &client.cert_pem)?;
    write(&pki_dir.join("apiserver-kubelet-client.key"), &client.key_pem)?;

    let mut tokens = Vec::new();
    let mut csv = String::new();
    for (component, user, groups) in USERS {
        let token = crate::startup::random_token()?;
        csv.push_str(&format!("{token},{user},{user},\"{groups}\"\n"));
        let server = format!("https://{NODE_IP}:{APISERVER_PORT}");
        Identity { server: &server, ca_pem: pki.ca_pem(), user, token: &token, namespace: "default" }
            .write(&pki_dir.join(format!("{component}.kubeconfig")))?;
        tokens.push((component.to_owned(), token));
    }
    write(&pki_dir.join("tokens.csv"), &csv)?;
    Ok(Tokens { by_component: tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_rendered() {
        let layout = Layout { dir: PathBuf::from("/n") };
        for template in [CONTAINERD, KUBELET, KUBE_PROXY, CNI] {
            let rendered = render(template, &layout);
            assert!(!rendered.contains('@'), "a placeholder is left:\n{rendered}");
        }
        assert!(render(KUBELET, &layout).contains("cgroupRoot: /leasehold-node"));
        assert!(render(CONTAINERD, &layout).contains("\"/n/run/containerd/containerd.sock\""));
    }
}
