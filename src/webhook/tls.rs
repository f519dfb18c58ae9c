//! TLS for the webhook: certificates from files (checked before binding and
//! reloaded when they change on disk) or a self-signed pair for local use.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no PEM private key found ({reason})")]
    NoKey { path: PathBuf, reason: String },
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A server configuration from PEM text: TLS 1.2 and 1.3 only, ring provider.
pub fn server_config_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_path: &Path,
    key_path: &Path,
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_path.to_path_buf(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::NoKey {
        path: key_path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Read and check the certificate and key files.
pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.to_path_buf(),
            source,
        })
    };
    server_config_from_pem(&read(cert_path)?, &read(key_path)?, cert_path, key_path)
}

/// A generated CA and a server certificate it signed.
pub struct SelfSigned {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Generate a CA and a server certificate for `hosts` (DNS names or IPs).
pub fn self_signed(hosts: &[String]) -> Result<SelfSigned, TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "vramguard local CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let mut params = CertificateParams::new(hosts.to_vec())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "vramguard webhook");
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    Ok(SelfSigned {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Modification times of the two files, for change detection.
pub fn stamps(cert_path: &Path, key_path: &Path) -> Option<(SystemTime, SystemTime, u64, u64)> {
    let c = std::fs::metadata(cert_path).ok()?;
    let k = std::fs::metadata(key_path).ok()?;
    Some((c.modified().ok()?, k.modified().ok()?, c.len(), k.len()))
}

/// Reload the files into `config` whenever they change; runs until cancelled.
/// A broken new pair is logged and the old one kept.
pub async fn watch(
    cert_path: PathBuf,
    key_path: PathBuf,
    config: axum_server::tls_rustls::RustlsConfig,
    every: Duration,
) {
    let mut last = stamps(&cert_path, &key_path);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = stamps(&cert_path, &key_path);
        if now.is_none() || now == last {
            continue;
        }
        match load(&cert_path, &key_path) {
            Ok(c) => {
                config.reload_from_config(c);
                tracing::info!(cert = %cert_path.display(), "reloaded the TLS certificate");
                last = now;
            }
            Err(error) => {
                tracing::warn!(%error, "the new TLS certificate does not load; keeping the old one");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_loads() {
        let s = self_signed(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        assert!(s.ca_pem.contains("BEGIN CERTIFICATE"));
        server_config_from_pem(
            s.cert_pem.as_bytes(),
            s.key_pem.as_bytes(),
            Path::new("cert"),
            Path::new("key"),
        )
        .unwrap();
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let e = server_config_from_pem(b"nope", b"nope", Path::new("c.pem"), Path::new("k.pem"))
            .unwrap_err();
        assert!(e.to_string().contains("c.pem"), "{e}");
    }
}
