//! The scenario file of `vramguard simulate`: the nodes and their GPUs, the
//! jobs (when they arrive, their TrainingJob spec, how long they run, what
//! they truly need) and the faults. Read once into a [`Scenario`]; every
//! error names the field (`jobs[2].duration: ...`).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::Value;

use crate::agent::bytes::ByteSize;
use crate::api::{self, TrainingJob};
use crate::estimate::gpus::GpuProduct;
use crate::inventory::catalog_product;

/// Why a scenario cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("not valid YAML: {0}")]
    Syntax(String),
    /// A field is wrong; `path` names it.
    #[error("{path}: {reason}")]
    Field { path: String, reason: String },
}

fn field(path: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Field {
        path: path.into(),
        reason: reason.into(),
    }
}

/// Seconds of simulated time, written `90`, `90s`, `15m`, `2h` or `1d`.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Secs(pub f64);

/// Parse `90`, `90s`, `1.5m`, `2h` or `1d` into seconds.
pub fn parse_secs(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; use s, m, h or d (e.g. 90s, 15m, 2h)"
            ));
        }
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: expected a duration such as 90s, 15m or 2h"))?;
    let secs = n * scale;
    if !secs.is_finite() || secs > 366.0 * 86_400.0 {
        return Err(format!("{text:?}: longer than a year"));
    }
    Ok(secs)
}

impl<'de> Deserialize<'de> for Secs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Secs, D::Error> {
        match Value::deserialize(d)? {
            Value::Number(n) => {
                let s = n
                    .as_f64()
                    .ok_or_else(|| de::Error::custom("not a number"))?;
                if !(0.0..=366.0 * 86_400.0).contains(&s) {
                    return Err(de::Error::custom(format!(
                        "{s} seconds is out of range (0 to a year)"
                    )));
                }
                Ok(Secs(s))
            }
            Value::String(s) => parse_secs(&s).map(Secs).map_err(de::Error::custom),
            other => Err(de::Error::custom(format!(
                "expected a duration such as 90s, 15m or 2h, found {other}"
            ))),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    seed: u64,
    #[serde(default = "default_horizon")]
    duration: Secs,
    #[serde(default)]
    agents: AgentsFile,
    #[serde(default)]
    truth: TruthFile,
    #[serde(default)]
    sample_every: Option<Secs>,
    nodes: Vec<NodeFile>,
    jobs: Vec<JobFile>,
    #[serde(default)]
    faults: Vec<FaultFile>,
}

fn default_horizon() -> Secs {
    Secs(7.0 * 86_400.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AgentsFile {
    #[serde(default = "default_interval")]
    interval: Secs,
    #[serde(default = "default_ttl")]
    ttl: Secs,
}

impl Default for AgentsFile {
    fn default() -> Self {
        AgentsFile {
            interval: default_interval(),
            ttl: default_ttl(),
        }
    }
}

fn default_interval() -> Secs {
    Secs(30.0)
}

fn default_ttl() -> Secs {
    Secs(120.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TruthFile {
    #[serde(default)]
    spread: Option<[f64; 2]>,
    /// Measured / estimated ratios by recipe to draw from instead of `spread`:
    /// `calibration` (the calibration rows' own) or a table of lists.
    #[serde(default)]
    residuals: Option<ResidualsFile>,
    #[serde(default = "default_oom_after")]
    oom_after: Secs,
    /// From a Job's creation until its pods run (image pull, scheduling).
    #[serde(default)]
    start_after: Secs,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ResidualsFile {
    Named(String),
    Table(BTreeMap<String, Vec<f64>>),
}

impl Default for TruthFile {
    fn default() -> Self {
        TruthFile {
            spread: None,
            residuals: None,
            oom_after: default_oom_after(),
            start_after: Secs(0.0),
        }
    }
}

/// The calibration rows' measured / estimated ratios by recipe, as
/// `tests/calibration.rs` computes them from `../shared/calibration` (and
/// checks this copy against).
pub const CALIBRATION_RESIDUALS: &str = include_str!("calibration-residuals.yaml");

/// Ratios by recipe: each list non-empty, each ratio in (0, 100].
pub type Residuals = BTreeMap<String, Vec<f64>>;

fn residual_table(file: ResidualsFile) -> Result<Residuals, ScenarioError> {
    let table = match file {
        ResidualsFile::Named(name) if name == "calibration" => {
            #[derive(Deserialize)]
            struct Shipped {
                recipes: Residuals,
            }
            let shipped: Shipped = serde_saphyr::from_str(CALIBRATION_RESIDUALS).map_err(|e| {
                field(
                    "truth.residuals",
                    format!("the shipped calibration table: {e}"),
                )
            })?;
            shipped.recipes
        }
        ResidualsFile::Named(other) => {
            return Err(field(
                "truth.residuals",
                format!(
                    "{other:?} is not a residual table; use calibration or a map of recipe to ratios, e.g. {{lora: [0.97, 1.02]}}"
                ),
            ));
        }
        ResidualsFile::Table(t) => t,
    };
    if table.is_empty() {
        return Err(field("truth.residuals", "needs at least one recipe"));
    }
    for (recipe, ratios) in &table {
        if ratios.is_empty() {
            return Err(field(
                format!("truth.residuals.{recipe}"),
                "needs at least one ratio",
            ));
        }
        if ratios.len() > 100_000 {
            return Err(field(
                format!("truth.residuals.{recipe}"),
                format!("{} ratios; at most 100000", ratios.len()),
            ));
        }
        if let Some(r) = ratios
            .iter()
            .find(|r| !(r.is_finite() && **r > 0.0 && **r <= 100.0))
        {
            return Err(field(
                format!("truth.residuals.{recipe}"),
                format!("{r} is not a measured / estimated ratio; 0 < ratio <= 100"),
            ));
        }
    }
    Ok(table)
}

fn default_spread() -> [f64; 2] {
    [0.95, 1.05]
}

fn default_oom_after() -> Secs {
    Secs(120.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeFile {
    name: String,
    product: String,
    #[serde(default = "eight")]
    gpus: u32,
    #[serde(default = "one")]
    count: u32,
}

fn eight() -> u32 {
    8
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JobFile {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    at: Secs,
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    every: Secs,
    duration: Secs,
    #[serde(default)]
    factor: Option<f64>,
    #[serde(default)]
    true_bytes_per_gpu: Option<ByteSize>,
    spec: Value,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FaultFile {
    at: Secs,
    #[serde(default)]
    operator_restart: Option<RestartFile>,
    #[serde(default)]
    agent_stops: Option<NodeRef>,
    #[serde(default)]
    node_lost: Option<NodeRef>,
    #[serde(default)]
    burst: Option<BurstFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RestartFile {
    #[serde(default = "default_down")]
    down: Secs,
}

fn default_down() -> Secs {
    Secs(30.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NodeRef {
    node: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BurstFile {
    job: String,
    count: u32,
}

/// One simulated node.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    pub product: &'static GpuProduct,
    pub gpus: u32,
}

/// What a job truly needs: a hidden factor on the estimate, or a measured
/// figure per GPU for the spec as written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TrueNeed {
    Factor(f64),
    BytesPerGpu(u64),
}

/// One job arrival.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub at: f64,
    /// The TrainingJob as submitted (name and namespace set).
    pub job: TrainingJob,
    /// Seconds it runs once started.
    pub duration: f64,
    /// None: drawn from the scenario's spread, per job shape.
    pub true_need: Option<TrueNeed>,
    /// The scenario entry it comes from.
    pub group: String,
}

/// A fault injected at a time.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The operator process dies and comes back after `down` seconds.
    OperatorRestart { down: f64 },
    /// The node's agent stops publishing (the node keeps running).
    AgentStops { node: String },
    /// The node disappears with everything on it.
    NodeLost { node: String },
}

/// A scenario, checked.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    pub horizon: f64,
    pub agent_interval: f64,
    pub agent_ttl: f64,
    pub spread: (f64, f64),
    /// Measured / estimated ratios by recipe, drawn from instead of `spread`.
    pub residuals: Option<Residuals>,
    pub oom_after: f64,
    /// Seconds from a Job's creation until its pods run.
    pub start_after: f64,
    pub sample_every: f64,
    pub nodes: Vec<NodeSpec>,
    /// In arrival order (ties keep file order).
    pub arrivals: Vec<Arrival>,
    /// In time order.
    pub faults: Vec<(f64, Fault)>,
}

impl Scenario {
    /// Total GPUs.
    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }
}

const TEMPLATE: &str =
    r#"{"spec": {"containers": [{"name": "trainer", "image": "registry.example/trainer:sim"}]}}"#;

/// The TrainingJob of a scenario entry: apiVersion, kind and metadata added,
/// a default trainer template when the spec has none.
fn training_job(
    name: &str,
    namespace: &str,
    spec: &Value,
    path: &str,
) -> Result<TrainingJob, ScenarioError> {
    let mut spec = spec.clone();
    let Some(map) = spec.as_object_mut() else {
        return Err(field(
            format!("{path}.spec"),
            "expected a TrainingJob spec (a mapping with model, training, ...)",
        ));
    };
    if !map.contains_key("template") {
        let t: Value = serde_json::from_str(TEMPLATE).expect("the default template is JSON");
        map.insert("template".into(), t);
    }
    let doc = serde_json::json!({
        "apiVersion": "vramguard.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    });
    api::parse::training_job(doc).map_err(|e| {
        field(
            format!("{path}.spec"),
            e.to_string().replace('\n', "; ").replace("spec.", ""),
        )
    })
}

fn check_name(name: &str, path: &str, max: usize) -> Result<(), ScenarioError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(field(
            path,
            format!(
                "{name:?} is not a valid name: lowercase letters, digits and '-', at most {max} characters"
            ),
        ))
    }
}

/// At most this many jobs in one scenario: at [`MEMORY_PER_JOB`], some 8 GiB.
pub const MAX_JOBS: u64 = 50_000;

/// Memory a simulated job takes over a whole run (its objects in the API
/// server, the operator's and the reflectors' copies, its records, and the
/// baseline run's share), with room above what was measured: the generated
/// day of `cargo bench --bench simulate` peaked at 1.37 GiB for 10 000 jobs,
/// 749 MiB (77 KiB a job) since the API server keeps objects as JSON (with
/// `/usr/bin/time -v`); the `burst` scenario at 440 MiB before that.
pub const MEMORY_PER_JOB: u64 = 160 * 1024;

/// Read and check a scenario.
pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    parse_within(text, None)
}

/// Read and check a scenario that has `memory` bytes to run in (`None`: no
/// bound but [`MAX_JOBS`]): one that would need more is refused before
/// anything is built, with the numbers.
pub fn parse_within(text: &str, memory: Option<u64>) -> Result<Scenario, ScenarioError> {
    let mut docs = api::parse::documents(text).map_err(|e| ScenarioError::Syntax(e.to_string()))?;
    if docs.len() != 1 {
        return Err(ScenarioError::Syntax(format!(
            "expected one document (one scenario), found {}",
            docs.len()
        )));
    }
    let file: File = serde_path_to_error::deserialize(docs.remove(0)).map_err(|e| {
        let path = e.path().to_string();
        field(
            if path == "." {
                "(top level)".to_string()
            } else {
                path
            },
            e.into_inner().to_string(),
        )
    })?;
    if file.truth.spread.is_some() && file.truth.residuals.is_some() {
        return Err(field(
            "truth.residuals",
            "give spread or residuals, not both",
        ));
    }
    let [lo, hi] = file.truth.spread.unwrap_or_else(default_spread);
    let residuals = file.truth.residuals.map(residual_table).transpose()?;
    if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi && hi <= 100.0) {
        return Err(field(
            "truth.spread",
            format!("[{lo}, {hi}]: give [low, high] with 0 < low <= high <= 100"),
        ));
    }
    if file.agents.interval.0 < 1.0 {
        return Err(field("agents.interval", "must be at least 1s"));
    }
    if file.duration.0 <= 0.0 {
        return Err(field("duration", "must be more than 0s"));
    }
    let sample_every = file
        .sample_every
        .map(|s| s.0)
        .unwrap_or_else(|| (file.duration.0 / 48.0).max(60.0));
    if sample_every < 1.0 {
        return Err(field("sampleEvery", "must be at least 1s"));
    }

    let mut nodes = Vec::new();
    let mut names = BTreeSet::new();
    if file.nodes.is_empty() {
        return Err(field("nodes", "give at least one node"));
    }
    for (i, n) in file.nodes.iter().enumerate() {
        let path = format!("nodes[{i}]");
        check_name(&n.name, &format!("{path}.name"), 50)?;
        let product = catalog_product(&n.product).filter(|p| !p.mig).ok_or_else(|| {
            field(
                format!("{path}.product"),
                format!(
                    "{:?} is not a whole GPU in the catalog (e.g. h100-80gb, a100-40gb, a100-80gb, l40s)",
                    n.product
                ),
            )
        })?;
        if n.gpus == 0 || n.gpus > 64 {
            return Err(field(
                format!("{path}.gpus"),
                format!("{} is out of range; 1 to 64 per node", n.gpus),
            ));
        }
        if n.count == 0 || n.count > 10_000 {
            return Err(field(
                format!("{path}.count"),
                format!("{} is out of range; 1 to 10000", n.count),
            ));
        }
        for k in 0..n.count {
            let name = if n.count == 1 {
                n.name.clone()
            } else {
                format!("{}-{k}", n.name)
            };
            if !names.insert(name.clone()) {
                return Err(field(
                    format!("{path}.name"),
                    format!("node {name:?} is defined twice"),
                ));
            }
            nodes.push(NodeSpec {
                name,
                product,
                gpus: n.gpus,
            });
        }
    }

    // Count what the scenario asks for before building any of it: a burst
    // of 10^8 jobs is refused here, not after taking gigabytes.
    let asked = file
        .jobs
        .iter()
        .map(|j| u64::from(j.count))
        .chain(
            file.faults
                .iter()
                .filter_map(|f| f.burst.as_ref().map(|b| u64::from(b.count))),
        )
        .fold(0u64, u64::saturating_add);
    if asked > MAX_JOBS {
        return Err(field(
            "jobs",
            format!(
                "{asked} jobs in all (entries' counts and bursts); at most {MAX_JOBS}: split the day into several scenarios"
            ),
        ));
    }
    let needed = asked.saturating_mul(MEMORY_PER_JOB);
    if let Some(memory) = memory.filter(|m| needed > *m) {
        const GIB: f64 = (1u64 << 30) as f64;
        return Err(field(
            "jobs",
            format!(
                "{asked} jobs in all need about {:.1} GiB to simulate ({} KiB a job) and {:.1} GiB of memory is available: split the day into scenarios of at most {} jobs",
                needed as f64 / GIB,
                MEMORY_PER_JOB / 1024,
                memory as f64 / GIB,
                memory / MEMORY_PER_JOB
            ),
        ));
    }
    let mut arrivals = Vec::with_capacity(usize::try_from(asked).unwrap_or(0));
    let mut groups = BTreeSet::new();
    let mut total: u64 = 0;
    for (i, j) in file.jobs.iter().enumerate() {
        let path = format!("jobs[{i}]");
        check_name(&j.name, &format!("{path}.name"), 40)?;
        if !groups.insert(j.name.clone()) {
            return Err(field(
                format!("{path}.name"),
                format!("{:?} is used twice", j.name),
            ));
        }
        let namespace = j.namespace.clone().unwrap_or_else(|| "default".into());
        check_name(&namespace, &format!("{path}.namespace"), 63)?;
        if j.duration.0 <= 0.0 {
            return Err(field(format!("{path}.duration"), "must be more than 0s"));
        }
        if j.count == 0 {
            return Err(field(
                format!("{path}.count"),
                "0 is not allowed; minimum is 1",
            ));
        }
        total = total.saturating_add(u64::from(j.count));
        let true_need = match (j.factor, &j.true_bytes_per_gpu) {
            (Some(_), Some(_)) => {
                return Err(field(
                    format!("{path}.factor"),
                    "give factor or trueBytesPerGpu, not both",
                ));
            }
            (Some(f), None) => {
                if !(f.is_finite() && f > 0.0 && f <= 100.0) {
                    return Err(field(
                        format!("{path}.factor"),
                        format!("{f} is out of range; 0 < factor <= 100"),
                    ));
                }
                Some(TrueNeed::Factor(f))
            }
            (None, Some(b)) => {
                if b.bytes() == 0 {
                    return Err(field(format!("{path}.trueBytesPerGpu"), "0 is not allowed"));
                }
                Some(TrueNeed::BytesPerGpu(b.bytes()))
            }
            (None, None) => None,
        };
        // Parse once to report spec errors with the entry's path.
        training_job(&j.name, &namespace, &j.spec, &path)?;
        for k in 0..j.count {
            let name = if j.count == 1 {
                j.name.clone()
            } else {
                format!("{}-{k}", j.name)
            };
            arrivals.push(Arrival {
                at: j.at.0 + j.every.0 * f64::from(k),
                job: training_job(&name, &namespace, &j.spec, &path)?,
                duration: j.duration.0,
                true_need,
                group: j.name.clone(),
            });
        }
    }
    if arrivals.is_empty() {
        return Err(field("jobs", "give at least one job"));
    }

    let mut faults = Vec::new();
    for (i, f) in file.faults.iter().enumerate() {
        let path = format!("faults[{i}]");
        let given = [
            f.operator_restart.is_some(),
            f.agent_stops.is_some(),
            f.node_lost.is_some(),
            f.burst.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            return Err(field(
                path,
                "give exactly one of operatorRestart, agentStops, nodeLost, burst",
            ));
        }
        let node = |r: &NodeRef, what: &str| -> Result<String, ScenarioError> {
            if names.contains(&r.node) {
                Ok(r.node.clone())
            } else {
                Err(field(
                    format!("{path}.{what}.node"),
                    format!(
                        "no node {:?}; nodes: {}",
                        r.node,
                        names.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ))
            }
        };
        if let Some(r) = &f.operator_restart {
            faults.push((f.at.0, Fault::OperatorRestart { down: r.down.0 }));
        }
        if let Some(r) = &f.agent_stops {
            faults.push((
                f.at.0,
                Fault::AgentStops {
                    node: node(r, "agentStops")?,
                },
            ));
        }
        if let Some(r) = &f.node_lost {
            faults.push((
                f.at.0,
                Fault::NodeLost {
                    node: node(r, "nodeLost")?,
                },
            ));
        }
        if let Some(b) = &f.burst {
            let Some((j, src)) = file.jobs.iter().enumerate().find(|(_, j)| j.name == b.job) else {
                return Err(field(
                    format!("{path}.burst.job"),
                    format!(
                        "no job entry {:?}; entries: {}",
                        b.job,
                        groups.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            };
            if b.count == 0 {
                return Err(field(
                    format!("{path}.burst.count"),
                    "0 is not allowed; minimum is 1",
                ));
            }
            total = total.saturating_add(u64::from(b.count));
            let namespace = src.namespace.clone().unwrap_or_else(|| "default".into());
            let true_need = arrivals
                .iter()
                .find(|a| a.group == src.name)
                .and_then(|a| a.true_need);
            for k in 0..b.count {
                let name = format!("{}-b{i}-{k}", src.name);
                arrivals.push(Arrival {
                    at: f.at.0,
                    job: training_job(&name, &namespace, &src.spec, &format!("jobs[{j}]"))?,
                    duration: src.duration.0,
                    true_need,
                    group: src.name.clone(),
                });
            }
        }
    }
    if total > MAX_JOBS {
        return Err(field(
            "jobs",
            format!("{total} jobs in all; at most {MAX_JOBS}"),
        ));
    }
    arrivals.sort_by(|a, b| a.at.total_cmp(&b.at));
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(Scenario {
        name: file.name.unwrap_or_else(|| "scenario".into()),
        seed: file.seed,
        horizon: file.duration.0,
        agent_interval: file.agents.interval.0,
        agent_ttl: file.agents.ttl.0,
        spread: (lo, hi),
        residuals,
        oom_after: file.truth.oom_after.0,
        start_after: file.truth.start_after.0,
        sample_every,
        nodes,
        arrivals,
        faults,
    })
}

/// The generated day of `cargo bench --bench simulate` and of the scale
/// test: `jobs` jobs arriving over ten hours on `gpus` GPUs (8 per node,
/// half H100 80GB, half A100 40GB): 60 % LoRA fine-tunes, 25 % BERT runs,
/// 10 % 4-GPU GPT-2 pre-training, 5 % a shape that needs 30 % more than
/// estimated; an operator restart at 3h and a lost node at 5h.
pub fn generated_day(jobs: u64, gpus: u64) -> String {
    use std::fmt::Write as _;
    let jobs = jobs.max(1);
    let nodes = gpus.div_ceil(8).max(2);
    let hours = 10.0;
    let every = hours * 3600.0 / jobs as f64;
    // Shares of the jobs: 60 % LoRA, 25 % BERT, 10 % GPT-2 on 4 GPUs, 5 % underestimated.
    let share = |p: f64| ((jobs as f64 * p).round() as u64).max(1);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "name: bench\nseed: 1\nduration: 24h\ntruth: {{spread: [0.85, 1.0], oomAfter: 2m}}\nnodes:"
    );
    let _ = writeln!(
        s,
        "  - {{name: h100, product: h100-80gb, gpus: 8, count: {}}}",
        nodes / 2
    );
    let _ = writeln!(
        s,
        "  - {{name: a100, product: a100-40gb, gpus: 8, count: {}}}",
        nodes - nodes / 2
    );
    let _ = writeln!(s, "jobs:");
    let groups = [
        (
            "lora",
            share(0.60),
            "40m",
            "{model: {preset: llama-3.1-8b}, training: {mode: lora, microBatchSize: 4, globalBatchSize: 32, sequenceLength: 4096, precision: bf16, gradientCheckpointing: full}, parallelism: {gpus: 1}, fitPolicy: {mode: Adjust, allow: [microBatchSize, gradientCheckpointing]}}",
            "",
        ),
        (
            "bert",
            share(0.25),
            "20m",
            "{model: {preset: bert-large, head: classification, numLabels: 3}, training: {mode: full, microBatchSize: 32, sequenceLength: 128}, parallelism: {gpus: 1}}",
            "",
        ),
        (
            "gpt2",
            share(0.10),
            "1h",
            "{model: {preset: gpt2}, training: {mode: full, microBatchSize: 16, globalBatchSize: 256, sequenceLength: 1024}, parallelism: {gpus: 4, gpusPerNode: 4}, fitPolicy: {mode: Adjust, allow: [microBatchSize], minMicroBatchSize: 4}}",
            "",
        ),
        (
            "under",
            share(0.05),
            "30m",
            "{model: {custom: {parameters: 1.3e9, activationBytesPerSample: 6.0e9}}, training: {mode: full, microBatchSize: 8}, parallelism: {gpus: 1}, fitPolicy: {mode: Adjust, allow: [microBatchSize]}}",
            "factor: 1.3, ",
        ),
    ];
    let total: u64 = groups.iter().map(|g| g.1).sum();
    let mut offset = 0.0;
    for (name, count, duration, spec, extra) in groups {
        // Interleave the groups over the same ten hours.
        let step = every * total as f64 / count as f64;
        let _ = writeln!(
            s,
            "  - {{name: {name}, count: {count}, at: {offset:.0}, every: {step:.3}, duration: {duration}, {extra}spec: {spec}}}"
        );
        offset += every;
    }
    let _ = writeln!(
        s,
        "faults:\n  - {{at: 3h, operatorRestart: {{down: 1m}}}}\n  - {{at: 5h, nodeLost: {{node: a100-0}}}}"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "
nodes: [{name: n1, product: h100-80gb, gpus: 2}]
jobs:
  - name: j
    count: 3
    every: 10m
    duration: 1h
    spec: {model: {preset: gpt2}}
faults:
  - {at: 5m, burst: {job: j, count: 2}}
  - {at: 1h, nodeLost: {node: n1}}
";

    #[test]
    fn arrivals_bursts_and_faults_in_time_order() {
        let s = parse(SMALL).unwrap();
        assert_eq!(s.nodes.len(), 1);
        let at: Vec<f64> = s.arrivals.iter().map(|a| a.at).collect();
        assert_eq!(at, vec![0.0, 300.0, 300.0, 600.0, 1200.0]);
        assert_eq!(s.arrivals[1].job.metadata.name.as_deref(), Some("j-b0-0"));
        assert_eq!(
            s.faults,
            vec![(3600.0, Fault::NodeLost { node: "n1".into() })]
        );
        assert_eq!(s.horizon, 7.0 * 86_400.0);
    }

    #[test]
    fn a_huge_burst_is_refused_before_it_is_built() {
        let text = SMALL.replace("count: 2}", "count: 100000000}");
        let e = parse(&text).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "jobs: 100000003 jobs in all (entries' counts and bursts); at most 50000"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_scenario_that_would_not_fit_in_memory_is_refused_with_the_numbers() {
        let text = SMALL.replace("count: 2}", "count: 20000}");
        // 20 003 jobs at 160 KiB need 3.1 GiB.
        let e = parse_within(&text, Some(2 << 30)).unwrap_err().to_string();
        assert!(
            e.starts_with("jobs: 20003 jobs in all need about 3.1 GiB to simulate (160 KiB a job) and 2.0 GiB of memory is available: split the day into scenarios of at most 13107 jobs"),
            "{e}"
        );
        assert!(parse_within(&text, Some(4 << 30)).is_ok());
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse(&SMALL.replace("duration: 1h", "duration: 1y")).unwrap_err();
        assert!(e.to_string().starts_with("jobs[0].duration: "), "{e}");
        let e = parse(&SMALL.replace("node: n1}", "node: m}")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("faults[1].nodeLost.node: no node"),
            "{e}"
        );
        let e = parse(&SMALL.replace("h100-80gb", "h900")).unwrap_err();
        assert!(e.to_string().starts_with("nodes[0].product: "), "{e}");
        let e = parse(&SMALL.replace("preset: gpt2", "preset: gpt2, bogus: 1")).unwrap_err();
        assert!(e.to_string().starts_with("jobs[0].spec: "), "{e}");
        assert!(e.to_string().contains("bogus"), "{e}");
        assert_eq!(parse_secs("1.5h"), Ok(5400.0));
        assert!(parse_secs("3w").is_err());
    }
}
