//! The control plane's PKI, made with rcgen for each control plane: one CA (which also
//! serves as the client CA), serving certificates signed by it, and the service-account
//! token signing key. All keys are ECDSA P-256, which Go and rustls both accept.

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// Names the apiserver's serving certificate covers: loopback, where tests connect, and
/// the in-cluster names and service IP of the `kubernetes` Service (the first address of
/// `--service-cluster-ip-range`), so that certificates behave as in a real cluster.
pub(crate) const APISERVER_HOSTS: [&str; 7] = [
    "127.0.0.1",
    "localhost",
    "10.0.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub(crate) struct CertifiedKey {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

/// The CA and the service-account key pair of one control plane.
pub(crate) struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    sa_private_pem: String,
    sa_public_pem: String,
}

impl Pki {
    /// Generates a fresh CA and service-account key pair.
    pub(crate) fn generate() -> anyhow::Result<Pki> {
        let ca_key = KeyPair::generate().context("failed to generate the CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new()).context("failed to build the CA parameters")?;
        params.distinguished_name.push(DnType::CommonName, "leasehold-test-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = params.self_signed(&ca_key).context("failed to self-sign the CA")?;
        let sa_key = KeyPair::generate().context("failed to generate the service-account signing key")?;
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            issuer: Issuer::new(params, ca_key),
            sa_private_pem: sa_key.serialize_pem(),
            sa_public_pem: sa_key.public_key_pem(),
        })
    }

    /// The CA certificate (PEM); it signs serving certificates and is the client CA.
    pub(crate) fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The service-account token signing key (PKCS#8 PEM).
    pub(crate) fn sa_private_pem(&self) -> &str {
        &self.sa_private_pem
    }

    /// The public half of the signing key (PKIX PEM), which verifies tokens.
    pub(crate) fn sa_public_pem(&self) -> &str {
        &self.sa_public_pem
    }

    /// A TLS serving certificate for `hosts` (IP addresses or DNS names), signed by the CA.
    pub(crate) fn serving_cert(&self, hosts: &[&str]) -> anyhow::Result<CertifiedKey> {
        let names: Vec<String> = hosts.iter().map(|host| (*host).to_owned()).collect();
        let mut params =
            CertificateParams::new(names).with_context(|| format!("invalid serving certificate hosts {hosts:?}"))?;
        params.distinguished_name.push(DnType::CommonName, hosts.first().copied().unwrap_or("leasehold-test-server"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("failed to generate a serving key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("failed to sign a serving certificate for {hosts:?}"))?;
        Ok(CertifiedKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// A TLS client certificate for the user `common_name` in the groups `organizations`
    /// (how the apiserver reads an X.509 identity), signed by the CA.
    pub(crate) fn client_cert(&self, common_name: &str, organizations: &[&str]) -> anyhow::Result<CertifiedKey> {
        let mut params = CertificateParams::new(Vec::<String>::new()).context("failed to build client parameters")?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        for organization in organizations {
            params.distinguished_name.push(DnType::OrganizationName, *organization);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().context("failed to generate a client key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("failed to sign a client certificate for {common_name}"))?;
        Ok(CertifiedKey { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }
}

#[cfg(test)]
mod tests {
    use super::Pki;

    #[test]
    fn issues_pem_material() {
        let pki = Pki::generate().expect("PKI generation works offline");
        assert!(pki.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.sa_private_pem().contains("PRIVATE KEY"));
        assert!(pki.sa_public_pem().starts_with("-----BEGIN PUBLIC KEY-----"));
        let served = pki.serving_cert(&["127.0.0.1", "localhost"]).expect("valid hosts");
        assert!(served.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(served.key_pem.contains("PRIVATE KEY"));
    }
}
