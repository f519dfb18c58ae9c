//! A scenario file checked field by field into a [`Scenario`]: every error
//! names the field (`jobs[2].duration: ...`), the reason and what would be
//! valid.

use std::collections::BTreeSet;

use serde_json::Value;

use super::file::{
    BurstFile, FaultFile, File, JobFile, NodeFile, NodeRef, TruthFile, default_spread,
};
use super::residuals::{Residuals, residual_table};
use super::{Arrival, Fault, NodeSpec, Scenario, ScenarioError, TrueNeed, field};
use crate::api::{self, TrainingJob};
use crate::inventory::catalog_product;

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
///
/// The checks run in the file's order (truth, agents, duration, sampling,
/// nodes, the jobs' count, each job, each fault), so the first error is the
/// first wrong field.
pub fn parse_within(text: &str, memory: Option<u64>) -> Result<Scenario, ScenarioError> {
    let mut file = read(text)?;
    let (spread, residuals) = truth(&mut file.truth)?;
    let sample_every = timing(&file)?;
    let (nodes, names) = nodes(&file.nodes)?;
    let asked = jobs_asked(&file, memory)?;
    let mut day = Day {
        entries: &file.jobs,
        nodes: names,
        groups: BTreeSet::new(),
        arrivals: Vec::with_capacity(usize::try_from(asked).unwrap_or(0)),
        faults: Vec::new(),
        total: 0,
    };
    for (i, j) in file.jobs.iter().enumerate() {
        day.job(i, j)?;
    }
    if day.arrivals.is_empty() {
        return Err(field("jobs", "give at least one job"));
    }
    for (i, f) in file.faults.iter().enumerate() {
        day.fault(i, f)?;
    }
    if day.total > MAX_JOBS {
        return Err(field(
            "jobs",
            format!("{} jobs in all; at most {MAX_JOBS}", day.total),
        ));
    }
    let Day {
        mut arrivals,
        mut faults,
        ..
    } = day;
    arrivals.sort_by(|a, b| a.at.total_cmp(&b.at));
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(Scenario {
        name: file.name.unwrap_or_else(|| "scenario".into()),
        seed: file.seed,
        horizon: file.duration.0,
        agent_interval: file.agents.interval.0,
        agent_ttl: file.agents.ttl.0,
        spread,
        residuals,
        oom_after: file.truth.oom_after.0,
        start_after: file.truth.start_after.0,
        sample_every,
        nodes,
        arrivals,
        faults,
    })
}

/// The one YAML document, read into the file's shape; a field serde
/// refuses is named by its path.
fn read(text: &str) -> Result<File, ScenarioError> {
    let mut docs = api::parse::documents(text).map_err(|e| ScenarioError::Syntax(e.to_string()))?;
    if docs.len() != 1 {
        return Err(ScenarioError::Syntax(format!(
            "expected one document (one scenario), found {}",
            docs.len()
        )));
    }
    serde_path_to_error::deserialize(docs.remove(0)).map_err(|e| {
        let path = e.path().to_string();
        field(
            if path == "." {
                "(top level)".to_string()
            } else {
                path
            },
            e.into_inner().to_string(),
        )
    })
}

/// `truth`: the spread of hidden factors, or the residual table drawn from
/// instead (taken out of the file).
fn truth(file: &mut TruthFile) -> Result<((f64, f64), Option<Residuals>), ScenarioError> {
    if file.spread.is_some() && file.residuals.is_some() {
        return Err(field(
            "truth.residuals",
            "give spread or residuals, not both",
        ));
    }
    let [lo, hi] = file.spread.unwrap_or_else(default_spread);
    let residuals = file.residuals.take().map(residual_table).transpose()?;
    if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi && hi <= 100.0) {
        return Err(field(
            "truth.spread",
            format!("[{lo}, {hi}]: give [low, high] with 0 < low <= high <= 100"),
        ));
    }
    Ok(((lo, hi), residuals))
}

/// The agents' interval, the scenario's duration and how often the cluster
/// is sampled (by default 48 times a run, at most once a minute).
fn timing(file: &File) -> Result<f64, ScenarioError> {
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
    Ok(sample_every)
}

/// Every node, an entry of `count` expanded to `name-0`, `name-1`, ...;
/// with the set of their names.
fn nodes(entries: &[NodeFile]) -> Result<(Vec<NodeSpec>, BTreeSet<String>), ScenarioError> {
    let mut nodes = Vec::new();
    let mut names = BTreeSet::new();
    if entries.is_empty() {
        return Err(field("nodes", "give at least one node"));
    }
    for (i, n) in entries.iter().enumerate() {
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
    Ok((nodes, names))
}

/// Count what the scenario asks for before building any of it: a burst of
/// 10^8 jobs is refused here, not after taking gigabytes.
fn jobs_asked(file: &File, memory: Option<u64>) -> Result<u64, ScenarioError> {
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
    Ok(asked)
}

/// The jobs and faults as they are checked, in file order: what is built so
/// far and what later entries are checked against.
struct Day<'a> {
    /// The file's job entries (a burst repeats one).
    entries: &'a [JobFile],
    /// Node names, for the faults that name one.
    nodes: BTreeSet<String>,
    /// Job entry names seen so far.
    groups: BTreeSet<String>,
    arrivals: Vec<Arrival>,
    faults: Vec<(f64, Fault)>,
    /// Jobs in all, entries' counts and bursts.
    total: u64,
}

impl Day<'_> {
    /// `jobs[i]`: checked, then its `count` arrivals, `every` apart.
    fn job(&mut self, i: usize, j: &JobFile) -> Result<(), ScenarioError> {
        let path = format!("jobs[{i}]");
        check_name(&j.name, &format!("{path}.name"), 40)?;
        if !self.groups.insert(j.name.clone()) {
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
        self.total = self.total.saturating_add(u64::from(j.count));
        let true_need = true_need(&path, j)?;
        // Parse once to report spec errors with the entry's path.
        training_job(&j.name, &namespace, &j.spec, &path)?;
        for k in 0..j.count {
            let name = if j.count == 1 {
                j.name.clone()
            } else {
                format!("{}-{k}", j.name)
            };
            self.arrivals.push(Arrival {
                at: j.at.0 + j.every.0 * f64::from(k),
                job: training_job(&name, &namespace, &j.spec, &path)?,
                duration: j.duration.0,
                true_need,
                group: j.name.clone(),
            });
        }
        Ok(())
    }

    /// `faults[i]`: exactly one kind, its node or job entry known.
    fn fault(&mut self, i: usize, f: &FaultFile) -> Result<(), ScenarioError> {
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
        if let Some(r) = &f.operator_restart {
            self.faults
                .push((f.at.0, Fault::OperatorRestart { down: r.down.0 }));
        }
        if let Some(r) = &f.agent_stops {
            let node = self.node(&path, r, "agentStops")?;
            self.faults.push((f.at.0, Fault::AgentStops { node }));
        }
        if let Some(r) = &f.node_lost {
            let node = self.node(&path, r, "nodeLost")?;
            self.faults.push((f.at.0, Fault::NodeLost { node }));
        }
        if let Some(b) = &f.burst {
            self.burst(i, &path, f.at.0, b)?;
        }
        Ok(())
    }

    /// The node a fault names, when the scenario has it.
    fn node(&self, path: &str, r: &NodeRef, what: &str) -> Result<String, ScenarioError> {
        if self.nodes.contains(&r.node) {
            Ok(r.node.clone())
        } else {
            Err(field(
                format!("{path}.{what}.node"),
                format!(
                    "no node {:?}; nodes: {}",
                    r.node,
                    self.nodes.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ))
        }
    }

    /// A burst of fault `i`: `count` more jobs of an entry at once, named
    /// `entry-b{i}-{k}`, with the entry's truth.
    fn burst(&mut self, i: usize, path: &str, at: f64, b: &BurstFile) -> Result<(), ScenarioError> {
        let Some((j, src)) = self
            .entries
            .iter()
            .enumerate()
            .find(|(_, j)| j.name == b.job)
        else {
            return Err(field(
                format!("{path}.burst.job"),
                format!(
                    "no job entry {:?}; entries: {}",
                    b.job,
                    self.groups.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        if b.count == 0 {
            return Err(field(
                format!("{path}.burst.count"),
                "0 is not allowed; minimum is 1",
            ));
        }
        self.total = self.total.saturating_add(u64::from(b.count));
        let namespace = src.namespace.clone().unwrap_or_else(|| "default".into());
        let true_need = self
            .arrivals
            .iter()
            .find(|a| a.group == src.name)
            .and_then(|a| a.true_need);
        for k in 0..b.count {
            let name = format!("{}-b{i}-{k}", src.name);
            self.arrivals.push(Arrival {
                at,
                job: training_job(&name, &namespace, &src.spec, &format!("jobs[{j}]"))?,
                duration: src.duration.0,
                true_need,
                group: src.name.clone(),
            });
        }
        Ok(())
    }
}

/// A job entry's truth when it states one: a factor or bytes per GPU, not
/// both; None: drawn from the scenario's spread or residuals.
fn true_need(path: &str, j: &JobFile) -> Result<Option<TrueNeed>, ScenarioError> {
    match (j.factor, &j.true_bytes_per_gpu) {
        (Some(_), Some(_)) => Err(field(
            format!("{path}.factor"),
            "give factor or trueBytesPerGpu, not both",
        )),
        (Some(f), None) => {
            if !(f.is_finite() && f > 0.0 && f <= 100.0) {
                return Err(field(
                    format!("{path}.factor"),
                    format!("{f} is out of range; 0 < factor <= 100"),
                ));
            }
            Ok(Some(TrueNeed::Factor(f)))
        }
        (None, Some(b)) => {
            if b.bytes() == 0 {
                return Err(field(format!("{path}.trueBytesPerGpu"), "0 is not allowed"));
            }
            Ok(Some(TrueNeed::BytesPerGpu(b.bytes())))
        }
        (None, None) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::scenario::parse_secs;

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
