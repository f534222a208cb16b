//! `GET /metrics`: every counter idem records (feature `metrics`), in the Prometheus text
//! format, for a scraper and a dashboard. The guide's "Operating it" chapter lists them.

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusBuilder;

/// Installs the Prometheus recorder as the process's `metrics` recorder, and returns the route
/// that renders what it recorded. Call it once, before anything is counted.
pub(crate) fn router() -> Result<Router, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    Ok(Router::new().route(
        "/metrics",
        get(move || {
            let text = handle.render();
            async move { ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
        }),
    ))
}
