//! Shared helpers for the integration tests (`mod support;` in a test file).

pub mod apiserver;
pub mod fixtures;
