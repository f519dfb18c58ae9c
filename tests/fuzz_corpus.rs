//! The fuzz targets' bodies (`fuzz/src/lib.rs`) over their committed inputs,
//! without libFuzzer: the seed corpora under `fuzz/seeds/<target>/` and every
//! input a fuzzer once crashed, hung or blew up on, kept under
//! `tests/data/fuzz/<target>/`. A fixed bug that comes back fails here.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod bodies;

use std::path::Path;

/// Every file of `dir`, sorted; none when the folder is absent.
fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    out.retain(|p| p.is_file());
    out.sort();
    out
}

/// Run `body` over the seeds and the regressions of `target`; returns how
/// many inputs ran.
fn replay(target: &str, body: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in [
        root.join("fuzz/seeds").join(target),
        root.join("tests/data/fuzz").join(target),
    ] {
        for path in inputs(&dir) {
            let data = std::fs::read(&path).expect("a corpus file reads");
            let outcome = std::panic::catch_unwind(|| body(&data));
            assert!(outcome.is_ok(), "{target}: {} panics", path.display());
            n += 1;
        }
    }
    assert!(n > 0, "{target}: no seeds");
    n
}

#[test]
fn job_yaml() {
    replay("job_yaml", bodies::job_yaml);
}

#[test]
fn hf_config() {
    replay("hf_config", bodies::hf_config);
}

#[test]
fn layers() {
    replay("layers", bodies::layers);
}

#[test]
fn admission() {
    replay("admission", bodies::admission);
}

#[test]
fn inventory() {
    replay("inventory", bodies::inventory);
}

#[test]
fn simulation() {
    replay("simulation", bodies::simulation);
}

#[test]
fn oom() {
    replay("oom", bodies::oom);
}

#[test]
fn pod_resources() {
    replay("pod_resources", bodies::pod_resources);
}
