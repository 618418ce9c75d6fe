//! `GET /`: the panel, one page compiled into the binary (no CDN, no build step: clusters
//! are often air-gapped). It reads `GET /state` every 1.5 s and draws a table per concern.
pub(crate) const PAGE: &str = include_str!("panel.html");
