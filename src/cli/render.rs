//! The human-readable table of `estimate`.

use std::io::{self, Write};

use super::estimate::JobReport;
use crate::estimate::{GIB, breakdown_entries};

fn g(bytes: u64) -> String {
    format!("{:>8.2}", bytes as f64 / GIB)
}

/// Print every report as a table.
pub fn table(reports: &[JobReport], out: &mut dyn Write) -> io::Result<()> {
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let title = r.name.as_deref().unwrap_or("job");
        writeln!(out, "{title}: {}", describe(r))?;
        writeln!(out, "  {:<22}{:>8}", "component", "GiB")?;
        for (name, bytes) in breakdown_entries(&r.estimate.breakdown) {
            writeln!(out, "  {name:<22}{}", g(bytes))?;
        }
        let e = &r.estimate;
        writeln!(
            out,
            "  {:<22}{}   (torch.cuda.max_memory_allocated)",
            "peak allocated",
            g(e.peak_allocated_bytes)
        )?;
        writeln!(
            out,
            "  {:<22}{}   (torch.cuda.max_memory_reserved)",
            "peak reserved",
            g(e.peak_reserved_bytes)
        )?;
        writeln!(
            out,
            "  {:<22}{}   (nvidia-smi, per GPU)",
            "per GPU",
            g(e.per_gpu_bytes)
        )?;
        writeln!(
            out,
            "  {:<22}{}",
            "largest tensor",
            g(e.largest_tensor_bytes)
        )?;
        writeln!(out, "  {}", r.explanation.summary)?;
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
                v.message
            )?;
        }
    }
    Ok(())
}

fn describe(r: &JobReport) -> String {
    let Some(job) = &r.job else {
        return r.model.clone();
    };
    let t = &job.spec.training;
    let p = &job.spec.parallelism;
    let json = |v: &dyn erased::Name| v.name();
    let mut parts = vec![
        r.model.clone(),
        json(&t.mode),
        json(&t.precision),
        match job.model {
            crate::api::ResolvedModel::Transformer(_) => format!(
                "micro-batch {} × {} tokens",
                t.micro_batch_size, t.sequence_length
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
        format!("{} GPUs, ZeRO {}", p.gpus, p.zero_stage)
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
