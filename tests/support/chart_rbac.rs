//! The chart's RBAC rules as its files spell them (`charts/vramguard/files/rbac/`),
//! shared by `tests/rbac.rs` (the code's calls) and `tests/e2e_rbac.rs` (a real API server).

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

/// One rule of a Role or ClusterRole, as the chart's files spell it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
}

/// The rules of one file under `charts/vramguard/files/rbac`.
pub fn rules(file: &str) -> Vec<Rule> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/vramguard/files/rbac")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (group, resource, verb) for each combination a set of rules grants.
pub fn granted(rules: &[Rule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in &r.api_groups {
            for res in &r.resources {
                for v in &r.verbs {
                    out.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    out
}
