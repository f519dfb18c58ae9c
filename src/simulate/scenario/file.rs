//! The scenario file as written: its fields, their defaults, and durations
//! (`90`, `90s`, `15m`, `2h`, `1d`). Serde reads it; `parse.rs` checks it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::Value;

use crate::agent::bytes::ByteSize;

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
pub(super) struct File {
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) seed: u64,
    #[serde(default = "default_horizon")]
    pub(super) duration: Secs,
    #[serde(default)]
    pub(super) agents: AgentsFile,
    #[serde(default)]
    pub(super) truth: TruthFile,
    #[serde(default)]
    pub(super) sample_every: Option<Secs>,
    pub(super) nodes: Vec<NodeFile>,
    pub(super) jobs: Vec<JobFile>,
    #[serde(default)]
    pub(super) faults: Vec<FaultFile>,
}

fn default_horizon() -> Secs {
    Secs(7.0 * 86_400.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct AgentsFile {
    #[serde(default = "default_interval")]
    pub(super) interval: Secs,
    #[serde(default = "default_ttl")]
    pub(super) ttl: Secs,
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
pub(super) struct TruthFile {
    #[serde(default)]
    pub(super) spread: Option<[f64; 2]>,
    /// Measured / estimated ratios by recipe to draw from instead of `spread`:
    /// `calibration` (the calibration rows' own) or a table of lists.
    #[serde(default)]
    pub(super) residuals: Option<ResidualsFile>,
    #[serde(default = "default_oom_after")]
    pub(super) oom_after: Secs,
    /// From a Job's creation until its pods run (image pull, scheduling).
    #[serde(default)]
    pub(super) start_after: Secs,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ResidualsFile {
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

pub(super) fn default_spread() -> [f64; 2] {
    [0.95, 1.05]
}

fn default_oom_after() -> Secs {
    Secs(120.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct NodeFile {
    pub(super) name: String,
    pub(super) product: String,
    #[serde(default = "eight")]
    pub(super) gpus: u32,
    #[serde(default = "one")]
    pub(super) count: u32,
}

fn eight() -> u32 {
    8
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct JobFile {
    pub(super) name: String,
    #[serde(default)]
    pub(super) namespace: Option<String>,
    #[serde(default)]
    pub(super) at: Secs,
    #[serde(default = "one")]
    pub(super) count: u32,
    #[serde(default)]
    pub(super) every: Secs,
    pub(super) duration: Secs,
    #[serde(default)]
    pub(super) factor: Option<f64>,
    #[serde(default)]
    pub(super) true_bytes_per_gpu: Option<ByteSize>,
    pub(super) spec: Value,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct FaultFile {
    pub(super) at: Secs,
    #[serde(default)]
    pub(super) operator_restart: Option<RestartFile>,
    #[serde(default)]
    pub(super) agent_stops: Option<NodeRef>,
    #[serde(default)]
    pub(super) node_lost: Option<NodeRef>,
    #[serde(default)]
    pub(super) burst: Option<BurstFile>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct RestartFile {
    #[serde(default = "default_down")]
    pub(super) down: Secs,
}

fn default_down() -> Secs {
    Secs(30.0)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct NodeRef {
    pub(super) node: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct BurstFile {
    pub(super) job: String,
    pub(super) count: u32,
}
