//! `scorch run`'s HTTP server: the UI, the query API, `/metrics` and `/healthz`.

pub mod guard;
pub mod http;
pub mod symbolz;
pub mod views;
