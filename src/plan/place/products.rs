//! Which architecture a probed GPU is: the estimate depends on the GPU only
//! through it (CUDA context and library workspaces). Pure lookups.

use crate::api::GpuStatus;
use crate::estimate::GpuProduct;
use crate::estimate::gpus::{self, Architecture};

/// The architecture of a probed GPU: its `architecture` field, else its
/// product name looked up in the catalog, else recognised by family.
pub fn architecture_of(gpu: &GpuStatus) -> Option<Architecture> {
    if let Some(a) = &gpu.architecture
        && let Some(arch) = Architecture::ALL
            .iter()
            .find(|x| x.as_str().eq_ignore_ascii_case(a.trim()))
    {
        return Some(*arch);
    }
    let product = gpu.product.trim();
    if let Some(p) = gpus::GPUS
        .iter()
        .find(|p| p.product.eq_ignore_ascii_case(product))
        .or_else(|| gpus::find(product))
    {
        return Some(p.architecture);
    }
    let upper = product.to_ascii_uppercase();
    const FAMILIES: &[(&str, Architecture)] = &[
        ("H100", Architecture::Hopper),
        ("H200", Architecture::Hopper),
        ("H800", Architecture::Hopper),
        ("B200", Architecture::Blackwell),
        ("B100", Architecture::Blackwell),
        ("RTX 50", Architecture::Blackwell),
        ("A100", Architecture::Ampere),
        ("A800", Architecture::Ampere),
        ("A10", Architecture::Ampere),
        ("A30", Architecture::Ampere),
        ("A40", Architecture::Ampere),
        ("RTX A", Architecture::Ampere),
        ("RTX 30", Architecture::Ampere),
        ("L40", Architecture::Ada),
        ("L4", Architecture::Ada),
        ("ADA", Architecture::Ada),
        ("RTX 40", Architecture::Ada),
        ("V100", Architecture::Volta),
        ("T4", Architecture::Turing),
        ("RTX 20", Architecture::Turing),
    ];
    FAMILIES
        .iter()
        .find(|(k, _)| upper.contains(k))
        .map(|(_, a)| *a)
}

/// A whole-card catalog product of `arch` (the estimate depends on the GPU only through it).
pub(super) fn representative(arch: Architecture) -> &'static GpuProduct {
    gpus::GPUS
        .iter()
        .find(|g| g.architecture == arch && !g.mig)
        .expect("the catalog has a whole card of every architecture")
}

/// Architecture assumed for a GPU we cannot recognise: the one with the
/// largest per-process overheads, so the need is not underestimated.
pub(super) const UNKNOWN_ARCHITECTURE: Architecture = Architecture::Blackwell;

pub(super) fn arch_slot(a: Architecture) -> usize {
    Architecture::ALL
        .iter()
        .position(|x| *x == a)
        .expect("ALL lists every architecture")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architecture_is_recognised() {
        let mut g = GpuStatus {
            product: "NVIDIA H100 80GB HBM3".into(),
            ..GpuStatus::default()
        };
        assert_eq!(architecture_of(&g), Some(Architecture::Hopper));
        g.product = "NVIDIA A100-SXM4-40GB".into();
        assert_eq!(architecture_of(&g), Some(Architecture::Ampere));
        g.product = "NVIDIA L40S".into();
        assert_eq!(architecture_of(&g), Some(Architecture::Ada));
        g.product = "NVIDIA A100 80GB PCIe".into();
        assert_eq!(architecture_of(&g), Some(Architecture::Ampere));
        g.product = "Mystery GPU".into();
        assert_eq!(architecture_of(&g), None);
        g.architecture = Some("Hopper".into());
        assert_eq!(architecture_of(&g), Some(Architecture::Hopper));
    }
}
