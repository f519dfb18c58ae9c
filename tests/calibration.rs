//! Published GPU-memory measurements (LitGPT runs) through the CLI's code
//! path: the estimator must reproduce them. Reads `../shared/calibration`
//! when it is there, else the copy in `tests/data/calibration`, and prints
//! per-row errors and the summary figures; asserts the figures reached so
//! accuracy never silently regresses. Rows measured by
//! `benches/gpu_truth.py` (benches/ground-truth) are reported too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use vramguard::cli::estimate::reports_from_text;
use vramguard::estimate::gpus;

#[derive(Debug, Deserialize)]
struct Expected {
    metric_kind: String,
    measured_bytes: Option<u64>,
    oom: bool,
    gpu_capacity_bytes: Option<u64>,
    confidence: String,
    /// Catalog GPU the row was measured on (ground-truth rows); the
    /// published rows leave it out.
    #[serde(default)]
    gpu: Option<String>,
}

fn calibration_dir() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("../shared/calibration");
    if shared.join("expected.json").is_file() {
        return Some(shared);
    }
    eprintln!("calibration: ../shared/calibration is missing; using tests/data/calibration");
    let vendored = root.join("tests/data/calibration");
    vendored.join("expected.json").is_file().then_some(vendored)
}

struct Row {
    id: String,
    task: String,
    kind: String,
    confidence: String,
    /// The published table the row comes from (the job file's `# source:` line).
    source: String,
    /// Trains over 4-bit (nf4) base weights.
    nf4_training: bool,
    error: f64,
    /// The measured value lies in [lower, upper] of the estimate.
    inside: bool,
    /// upper / measured - 1.
    upper_over: f64,
}

/// Rows grouped by `key`, in key order.
fn group_by<'a>(rows: &[&'a Row], key: impl Fn(&Row) -> String) -> BTreeMap<String, Vec<&'a Row>> {
    let mut out: BTreeMap<String, Vec<&'a Row>> = BTreeMap::new();
    for r in rows {
        out.entry(key(r)).or_default().push(r);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    percentile(&v, 0.5)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

struct Figures {
    n: usize,
    median: f64,
    p90: f64,
    under5: f64,
}

fn figures(rows: &[&Row]) -> Figures {
    let mut abs: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    abs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let under = rows.iter().filter(|r| r.error < -0.05).count();
    Figures {
        n: rows.len(),
        median: percentile(&abs, 0.5),
        p90: percentile(&abs, 0.9),
        under5: if rows.is_empty() {
            0.0
        } else {
            under as f64 / rows.len() as f64
        },
    }
}

fn task_of(text: &str) -> String {
    let get = |key: &str| {
        text.lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("{key}: "))
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    let gpus: u64 = get("gpus").parse().unwrap_or(1);
    let mode = get("mode");
    if gpus > 1 {
        format!("sharded-{mode}")
    } else {
        mode
    }
}

/// The trainer stack a row ran under, from its `# source:` line, written into
/// its spec: the published tables are LitGPT's own runs, a fact of the run
/// the contract could not say before `training.stack` existed. A row that
/// already names a stack, or comes from elsewhere, is left as it is.
fn with_stack_of_source(text: &str) -> String {
    let litgpt = text
        .lines()
        .any(|l| l.starts_with("# source: Lightning-AI/litgpt"));
    if !litgpt || text.contains("stack:") || std::env::var_os("CALIBRATION_NO_STACK").is_some() {
        return text.to_string();
    }
    text.replacen("  training:\n", "  training:\n    stack: litgpt\n", 1)
}

/// Every row of `dir` through the CLI's code path: the rows with a
/// measurement, and (OOM rows caught, OOM rows).
fn run_rows(dir: &Path) -> (Vec<Row>, usize, usize) {
    let expected: BTreeMap<String, Expected> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let mut rows = Vec::new();
    let mut oom_total = 0;
    let mut oom_caught = 0;
    for (id, exp) in &expected {
        // The GPU only decides context and workspace sizes, which the allocated
        // metric leaves out; the OOM rows use the nominal capacity given.
        let name = exp.gpu.as_deref().unwrap_or("a100-40gb");
        let gpu = [gpus::find(name).unwrap_or_else(|| panic!("{id}: unknown GPU {name}"))];
        let path = dir.join("jobs").join(format!("{id}.yaml"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{id}: {e}"));
        let text = with_stack_of_source(&text);
        let reports = reports_from_text(&text, &gpu).unwrap_or_else(|e| panic!("{id}: {e}"));
        let report = match reports.into_iter().next().unwrap() {
            Ok(r) => r,
            Err(e) => panic!("{id}: {}", e.message),
        };
        let est = &report.estimate;
        if exp.oom {
            oom_total += 1;
            let cap = exp.gpu_capacity_bytes.unwrap();
            // Admission judges the upper end of the estimate.
            let caught = est.fit_per_gpu_bytes() > cap;
            oom_caught += usize::from(caught);
            println!(
                "{id:<52} OOM on {:>5.1} GiB: estimate {:>6.2} GiB per GPU {}",
                cap as f64 / 2f64.powi(30),
                est.per_gpu_bytes as f64 / 2f64.powi(30),
                if caught { "caught" } else { "MISSED" }
            );
            continue;
        }
        let measured = exp.measured_bytes.unwrap() as f64;
        let predicted = match exp.metric_kind.as_str() {
            "allocated" => est.peak_allocated_bytes,
            "reserved" => est.peak_reserved_bytes,
            _ => est.per_gpu_bytes,
        } as f64;
        let error = predicted / measured - 1.0;
        let pick = |b: &vramguard::api::EstimateBounds| match exp.metric_kind.as_str() {
            "allocated" => b.peak_allocated_bytes,
            "reserved" => b.peak_reserved_bytes,
            _ => b.per_gpu_bytes,
        } as f64;
        let lower = est.lower.as_ref().map_or(predicted, pick);
        let upper = est.upper.as_ref().map_or(predicted, pick);
        let inside = lower <= measured && measured <= upper;
        println!(
            "{id:<52} {:>9} measured {:>6.2} GB estimate {:>6.2} GB ({:>6.2} – {:>6.2}) error {:>+6.1}% {} [{}]",
            exp.metric_kind,
            measured / 1e9,
            predicted / 1e9,
            lower / 1e9,
            upper / 1e9,
            error * 100.0,
            if inside { "in" } else { "OUT" },
            exp.confidence
        );
        let task = task_of(&text);
        rows.push(Row {
            id: id.clone(),
            nf4_training: text.contains("quantization: nf4") && task != "inference",
            task,
            kind: exp.metric_kind.clone(),
            confidence: exp.confidence.clone(),
            source: text
                .lines()
                .find_map(|l| l.strip_prefix("# source: "))
                .unwrap_or("unknown")
                .to_string(),
            error,
            inside,
            upper_over: upper / measured - 1.0,
        });
    }
    (rows, oom_caught, oom_total)
}

#[test]
fn calibration_rows_are_reproduced() {
    let Some(dir) = calibration_dir() else {
        panic!("no calibration data: neither ../shared/calibration nor tests/data/calibration");
    };
    println!("calibration data: {}", dir.display());
    let (rows, oom_caught, oom_total) = run_rows(&dir);
    let asserted: Vec<&Row> = rows.iter().filter(|r| r.confidence != "low").collect();
    let all: Vec<&Row> = rows.iter().collect();
    let print = |label: &str, f: &Figures| {
        println!(
            "{label:<28} n={:>3} median |err| {:>5.1}%  p90 {:>5.1}%  under-estimated >5%: {:>5.1}%",
            f.n,
            f.median * 100.0,
            f.p90 * 100.0,
            f.under5 * 100.0
        )
    };
    let fa = figures(&asserted);
    print("asserted (high+medium)", &fa);
    print("all rows (incl. low)", &figures(&all));
    for (t, sel) in group_by(&asserted, |r| r.task.clone()) {
        print(&format!("  task {t}"), &figures(&sel));
    }
    for (k, sel) in group_by(&asserted, |r| r.kind.clone()) {
        print(&format!("  metric {k}"), &figures(&sel));
    }
    // The nf4 training rows by published table: where the tables disagree
    // (what QUANTIZED_INPUT_BYTES sits between), signed.
    let nf4: Vec<&Row> = asserted
        .iter()
        .copied()
        .filter(|r| r.nf4_training)
        .collect();
    for (source, sel) in group_by(&nf4, |r| r.source.clone()) {
        println!(
            "  nf4 training, {source:<48} n={:>3} median signed error {:>+5.1}%",
            sel.len(),
            median(sel.iter().map(|r| r.error).collect()) * 100.0
        );
    }
    println!("OOM rows caught: {oom_caught}/{oom_total}");
    // The range: measured inside [lower, upper] on every row with a
    // measurement (low-confidence rows included), and how far above the
    // measurement the upper end sits.
    // Printed as `label: measured inside [lower, upper] on i/n (p%), ...`.
    let coverage = |label: &str, rows: &[&Row]| {
        let inside = rows.iter().filter(|r| r.inside).count();
        let over = median(rows.iter().map(|r| r.upper_over).collect());
        println!(
            "{label}: measured inside [lower, upper] on {inside}/{} ({:.1}%), median upper {:+.1}% over measured",
            rows.len(),
            inside as f64 / rows.len().max(1) as f64 * 100.0,
            over * 100.0
        );
        (inside, rows.len(), over)
    };
    coverage("range, all rows", &all);
    let (inside, n, over) = coverage("range, asserted rows", &asserted);
    for r in all.iter().filter(|r| !r.inside) {
        println!(
            "  outside the range: {} ({:+.1}%) [{}]",
            r.id,
            r.error * 100.0,
            r.confidence
        );
    }
    let worst = asserted
        .iter()
        .min_by(|a, b| a.error.partial_cmp(&b.error).unwrap())
        .map(|r| format!("{} {:+.1}%", r.id, r.error * 100.0));
    println!(
        "most under-estimated asserted row: {}",
        worst.unwrap_or_default()
    );

    // Rows that benches/gpu_truth.py measured on a GPU, when a run has written
    // them: reported by metric kind alongside the published ones.
    let truth = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/ground-truth");
    if truth.join("expected.json").is_file() {
        println!("ground truth: {}", truth.display());
        let (rows, caught, total) = run_rows(&truth);
        let rows: Vec<&Row> = rows.iter().collect();
        for (k, sel) in group_by(&rows, |r| r.kind.clone()) {
            print(&format!("  ground truth {k}"), &figures(&sel));
            coverage(&format!("  ground truth {k} range"), &sel);
        }
        println!("ground truth OOM rows caught: {caught}/{total}");
        let (inside, n, over) = coverage("ground truth range", &rows);
        for r in rows.iter().filter(|r| !r.inside) {
            println!(
                "  ground truth outside the range: {} ({:+.1}%)",
                r.id,
                r.error * 100.0
            );
        }
        // What the GPU rows reach today (504 rows measured on an H200: 499
        // inside); tighten as the model improves. The rows outside are runs
        // of variable-length batches and one 1B Llama row with checkpointing.
        // The point's allocated p90 rose from 8.2 % to 8.4 % when the output
        // a hand-written loop keeps bound was counted through the optimizer
        // step: `gpu_truth.py`'s loop keeps it (its rows moved closer), the
        // `ref-*` rows' loop drops it (their points rose by it; their low
        // ends leave it out).
        let allocated = figures(
            &rows
                .iter()
                .copied()
                .filter(|r| r.kind == "allocated")
                .collect::<Vec<_>>(),
        );
        assert!(
            inside as f64 >= 0.99 * n as f64,
            "GPU rows: range covers {inside}/{n}, below 99 %"
        );
        assert!(
            over <= 0.20,
            "GPU rows: median upper end {:.1}% above measured",
            over * 100.0
        );
        assert!(
            allocated.median <= 0.033 && allocated.p90 <= 0.085,
            "GPU rows, allocated: median |error| {:.1}%, p90 {:.1}%",
            allocated.median * 100.0,
            allocated.p90 * 100.0
        );
    } else {
        println!(
            "ground truth: none yet (python3 benches/gpu_truth.py on a GPU writes benches/ground-truth)"
        );
    }

    // The figures reached; tighten as the model improves, never loosen.
    // (Goal: median ≤ 3 %, p90 ≤ 8 %, under-estimated > 5 % on ≤ 3 % of rows.)
    assert!(
        fa.median <= 0.022,
        "median |error| {:.1}%",
        fa.median * 100.0
    );
    assert!(fa.p90 <= 0.071, "p90 |error| {:.1}%", fa.p90 * 100.0);
    assert!(
        fa.under5 <= 0.027,
        "under-estimated share {:.1}%",
        fa.under5 * 100.0
    );
    assert!(oom_caught >= 6, "OOM rows caught {oom_caught}/{oom_total}");
    assert!(
        inside as f64 >= 0.95 * n as f64,
        "range covers {inside}/{n} rows, below 95 %"
    );
    assert!(
        over <= 0.20,
        "median upper end {:.1}% above measured",
        over * 100.0
    );
}

/// The simulator's `truth: {residuals: calibration}` draws a job's true need
/// from these rows' measured / estimated ratios, by recipe; the shipped table
/// must be what the estimator gives today. `VRAMGUARD_WRITE_RESIDUALS=1`
/// rewrites it.
#[test]
fn the_simulators_residual_table_is_the_calibrations() {
    let Some(dir) = calibration_dir() else {
        panic!("no calibration data: neither ../shared/calibration nor tests/data/calibration");
    };
    let (rows, _, _) = run_rows(&dir);
    let asserted: Vec<&Row> = rows.iter().filter(|r| r.confidence != "low").collect();
    let mut text = String::from(
        "# Measured / estimated ratios of the calibration rows (high and medium confidence),\n\
         # by recipe: what a simulate scenario's `truth: {residuals: calibration}` draws a job\n\
         # shape's true need from. Written by\n\
         # `VRAMGUARD_WRITE_RESIDUALS=1 cargo test --release --test calibration`, which\n\
         # also checks it against the rows.\n\
         recipes:\n",
    );
    for (task, sel) in group_by(&asserted, |r| r.task.clone()) {
        let mut ratios: Vec<f64> = sel.iter().map(|r| 1.0 / (1.0 + r.error)).collect();
        ratios.sort_by(f64::total_cmp);
        let list: Vec<String> = ratios.iter().map(|r| format!("{r:.4}")).collect();
        text.push_str(&format!("  {task}: [{}]\n", list.join(", ")));
    }
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/simulate/calibration-residuals.yaml");
    if std::env::var_os("VRAMGUARD_WRITE_RESIDUALS").is_some() {
        std::fs::write(&path, &text).expect("write the residual table");
    }
    let shipped = std::fs::read_to_string(&path).expect("the residual table");
    assert_eq!(
        shipped,
        text,
        "{} is stale: rerun with VRAMGUARD_WRITE_RESIDUALS=1",
        path.display()
    );
}
