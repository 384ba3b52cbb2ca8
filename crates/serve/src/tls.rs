//! TLS in-process, or plain HTTP behind a TLS-terminating proxy.
//!
//! Agents' bearer credentials and the tools' arguments cross this connection, so it is TLS
//! unless the operator says a proxy in front does TLS (`--behind-tls-proxy`, also right for
//! loopback). TLS is rustls with the `ring` provider, TLS 1.2 and 1.3, ALPN `h2` and `http/1.1`.
//! Certificates are PEM files; they are read before the port is bound, so a bad file stops the
//! start instead of the first client.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS files could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {why}")]
pub struct TlsError {
    /// Which file (or `certificate and key` when they do not match).
    pub file: String,
    /// Why.
    pub why: String,
}

/// The server's TLS configuration from a PEM certificate chain and its PEM private key.
pub fn config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    configured(cert, key, None)
}

/// As [`config`], asking every client for a certificate that `clients` accepts (the approver
/// listener's mutual TLS).
pub fn config_with_clients(
    cert: &Path,
    key: &Path,
    clients: Arc<dyn ClientCertVerifier>,
) -> Result<Arc<ServerConfig>, TlsError> {
    configured(cert, key, Some(clients))
}

fn configured(
    cert: &Path,
    key: &Path,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| TlsError {
            file: cert.display().to_string(),
            why: format!("not a PEM certificate chain ({e})"),
        })?;
    if certs.is_empty() {
        return Err(TlsError {
            file: cert.display().to_string(),
            why: "no certificate in the file".into(),
        });
    }
    // The key's error never quotes the file: it is a private key.
    let private = PrivateKeyDer::from_pem_file(key).map_err(|_| TlsError {
        file: key.display().to_string(),
        why: "not a readable PEM private key (PKCS#8, PKCS#1 or SEC1)".into(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            file: "TLS".into(),
            why: e.to_string(),
        })?;
    let builder = match clients {
        Some(clients) => builder.with_client_cert_verifier(clients),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, private)
        .map_err(|e| TlsError {
            file: "certificate and key".into(),
            why: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
