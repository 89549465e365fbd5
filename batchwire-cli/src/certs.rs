//! `batchwire certs`: a throwaway CA and one certificate per node, to try mutual TLS in a
//! minute (and for `bench --tls`).

use std::path::Path;

use rustls_pki_types::ServerName;

fn tls_err(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Generate a test CA and one certificate per node into `dir`: `ca.pem`, `ca-key.pem`,
/// `NAME.pem` and `NAME-key.pem` (the layout [`TlsFiles::in_dir`] reads).
pub fn generate_certs(dir: &Path, nodes: &[&str]) -> Result<(), String> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    // Every name checked before a file is written: a name whose files would be another's
    // ("ca" is the CA's; "x-key" is x's private key) or repeat must not overwrite them.
    for (i, n) in nodes.iter().enumerate() {
        ServerName::try_from(n.to_string())
            .map_err(|_| format!("node name {n:?} is not a valid DNS name"))?;
        if *n == "ca" || *n == "ca-key" {
            return Err(format!(
                "node name {n:?} would overwrite the CA's files (ca.pem, ca-key.pem): choose another"
            ));
        }
        if let Some(owner) = n.strip_suffix("-key").filter(|o| nodes.contains(o)) {
            return Err(format!(
                "node name {n:?} would overwrite node {owner:?}'s private key ({n}.pem): choose another"
            ));
        }
        if nodes[..i].contains(n) {
            return Err(format!("node name {n:?} is given twice"));
        }
    }
    let g = |e: rcgen::Error| format!("generating certificates: {e}");
    std::fs::create_dir_all(dir).map_err(|e| tls_err("cannot create", dir, e))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(g)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "batchwire test CA");
    let ca_key = KeyPair::generate().map_err(g)?;
    let ca = ca_params.self_signed(&ca_key).map_err(g)?;
    // Private keys are readable by their owner only (0600), made so before a byte is
    // written; certificates are public (0644).
    let write = |name: &str, text: String| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let p = dir.join(name);
        let mode = if name.ends_with("-key.pem") {
            0o600
        } else {
            0o644
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&p)
            .map_err(|e| tls_err("cannot write", &p, e))?;
        // An existing file keeps its mode on open: set it.
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| tls_err("cannot set the mode of", &p, e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| tls_err("cannot write", &p, e))
    };
    write("ca.pem", ca.pem())?;
    write("ca-key.pem", ca_key.serialize_pem())?;
    for n in nodes {
        let mut p = CertificateParams::new(vec![n.to_string()]).map_err(g)?;
        p.distinguished_name.push(DnType::CommonName, *n);
        let key = KeyPair::generate().map_err(g)?;
        let cert = p.signed_by(&key, &ca, &ca_key).map_err(g)?;
        write(&format!("{n}.pem"), cert.pem())?;
        write(&format!("{n}-key.pem"), key.serialize_pem())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::generate_certs;

    /// Names whose files would be the CA's or another node's key, or repeat, are refused
    /// before anything is written (an existing CA stays as it was).
    #[test]
    fn names_that_would_overwrite_other_files_are_refused_first() {
        let dir = std::env::temp_dir().join(format!("bw-certs-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        generate_certs(&dir, &["a"]).unwrap();
        let ca = std::fs::read(dir.join("ca.pem")).unwrap();
        for (nodes, says) in [
            (&["ca", "b"][..], "CA's files"),
            (&["b", "ca-key"][..], "CA's files"),
            (&["x", "x-key"][..], "private key"),
            (&["b", "b"][..], "twice"),
            (&["b", "not a name"][..], "DNS name"),
        ] {
            let e = generate_certs(&dir, nodes).unwrap_err();
            assert!(e.contains(says), "{nodes:?}: {e}");
            assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca, "{nodes:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
