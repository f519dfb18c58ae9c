//! `vramguard crds`: the CRD YAML generated from the Rust types.

use std::io::Write;

use kube::CustomResourceExt;

use crate::api::{GpuNode, MemoryProfile, TrainingJob};

/// Every CRD as one multi-document YAML text.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for crd in [TrainingJob::crd(), GpuNode::crd(), MemoryProfile::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).expect("a CRD always serialises to YAML"));
    }
    out
}

pub fn run(out: &mut dyn Write) -> u8 {
    match out.write_all(crds_yaml().as_bytes()) {
        Ok(()) => super::EXIT_FITS,
        Err(e) => {
            eprintln!("error: writing the CRDs: {e}");
            super::EXIT_BAD_INPUT
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crds_parse_back() {
        let text = super::crds_yaml();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[2]["spec"]["names"]["kind"], "MemoryProfile");
        assert_eq!(docs[0]["spec"]["names"]["shortNames"][0], "tj");
        assert_eq!(docs[1]["spec"]["scope"], "Cluster");
        assert_eq!(docs[0]["spec"]["scope"], "Namespaced");
    }
}
