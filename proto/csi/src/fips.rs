//! FIPS 140-3 mode (`--fips`; the Go driver's FIPS mode, its chart's
//! `fips`).
//!
//! Every TLS client and server of these binaries — the AWS SDK's (EC2,
//! EBS, the credential providers), the agent's Kubernetes client, the
//! metrics endpoint, the OTLP exporter — takes rustls's aws-lc-rs
//! provider, and this workspace builds rustls with its `fips` feature: that
//! provider is AWS-LC's FIPS module (aws-lc-fips-sys) with only the
//! algorithms it is validated for (TLS 1.2 and 1.3 with AES-GCM suites, NIST
//! curves and ML-KEM hybrids; no ChaCha20-Poly1305, no X25519 alone), in
//! every build, flag or not. What `--fips` adds is the proof and the
//! record: the start fails unless the module is in FIPS mode (its power-on
//! self-tests passed: `aws_lc_rs::try_fips_mode`, which
//! `CryptoProvider::fips` asks), and `--version` and the log say it is.

use rustls::crypto::CryptoProvider;

/// Why FIPS mode could not be turned on; the process does not start.
#[derive(Debug, thiserror::Error)]
pub enum FipsError {
    /// The provider is not FIPS: the module is not in FIPS mode, or an
    /// algorithm outside its validation is offered.
    #[error("AWS-LC's FIPS module is not in FIPS mode")]
    NotInFipsMode,
    /// A provider was installed as the process's default before.
    #[error("a TLS provider was installed before FIPS mode was asked for")]
    AlreadyInstalled,
}

/// Turns FIPS mode on: proves rustls's FIPS provider is in FIPS mode and
/// makes it the process's default (which [`is_enabled`] then reports). Call
/// before any TLS client or server is built, and before logging is: it
/// logs nothing ([`log_mode`]).
///
/// # Errors
/// [`FipsError`]: the process must not start without what was asked.
pub fn enable() -> Result<(), FipsError> {
    let fips = rustls::crypto::default_fips_provider();
    if !fips.fips() {
        return Err(FipsError::NotInFipsMode);
    }
    fips.install_default().map_err(|_| FipsError::AlreadyInstalled)
}

/// Whether FIPS mode was turned on ([`enable`]).
pub fn is_enabled() -> bool {
    CryptoProvider::get_default().is_some_and(|provider| provider.fips())
}

/// Logs, once logging is set up, that FIPS mode is on, when it is.
pub fn log_mode() {
    if is_enabled() {
        tracing::info!(
            module = "AWS-LC FIPS (aws-lc-fips-sys)",
            "FIPS 140-3 mode: TLS by the FIPS module's approved algorithms only"
        );
    }
}

#[cfg(test)]
mod tests {
    use rustls::CipherSuite;

    /// The provider every TLS client and server here takes is the FIPS
    /// module's, with no suite outside its validation, flag or not.
    #[test]
    fn every_tls_configuration_offers_only_the_fips_modules_approved_suites() {
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        assert!(provider.fips(), "the FIPS module is not in FIPS mode");
        let suites: Vec<CipherSuite> = provider.cipher_suites.iter().map(|s| s.suite()).collect();
        assert!(
            !suites.contains(&CipherSuite::TLS13_CHACHA20_POLY1305_SHA256),
            "{suites:?}"
        );
        assert!(
            !suites.contains(&CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
            "{suites:?}"
        );
        assert!(suites.contains(&CipherSuite::TLS13_AES_128_GCM_SHA256), "{suites:?}");
        assert!(!super::is_enabled(), "FIPS mode is only turned on by enable");
        super::enable().unwrap();
        assert!(super::is_enabled());
    }
}
