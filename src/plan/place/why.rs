//! The reason of a Wait or Reject, in numbers: what each rank needs, the node
//! that came closest, and the nodes left out and why.

use super::PlaceOutcome;
use super::products::UNKNOWN_ARCHITECTURE;
use crate::api::GpuNode;
use crate::estimate::GIB;

/// Why nodes were left out, for the reason of a Wait or Reject.
#[derive(Default)]
pub(super) struct Tally<'n> {
    pub(super) stale: Vec<&'n str>,
    pub(super) tainted: Vec<(&'n str, String)>,
    /// Tainted only for a condition that clears (`node.kubernetes.io/`): candidates later.
    pub(super) recovering: Vec<&'n str>,
    pub(super) unhealthy_gpus: usize,
    pub(super) mig_gpus: usize,
    pub(super) unknown_gpus: usize,
    /// Eligible nodes (fresh, tolerated).
    pub(super) eligible: usize,
    /// Nodes with every rank's GPU now, and once empty.
    pub(super) candidates: usize,
    pub(super) candidates_empty: usize,
    /// The node with the most fitting devices: (count, node).
    pub(super) best: Option<(usize, &'n str)>,
    /// The non-fitting device closest to fitting: (short by, node, index).
    pub(super) closest: Option<(u64, &'n str, u32)>,
    /// Smallest and largest need (with margin) seen.
    pub(super) need: Option<(u64, u64)>,
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

fn list(names: &[&str]) -> String {
    const SHOWN: usize = 3;
    let mut s = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(", … {} more", names.len() - SHOWN));
    }
    s
}

/// "1 GPU", "8 GPUs".
fn gpus(n: usize) -> String {
    if n == 1 {
        "1 GPU".to_string()
    } else {
        format!("{n} GPUs")
    }
}

/// What placement left out of the cluster and why (`; skipped: …`), and the
/// GPUs of a product it does not know (`; … of unknown product …`).
fn left_out(t: &Tally<'_>) -> (String, String) {
    let mut skipped = Vec::new();
    if !t.stale.is_empty() {
        skipped.push(format!("{} stale ({})", t.stale.len(), list(&t.stale)));
    }
    if !t.tainted.is_empty() {
        let named: Vec<String> = t.tainted.iter().map(|(n, k)| format!("{n}: {k}")).collect();
        let named: Vec<&str> = named.iter().map(String::as_str).collect();
        skipped.push(format!("{} tainted ({})", t.tainted.len(), list(&named)));
    }
    if t.unhealthy_gpus > 0 {
        let n = t.unhealthy_gpus;
        skipped.push(format!(
            "{n} unhealthy GPU{}",
            if n == 1 { "" } else { "s" }
        ));
    }
    if t.mig_gpus > 0 {
        skipped.push(format!(
            "{} split into MIG slices (single-GPU jobs only)",
            gpus(t.mig_gpus)
        ));
    }
    let skipped = if skipped.is_empty() {
        String::new()
    } else {
        format!("; skipped: {}", skipped.join(", "))
    };
    let unknown = if t.unknown_gpus > 0 {
        format!(
            "; {} of unknown product judged as {}",
            gpus(t.unknown_gpus),
            UNKNOWN_ARCHITECTURE.as_str()
        )
    } else {
        String::new()
    };
    (skipped, unknown)
}

/// Wait (when `later` names nodes that would hold the job once empty) or Reject.
pub(super) fn explain(
    t: &Tally<'_>,
    nodes: &[GpuNode],
    later: Option<Vec<usize>>,
    ranks_per_node: usize,
    nodes_needed: u64,
) -> PlaceOutcome {
    let need = match t.need {
        Some((lo, hi)) if gib(lo) == gib(hi) => format!("{} per GPU", gib(hi)),
        Some((lo, hi)) => format!("{}–{} per GPU", gib(lo), gib(hi)),
        None => "an unknown amount per GPU".to_string(),
    };
    let shape = if nodes_needed > 1 {
        format!(
            "{nodes_needed} nodes of {} each ({need})",
            gpus(ranks_per_node)
        )
    } else {
        format!("{} on one node ({need})", gpus(ranks_per_node))
    };
    let (skipped, unknown) = left_out(t);
    let mut now = Vec::new();
    if t.eligible > 0 {
        // A node short of GPUs with room; a node with enough for its ranks
        // leaves the count of such nodes (`room`) to say what is short.
        if let Some((k, node)) = t.best.filter(|b| b.0 > 0 && b.0 < ranks_per_node) {
            now.push(format!(
                "the best, {node}, has room on {k} of the {} a node needs",
                gpus(ranks_per_node)
            ));
        }
        if let Some((short, node, idx)) = t.closest {
            now.push(format!(
                "closest: GPU {idx} on {node}, short by {}",
                gib(short)
            ));
        }
    }
    let now = if now.is_empty() {
        String::new()
    } else {
        format!(": {}", now.join("; "))
    };
    let room = if nodes_needed > 1 {
        format!(" ({} of {nodes_needed} nodes have room)", t.candidates)
    } else {
        String::new()
    };
    match later {
        Some(chosen) => {
            let names: Vec<&str> = chosen
                .iter()
                .map(|&i| nodes[i].spec.node_name.as_str())
                .collect();
            let when = if names.iter().any(|n| t.recovering.contains(n)) {
                "once the node is ready (its node.kubernetes.io/ taint clears) and its GPUs are free"
            } else {
                "once running or admitted jobs free their GPUs"
            };
            PlaceOutcome::Wait {
                reason: format!(
                    "no room now for {shape}{room}{now}; it fits {} {when}{skipped}{unknown}",
                    names.join(", ")
                ),
            }
        }
        None if t.eligible == 0 => PlaceOutcome::Reject {
            reason: format!(
                "no eligible node among {} for {shape}{skipped}",
                nodes.len()
            ),
        },
        None => PlaceOutcome::Reject {
            reason: format!(
                "the cluster cannot hold {shape} even with its GPUs empty ({} of {} nodes eligible{}){now}{skipped}{unknown}",
                t.eligible,
                nodes.len(),
                if nodes_needed > 1 {
                    format!(
                        ", {} of {nodes_needed} could hold their ranks",
                        t.candidates_empty
                    )
                } else {
                    String::new()
                }
            ),
        },
    }
}
