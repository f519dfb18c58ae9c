//! What every part's Prometheus registry shares: the `vramguard` prefix,
//! `vramguard_build_info`, and the text encoding `/metrics` answers with.
//! Each part registers its own families (`register(&mut Registry) -> Self`).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A registry with the project's prefix and `vramguard_build_info{version}`.
pub fn registry() -> Registry {
    let mut registry = Registry::with_prefix("vramguard");
    register_build_info(&mut registry);
    registry
}

/// `vramguard_build_info{version="..."} 1`: which version runs where.
pub fn register_build_info(registry: &mut Registry) {
    registry.register(
        "build",
        "The vramguard version of this process",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
}

/// The registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// The registry as a `/metrics` response.
pub fn response(registry: &Registry) -> Response {
    match encode(registry) {
        Ok(out) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], out).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A byte count as a gauge value (saturating: no GPU has 2^63 bytes).
pub fn gauge_bytes(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_names_the_version() {
        let out = encode(&registry()).unwrap();
        assert!(
            out.contains(&format!(
                "vramguard_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{out}"
        );
    }
}
