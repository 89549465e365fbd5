//! A node's TLS material: where its files are ([`TlsFiles`]), and whether a certificate
//! names a node (its own at start, a peer's during the handshake).

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

use crate::error::Error;

/// Where a node's TLS material is (PEM files): its certificate chain, its private key, and
/// the CA that signed every node's certificate. Each node's certificate must name the node
/// (a DNS subject alternative name equal to the node name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain.
    pub cert: PathBuf,
    /// This node's private key.
    pub key: PathBuf,
    /// The cluster's CA certificate(s).
    pub ca: PathBuf,
}

impl TlsFiles {
    /// The files `batchwire certs --out DIR` writes for node `name`.
    pub fn in_dir(dir: &Path, name: &str) -> TlsFiles {
        TlsFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
            ca: dir.join("ca.pem"),
        }
    }

    /// Check that the certificate in `cert` names node `name` exactly, as every peer will
    /// check it (no case folding, no wildcard, no IP address). `Node::start` only logs a
    /// mismatch (a node presenting the wrong certificate is how peers' refusals are
    /// tested); `batchwire node` refuses to start with one.
    ///
    /// # Errors
    ///
    /// [`Error::Tls`] naming the file and the names the certificate has, or why the file
    /// could not be read.
    pub fn check_names(&self, name: &str) -> Result<(), Error> {
        check_own_certificate(&self.cert, name)
    }
}

/// [`TlsFiles::check_names`]: the first certificate in the PEM file `path` names
/// `node`.
fn check_own_certificate(path: &std::path::Path, node: &str) -> Result<(), Error> {
    let cert = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_err("cannot read certificate", path, e))?
        .next()
        .ok_or_else(|| tls_err("no certificate in", path, "empty"))?
        .map_err(|e| tls_err("bad certificate", path, e))?;
    cert_names(&cert, node).map_err(|why| {
        Error::Tls(format!(
            "{}: not the certificate of node {node:?}: {why}",
            path.display()
        ))
    })
}

/// Check that `cert` names `node`: one of its DNS subject alternative names is the node's
/// name, byte for byte. Certificate names alone would match more loosely (webpki ignores
/// case, and expands wildcards and IP addresses), but node names are exact bytes ("b" and
/// "B" are two nodes), so a certificate names only the nodes spelt exactly as in it: no
/// case folding, no wildcard (`*.x` names no node), no IP address. The chain itself was
/// verified by rustls during the TLS handshake.
pub(crate) fn cert_names(cert: &CertificateDer<'_>, node: &str) -> Result<(), String> {
    let ee = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    if ServerName::try_from(node.to_string()).is_err() {
        return Err(format!(
            "{node:?} is not a DNS name, so no certificate can name it"
        ));
    }
    let names: Vec<&str> = ee.valid_dns_names().collect();
    if names.iter().any(|n| *n == node && !n.starts_with('*')) {
        return Ok(());
    }
    // Bounded: the peer's certificate is untrusted input.
    let shown: Vec<_> = names.iter().take(4).collect();
    let more = names.len().saturating_sub(shown.len());
    Err(format!(
        "the certificate does not name {node:?} (it names {shown:?}{}; names must match \
         exactly, case included; wildcards and IP addresses name no node)",
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// A TLS error naming the file.
pub(crate) fn tls_err(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Tls(format!("{what} {}: {e}", path.display()))
}
