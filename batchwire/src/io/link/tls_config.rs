//! Mutual TLS configurations from a node's PEM files: both sides present a certificate and
//! verify the other's against the cluster's CA; the names are checked by the handshake, not
//! by rustls.

use super::*;

/// rustls configurations for both roles, built once per node.
pub(crate) struct TlsConfigs {
    pub client: Arc<ClientConfig>,
    pub server: Arc<ServerConfig>,
    /// For dialing a seed's address without knowing its name: the chain is verified
    /// against the CA as always, the name is checked after the batchwire handshake (the
    /// certificate must name the node the HELLO claims, see `Setup::check_certificate`).
    pub join: Arc<ClientConfig>,
}

/// The server name a join dial presents (a seed's name is not known yet).
pub(crate) const JOIN_SERVER_NAME: &str = "join.batchwire.invalid";

/// A server verifier that checks everything but the name (see `TlsConfigs::join`).
#[derive(Debug)]
pub(super) struct AnyNameVerifier(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                NotValidForName | NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            r => r,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl TlsConfigs {
    /// Load the PEM files and build mutual-TLS configurations: both sides present a
    /// certificate and verify the other's against the CA.
    pub fn load(files: &TlsFiles, node_name: &str) -> Result<TlsConfigs, Error> {
        ServerName::try_from(node_name.to_string()).map_err(|_| {
            Error::Tls(format!(
                "node name {node_name:?} is not a valid DNS name, which TLS certificates need"
            ))
        })?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .map_err(|e| tls_err("cannot read certificate", &files.cert, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| tls_err("bad certificate", &files.cert, e))?;
        if certs.is_empty() {
            return Err(tls_err("no certificate in", &files.cert, "empty"));
        }
        // Our own certificate should name us, or every peer will refuse every connection:
        // say so now, not only at the first connection. (Not refused here: a node that
        // presents the wrong certificate is how the peers' refusal is tested; `batchwire
        // node` refuses to start with one, through `TlsFiles::check_names`.)
        if let Err(why) = cert_names(&certs[0], node_name) {
            tracing::error!(
                node = node_name,
                cert = %files.cert.display(),
                "not this node's certificate: {why}; every peer will refuse this node"
            );
        }
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| tls_err("cannot read private key", &files.key, e))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&files.ca)
            .map_err(|e| tls_err("cannot read CA", &files.ca, e))?
        {
            let ca = ca.map_err(|e| tls_err("bad CA certificate", &files.ca, e))?;
            roots
                .add(ca)
                .map_err(|e| tls_err("bad CA certificate", &files.ca, e))?;
        }
        if roots.is_empty() {
            return Err(tls_err("no CA certificate in", &files.ca, "empty"));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| Error::Tls(format!("client verifier: {e}")))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| tls_err("certificate and key do not match", &files.key, e))?;
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| Error::Tls(format!("server verifier: {e}")))?;
        let join = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyNameVerifier(server_verifier)))
            .with_client_auth_cert(certs.clone(), key.clone_key())
            .map_err(|e| tls_err("certificate and key do not match", &files.key, e))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| tls_err("certificate and key do not match", &files.key, e))?;
        Ok(TlsConfigs {
            client: Arc::new(client),
            server: Arc::new(server),
            join: Arc::new(join),
        })
    }
}
