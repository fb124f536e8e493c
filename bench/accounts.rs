//! The credentials of the throughput run's claimants and of the ceiling's clients: each
//! client authenticates as a ServiceAccount of its own, with a token from the TokenRequest
//! API, as an app's pods claim with their ServiceAccount's token.
//!
//! Not the admin's: its group (`system:masters`) puts every request in the apiserver's
//! `exempt` priority level, outside the seats and queues that API Priority and Fairness
//! keeps for every other client. With 1,000 locks × 10 claimants the apiserver then takes
//! all of their requests at once, answers none within its timeout, and a run would
//! measure that collapse, which no cluster's claimants can cause, instead of Leasehold.

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use crate::support::Env;

/// How long a client's token lasts: longer than any run.
const TOKEN_SECONDS: i64 = 3 * 3600;

/// One client's credentials.
pub struct Account {
    /// A client configuration authenticating as the ServiceAccount.
    pub config: kube::Config,
    /// The user the apiserver sees: `system:serviceaccount:<namespace>:<name>`.
    pub username: String,
}

/// Credentials for `n` clients: ServiceAccounts `client<n>-<i>` of the bench's namespace
/// (created if missing, so that a ceiling and a throughput run with as many clients share
/// them), each with a fresh token.
pub async fn for_clients(env: &Env, n: usize) -> anyhow::Result<Vec<Account>> {
    let kubeconfig = kube::config::Kubeconfig::read_from(env.cp.kubeconfig_path())?;
    let admin = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(env.ns.client.clone(), env.name());
    let namespace = env.name().to_owned();
    let one = |i: usize| {
        let (accounts, admin, namespace) = (accounts.clone(), admin.clone(), namespace.clone());
        let name = format!("client{n}-{i}");
        async move {
            let account = ServiceAccount {
                metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
                ..Default::default()
            };
            match accounts.create(&PostParams::default(), &account).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("failed to create ServiceAccount {name}")),
            }
            let request = TokenRequest {
                spec: Some(TokenRequestSpec { expiration_seconds: Some(TOKEN_SECONDS), ..TokenRequestSpec::default() }),
                ..TokenRequest::default()
            };
            let issued = accounts
                .create_token_request(&name, &PostParams::default(), &request)
                .await
                .with_context(|| format!("failed to request a token for ServiceAccount {name}"))?;
            let token = issued.status.map(|s| s.token).context("a TokenRequest answered without a token")?;
            let mut config = admin;
            config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))?;
            let username = format!("system:serviceaccount:{namespace}:{name}");
            Ok(Account { config, username })
        }
    };
    // As politely as the runs create their locks: 16 in flight.
    futures::stream::iter((0..n).map(one)).buffered(16).collect::<Vec<_>>().await.into_iter().collect()
}

/// Lets every ServiceAccount of the bench's namespace read and replace its Leases: the
/// ceiling's clients write Leases of their own, which no lock's client Role names.
pub async fn allow_lease_writes(env: &Env) -> anyhow::Result<()> {
    const NAME: &str = "leasehold-bench-lease-writers";
    let params = PatchParams::apply("leasehold-bench");
    let metadata = ObjectMeta { name: Some(NAME.to_owned()), ..ObjectMeta::default() };
    let role = Role {
        metadata: metadata.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".to_owned()]),
            resources: Some(vec!["leases".to_owned()]),
            verbs: vec!["get".to_owned(), "update".to_owned()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(env.ns.client.clone(), env.name())
        .patch(NAME, &params, &Patch::Apply(role))
        .await
        .context("failed to apply the ceiling's Role")?;
    let binding = RoleBinding {
        metadata,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: NAME.to_owned(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Group".to_owned(),
            name: format!("system:serviceaccounts:{}", env.name()),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(env.ns.client.clone(), env.name())
        .patch(NAME, &params, &Patch::Apply(binding))
        .await
        .context("failed to apply the ceiling's RoleBinding")?;
    Ok(())
}
