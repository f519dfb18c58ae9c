//! Shared helpers for the integration tests (`mod support;` in a test file).

/// The in-memory API server is part of the library (`vramguard simulate`
/// runs on it too); tests reach it under its old path.
pub use vramguard::apiserver;
pub mod fixtures;
