//! A throwaway CA and a server certificate it signed, for TLS tests.

/// A CA and a certificate for `localhost` and `127.0.0.1` it signed.
pub struct TestCerts {
    /// The CA's certificate (PEM), what a client trusts.
    pub ca_pem: String,
    /// The server's certificate (PEM).
    pub cert_pem: String,
    /// The server's private key (PEM).
    pub key_pem: String,
    /// The server's certificate (DER).
    pub cert_der: rustls::pki_types::CertificateDer<'static>,
    /// The server's private key (DER).
    pub key_der: rustls::pki_types::PrivateKeyDer<'static>,
}

impl TestCerts {
    pub fn generate() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "seawall test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        Self {
            ca_pem: ca_cert.pem(),
            cert_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
            cert_der: leaf.der().clone(),
            key_der: rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
        }
    }

    /// Writes `ca.pem`, `cert.pem` and `key.pem` into `dir`.
    pub fn write(&self, dir: &std::path::Path) {
        std::fs::write(dir.join("ca.pem"), &self.ca_pem).unwrap();
        std::fs::write(dir.join("cert.pem"), &self.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &self.key_pem).unwrap();
    }
}
