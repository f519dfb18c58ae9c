//! The human-readable table of `estimate`.

use std::io::{self, Write};

use super::paint::Paint;
use super::report::JobReport;
use crate::api::EstimateStatus;
use crate::estimate::{GIB, breakdown_entries};
use crate::plan::PlaceOutcome;

fn g(bytes: u64) -> String {
    format!("{:>8.2}", bytes as f64 / GIB)
}

/// Print every report as a table (the title, verdicts and plans coloured when `paint` is on).
pub fn table(reports: &[JobReport], paint: Paint, out: &mut dyn Write) -> io::Result<()> {
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let title = r.name.as_deref().unwrap_or("job");
        writeln!(out, "{}: {}", paint.bold(title), describe(r))?;
        if let Some(f) = &r.read_from {
            writeln!(out, "  {} read from {}:", f.kind, f.origin)?;
            for s in &f.sources {
                writeln!(out, "    {:<32}{}", s.field, s.from)?;
            }
            if !f.products.is_empty() {
                writeln!(
                    out,
                    "    {:<32}{}",
                    "GPU product (node selector)",
                    f.products.join(", ")
                )?;
            }
        }
        estimate_block(&r.estimate, out)?;
        writeln!(out, "  {}", r.explanation.summary)?;
        if let Some(i) = &r.explanation.interval {
            writeln!(out, "  {i}")?;
        }
        verdicts(r, paint, out)?;
    }
    Ok(())
}

/// The components, the three totals with their range, and the largest tensor.
pub fn estimate_block(e: &EstimateStatus, out: &mut dyn Write) -> io::Result<()> {
    {
        writeln!(out, "  {:<22}{:>8}", "component", "GiB")?;
        for (name, bytes) in breakdown_entries(&e.breakdown) {
            writeln!(out, "  {name:<22}{}", g(bytes))?;
        }
        let u = e.upper.unwrap_or_default();
        let l = e.lower.unwrap_or_default();
        let totals = [
            (
                "peak allocated",
                e.peak_allocated_bytes,
                l.peak_allocated_bytes,
                u.peak_allocated_bytes,
                "torch.cuda.max_memory_allocated",
            ),
            (
                "peak reserved",
                e.peak_reserved_bytes,
                l.peak_reserved_bytes,
                u.peak_reserved_bytes,
                "torch.cuda.max_memory_reserved",
            ),
            (
                "per GPU",
                e.per_gpu_bytes,
                l.per_gpu_bytes,
                u.per_gpu_bytes,
                "nvidia-smi, per GPU",
            ),
        ];
        for (name, point, lower, upper, what) in totals {
            // The range: what the estimator does not know, mechanism by mechanism.
            let range = if upper > point || (lower < point && e.lower.is_some()) {
                format!(
                    " ({:.2} – {:.2})",
                    lower.min(point) as f64 / GIB,
                    upper.max(point) as f64 / GIB
                )
            } else {
                String::new()
            };
            writeln!(out, "  {name:<22}{}{range}   ({what})", g(point))?;
        }
        writeln!(
            out,
            "  {:<22}{}",
            "largest tensor",
            g(e.largest_tensor_bytes)
        )?;
    }
    Ok(())
}

fn verdicts(r: &JobReport, paint: Paint, out: &mut dyn Write) -> io::Result<()> {
    {
        writeln!(
            out,
            "  {:<18}{:>12}{:>16}  verdict",
            "GPU", "usable GiB", "need (+margin)"
        )?;
        for v in &r.verdicts {
            writeln!(
                out,
                "  {:<18}{:>12}{:>16}  {}",
                v.gpu,
                format!("{:.1}", v.usable_bytes as f64 / GIB),
                format!("{:.1}", v.verdict.need_bytes as f64 / GIB),
                if v.verdict.fits {
                    paint.good(&v.message)
                } else {
                    paint.bad(&v.message)
                }
            )?;
        }
        for v in &r.verdicts {
            if let Some(p) = &v.plan {
                writeln!(
                    out,
                    "  {} {}: {}",
                    paint.note("plan on"),
                    v.gpu,
                    p.summary()
                )?;
            } else if let Some(a) = &v.advice {
                writeln!(out, "  {}: {}", v.gpu, a.message)?;
            }
        }
        if let Some(p) = &r.placement {
            match &r.placed_with {
                Some(plan) => writeln!(
                    out,
                    "  placement: {} with {}",
                    placement(p),
                    plan.changes.join(", ")
                )?,
                None => writeln!(out, "  placement: {}", placement(p))?,
            }
        }
    }
    Ok(())
}

fn placement(p: &PlaceOutcome) -> String {
    match p {
        PlaceOutcome::Placed(a) => {
            let nodes: Vec<String> = a
                .nodes
                .iter()
                .map(|n| {
                    let gpus: Vec<String> = n
                        .gpus
                        .iter()
                        .map(|g| match (&g.mig_index, &g.mig_profile) {
                            (Some(m), Some(profile)) => format!("{}/MIG {m} {profile}", g.index),
                            _ => g.index.to_string(),
                        })
                        .collect();
                    format!("{} GPU {}", n.node, gpus.join(","))
                })
                .collect();
            format!(
                "{} ({:.1} GiB headroom left)",
                nodes.join("; "),
                a.headroom_bytes as f64 / GIB
            )
        }
        PlaceOutcome::Wait { reason } => format!("wait: {reason}"),
        PlaceOutcome::Reject { reason } => format!("none: {reason}"),
    }
}

fn describe(r: &JobReport) -> String {
    let Some(job) = &r.job else {
        return r.model.clone();
    };
    let t = &job.spec().training;
    let p = &job.spec().parallelism;
    let json = |v: &dyn erased::Name| v.name();
    let mut parts = vec![
        r.model.clone(),
        json(&t.mode),
        json(&t.precision),
        match job.model {
            crate::api::ResolvedModel::Transformer(_) => format!(
                "micro-batch {} × {} tokens",
                t.micro_batch_size,
                t.seq_len()
            ),
            _ => format!("micro-batch {}", t.micro_batch_size),
        },
    ];
    if let Some(l) = &job.lora {
        parts[1] = format!("{} r{}", parts[1], l.rank);
    }
    let gpus = if p.gpus == 1 {
        "1 GPU".to_string()
    } else {
        format!("{} GPUs, ZeRO {}", p.gpus, p.zero())
    };
    parts.push(gpus);
    parts.join(" · ")
}

mod erased {
    /// The YAML spelling of an enum value.
    pub trait Name {
        fn name(&self) -> String;
    }

    impl<T: serde::Serialize> Name for T {
        fn name(&self) -> String {
            serde_json::to_value(self)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        }
    }
}
