//! GPU products and per-architecture overheads. Pure data; every number says where it comes from.
//!
//! `total_bytes` is the `memory.total` that nvidia-smi / NVML reports with a current (R525 or
//! later) datacenter driver. Two things to keep in mind when comparing it with an estimate:
//!
//! - It still contains memory the driver keeps for itself. What CUDA reports as the device total
//!   (`cudaMemGetInfo`, `totalGlobalMem`) is a few hundred MiB lower: A100-SXM4-40GB 40960 MiB in
//!   nvidia-smi vs 42298834944 bytes (40339 MiB) in deviceQuery (bottlerocket-os/bottlerocket#3873);
//!   H100 80GB HBM3 81559 MiB vs 85045477376 bytes (81106 MiB) in deviceQuery
//!   (thamada/nvidia-smi, nvsim/H100SXMx8_deviceQuery.py); RTX 6000 Ada 49140 MiB vs
//!   50865307648 bytes (48509 MiB) from `torch.cuda.mem_get_info` (unslothai/unsloth-zoo#1053).
//! - Older drivers reported a smaller `memory.total` for the same HBM card, with the reserved part
//!   already taken out: V100-SXM2-16GB 16160 MiB on driver 440 vs 16384 MiB on driver 570,
//!   A100-SXM4-40GB 40536 MiB on driver 470 vs 40960 MiB on driver 580. The sources are on each
//!   entry below.

/// One mebibyte.
const MIB: u64 = 1024 * 1024;

/// GPU architecture generation (decides CUDA context size and library workspaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Architecture {
    /// sm_70 (V100).
    Volta,
    /// sm_75 (T4).
    Turing,
    /// sm_80 / sm_86 (A100, A10, A10G, RTX 3090).
    Ampere,
    /// sm_89 (L4, L40S, RTX 4090, RTX 6000 Ada).
    Ada,
    /// sm_90 (H100, H200).
    Hopper,
    /// sm_100 / sm_120 (B200, RTX 5090).
    Blackwell,
}

impl Architecture {
    /// Every architecture, oldest first.
    pub const ALL: [Architecture; 6] = [
        Architecture::Volta,
        Architecture::Turing,
        Architecture::Ampere,
        Architecture::Ada,
        Architecture::Hopper,
        Architecture::Blackwell,
    ];

    /// Lowercase name, e.g. "hopper".
    pub fn as_str(self) -> &'static str {
        match self {
            Architecture::Volta => "volta",
            Architecture::Turing => "turing",
            Architecture::Ampere => "ampere",
            Architecture::Ada => "ada",
            Architecture::Hopper => "hopper",
            Architecture::Blackwell => "blackwell",
        }
    }
}

/// Per-process overheads on one architecture (bytes).
#[derive(Clone, Copy, Debug)]
pub struct ArchOverheads {
    pub architecture: Architecture,
    /// CUDA context (driver + runtime + loaded PyTorch kernels/modules with lazy loading) per process, as nvidia-smi shows it before any tensor.
    pub cuda_context_bytes: u64,
    /// cuBLAS(Lt) workspace PyTorch allocates per stream/handle through the caching allocator.
    pub cublas_workspace_bytes: u64,
    /// cuDNN workspace typical of conv nets.
    pub cudnn_workspace_bytes: u64,
}

/// cuBLAS workspace PyTorch allocates per (handle, stream) when CUBLAS_WORKSPACE_CONFIG is unset,
/// on GPUs below compute capability 9: ":4096:2:16:8", i.e. 4096 KiB x 2 + 16 KiB x 8 = 8.125 MiB.
// source: pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize():
// `default_size = ... : 4096 * 1024 * 2 + 16 * 1024 * 8` ("/* :4096:2:16:8 default, 32MiB for
// Hopper */"). The buffer comes from the caching allocator (getNewWorkspace / allocateCUDABlasWorkspace).
// cuBLASLt shares this buffer by default (TORCH_CUBLASLT_UNIFIED_WORKSPACE, its own default is
// 1024 KiB per pytorch/pytorch#73328), so it adds nothing on top.
const CUBLAS_WORKSPACE_DEFAULT: u64 = 4096 * 1024 * 2 + 16 * 1024 * 8;

/// cuBLAS workspace PyTorch allocates per (handle, stream) on compute capability 9.x and later:
/// 4096 KiB x 8 = 32 MiB.
// source: pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize():
// `sm90 ? 4096 * 8 * 1024 : ...` (PyTorch 2.x); on current main the same 32 MiB applies to
// `properties->major == 9 || 10 || 11 || 12` ("/* :4096:2:16:8 default, 32MiB for Hopper and
// Blackwell */", seen in the cyyever/pytorch mirror of main). Releases that only test sm90 give
// Blackwell the 8.125 MiB default; 32 MiB is the larger of the two.
const CUBLAS_WORKSPACE_SM90_PLUS: u64 = 4096 * 8 * 1024;

/// cuDNN convolution workspace a conv net typically ends up with. Measured typical value, not a
/// spec: PyTorch does not cap it (it takes the first algorithm whose workspace fits in free
/// memory), so a single layer can ask for GiBs.
// source: pytorch/pytorch#49207 (PyTorch tries algorithms in cuDNN heuristic order and keeps the
// first that fits; no workspace limit). sonots/cumo#502 measured ResNet-18 convolutions: fp16/bf16
// reach the tensor-core algorithms at a 128 MB workspace ceiling, 256 MB gives nothing more on the
// ResNet pass. LBANN/lbann#437: the Winograd algorithm for ResNet-50 res2a_branch2b needs 256 KiB.
const CUDNN_WORKSPACE_TYPICAL: u64 = 128 * MIB;

/// Per-architecture overheads. The CUDA context sizes are measured typical values (CUDA >= 11.7
/// with lazy module loading, which PyTorch turns on by default since 1.13, pytorch/pytorch#86509),
/// rounded up to leave room for the kernels a training step loads lazily after the first op; they
/// vary with driver, CUDA and PyTorch version.
pub const ARCH_OVERHEADS: &[ArchOverheads] = &[
    ArchOverheads {
        architecture: Architecture::Volta,
        // source: pytorch/pytorch#20532 (p3.8xlarge, V100): "any process that use cuda consume at
        // initializing step around 300MB to 400MB" (before lazy loading); pytorch/pytorch#107667
        // (ptrblck): "~300MB" with lazy loading. Measured typical value.
        cuda_context_bytes: 384 * MIB,
        cublas_workspace_bytes: CUBLAS_WORKSPACE_DEFAULT,
        cudnn_workspace_bytes: CUDNN_WORKSPACE_TYPICAL,
    },
    ArchOverheads {
        architecture: Architecture::Turing,
        // source: no Turing-specific measurement found; same order as the ~300 MB lazy-loading
        // context of pytorch/pytorch#107667 and the 287,047,680 bytes (274 MiB) after one small
        // tensor in pytorch/pytorch#86509. Estimate.
        cuda_context_bytes: 384 * MIB,
        cublas_workspace_bytes: CUBLAS_WORKSPACE_DEFAULT,
        cudnn_workspace_bytes: CUDNN_WORKSPACE_TYPICAL,
    },
    ArchOverheads {
        architecture: Architecture::Ampere,
        // source: invoke-ai/InvokeAI#9413: bare context 256 MiB on RTX 3090 (torch 2.7.1+cu128)
        // before any kernel; pytorch/pytorch#109888 (ptrblck): "around 400MB if CUDA >= 11.7 is
        // used and lazy module loading enabled" after the first CUDA op. Measured typical value
        // plus room for lazily loaded training kernels.
        cuda_context_bytes: 512 * MIB,
        cublas_workspace_bytes: CUBLAS_WORKSPACE_DEFAULT,
        cudnn_workspace_bytes: CUDNN_WORKSPACE_TYPICAL,
    },
    ArchOverheads {
        architecture: Architecture::Ada,
        // source: unslothai/unsloth-zoo#1053: `torch.cuda.mem_get_info(0)` alone shows 426 MiB in
        // nvidia-smi on an RTX 6000 Ada (PyTorch 2.10.0+cu130), before any kernel. Measured
        // typical value plus room for lazily loaded training kernels.
        cuda_context_bytes: 512 * MIB,
        cublas_workspace_bytes: CUBLAS_WORKSPACE_DEFAULT,
        cudnn_workspace_bytes: CUDNN_WORKSPACE_TYPICAL,
    },
    ArchOverheads {
        architecture: Architecture::Hopper,
        // source: measured on an H200 (driver 580.159.04, PyTorch 2.11.0+cu130, lazy module
        // loading) by benches/gpu_reference.py, gpu_truth.py and gpu_mechanisms.py: nvidia-smi's
        // per-process memory minus `torch.cuda.memory_reserved()` after a training step is
        // 742-770 MiB over 117 runs (transformers, CNNs; median 758 MiB); 612 MiB after the first
        // tensor, before any library kernel is loaded (benches/ground-truth).
        cuda_context_bytes: 758 * MIB,
        cublas_workspace_bytes: CUBLAS_WORKSPACE_SM90_PLUS,
        cudnn_workspace_bytes: CUDNN_WORKSPACE_TYPICAL,
    },
    ArchOverheads {
        architecture: Architecture::Blackwell,
        // source: no public B200 / RTX 5090 measurement found; B200 has 148 SMs (pytorch/ao#4002
        // device query), so this is the (measured) Hopper value plus 64 MiB. Estimate.
        cuda_context_bytes: 822 * MIB,
        cublas_workspace_bytes: CUBLAS_WORKSPACE_SM90_PLUS,
        cudnn_workspace_bytes: CUDNN_WORKSPACE_TYPICAL,
    },
];

/// One GPU product a user can name with `--gpu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuProduct {
    /// Name for `--gpu`, lowercase kebab-case, e.g. "h100-80gb".
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3" (what NVML reports as the product name where
    /// known).
    pub product: &'static str,
    pub architecture: Architecture,
    /// Total memory NVML reports (memory.total) in bytes, below the marketing size (ECC, reserved).
    /// See the module documentation for how it relates to what CUDA can allocate.
    pub total_bytes: u64,
    /// True for a MIG slice rather than a whole card.
    pub mig: bool,
}

/// Known GPU products. MIG slices named `mig-*` are the A100-80GB ones: each is smaller than the
/// H100-80GB slice of the same name, so it is the safe reading of a bare profile name; the H100
/// slices are `h100-mig-*`. MIG sizes are `nvidia-smi mig -lgip` GiB x 1024.
pub const GPUS: &[GpuProduct] = &[
    // --- Hopper ---
    GpuProduct {
        name: "h100-80gb",
        aliases: &["h100", "h100-sxm", "h100-sxm5", "h100-80gb-hbm3"],
        product: "NVIDIA H100 80GB HBM3",
        architecture: Architecture::Hopper,
        // source: "0MiB /  81559MiB" in NVIDIA/nccl#1264 and wilicc/gpu-burn#114 (driver 550);
        // "H100: 81559MiB" in modal-labs/modal-client#2797.
        total_bytes: 81_559 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "h100-pcie",
        aliases: &["h100-pcie-80gb"],
        product: "NVIDIA H100 PCIe",
        architecture: Architecture::Hopper,
        // source: "NVIDIA H100 PCIe ... 0MiB /  81559MiB" (350 W) in several public nvidia-smi
        // logs on GitHub; no single issue thread to cite.
        total_bytes: 81_559 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "h100-nvl",
        aliases: &["h100-nvl-94gb", "h100-94gb"],
        product: "NVIDIA H100 NVL",
        architecture: Architecture::Hopper,
        // source: "NVIDIA H100 NVL ... 0MiB / 95830MiB" in NVIDIA/gpu-admin-tools#4 (driver 535).
        total_bytes: 95_830 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "h200",
        aliases: &["h200-141gb", "h200-sxm"],
        product: "NVIDIA H200",
        architecture: Architecture::Hopper,
        // source: "NVIDIA H200 ... 0MiB / 143771MiB" (700 W) in several public nvidia-smi logs on
        // GitHub; no single issue thread to cite. Product name "NVIDIA H200" per
        // NVIDIA/mig-parted#120.
        total_bytes: 143_771 * MIB,
        mig: false,
    },
    // --- Blackwell ---
    GpuProduct {
        name: "b200",
        aliases: &["b200-180gb"],
        product: "NVIDIA B200",
        architecture: Architecture::Blackwell,
        // source: "NVIDIA B200 ... 166593MiB / 183359MiB" in NVIDIA/TensorRT-LLM#10278 (driver
        // 580.95.05).
        total_bytes: 183_359 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "rtx-5090",
        aliases: &["5090", "geforce-rtx-5090"],
        product: "NVIDIA GeForce RTX 5090",
        architecture: Architecture::Blackwell,
        // source: "NVIDIA GeForce RTX 5090 ... 29024MiB /  32607MiB" in
        // noonghunna/club-3090#1261.
        total_bytes: 32_607 * MIB,
        mig: false,
    },
    // --- Ampere ---
    GpuProduct {
        name: "a100-80gb",
        aliases: &["a100-sxm4-80gb", "a100-80gb-sxm"],
        product: "NVIDIA A100-SXM4-80GB",
        architecture: Architecture::Ampere,
        // source: "NVIDIA A100-SXM4-80GB ... 87MiB / 81920MiB" in NVIDIA/mig-parted#31 (driver
        // 545); "A100 80GB: 81920MiB" in modal-labs/modal-client#2797.
        total_bytes: 81_920 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "a100-40gb",
        aliases: &["a100-sxm4-40gb", "a100-40gb-sxm"],
        product: "NVIDIA A100-SXM4-40GB",
        architecture: Architecture::Ampere,
        // source: "NVIDIA A100-SXM4-40GB ... 598MiB /  40960MiB" in
        // bottlerocket-os/bottlerocket-core-kit#834 (driver 580); "A100 40GB: 40960MiB" in
        // modal-labs/modal-client#2797. Driver 470 showed 40536MiB (nanopool/phoenix-miner#17).
        total_bytes: 40_960 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "a10g",
        aliases: &["nvidia-a10g"],
        product: "NVIDIA A10G",
        architecture: Architecture::Ampere,
        // source: "NVIDIA A10G ... 8722MiB / 23028MiB" in NVIDIA/DCGM#232 (driver 535).
        total_bytes: 23_028 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "a10",
        aliases: &["nvidia-a10"],
        product: "NVIDIA A10",
        architecture: Architecture::Ampere,
        // source: NVML memoryInfo "Total":24146608128 (= 23028 MiB) for "NVIDIA A10" in
        // mayooot/detect-gpu#3 (driver 535); "A10: 23028MiB" in modal-labs/modal-client#2797.
        total_bytes: 23_028 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "rtx-3090",
        aliases: &["3090", "geforce-rtx-3090"],
        product: "NVIDIA GeForce RTX 3090",
        architecture: Architecture::Ampere,
        // source: "NVIDIA GeForce RTX 3090 ... 22598MiB /  24576MiB" in noonghunna/club-3090#1128
        // (driver 595). Driver 455 showed 24268MiB (pytorch/pytorch#54564).
        total_bytes: 24_576 * MIB,
        mig: false,
    },
    // --- Ada ---
    GpuProduct {
        name: "l4",
        aliases: &["nvidia-l4"],
        product: "NVIDIA L4",
        architecture: Architecture::Ada,
        // source: "L4: 23034MiB" in modal-labs/modal-client#2797.
        total_bytes: 23_034 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "l40s",
        aliases: &["nvidia-l40s"],
        product: "NVIDIA L40S",
        architecture: Architecture::Ada,
        // source: "L40S: 46068MiB" in modal-labs/modal-client#2797.
        total_bytes: 46_068 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "rtx-4090",
        aliases: &["4090", "geforce-rtx-4090"],
        product: "NVIDIA GeForce RTX 4090",
        architecture: Architecture::Ada,
        // source: "NVIDIA GeForce RTX 4090 ... 507MiB /  24564MiB" in RLinf/RLinf#255 (driver 550).
        total_bytes: 24_564 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "rtx-6000-ada",
        aliases: &["rtx6000-ada", "rtx-6000-ada-generation"],
        product: "NVIDIA RTX 6000 Ada Generation",
        architecture: Architecture::Ada,
        // source: "NVIDIA RTX 6000 Ada Gene... ... 12MiB /  49140MiB" in public nvidia-smi logs on
        // GitHub; no single issue thread to cite. CUDA sees 50865307648 bytes
        // (unslothai/unsloth-zoo#1053).
        total_bytes: 49_140 * MIB,
        mig: false,
    },
    // --- Turing ---
    GpuProduct {
        name: "t4",
        aliases: &["tesla-t4"],
        product: "Tesla T4",
        architecture: Architecture::Turing,
        // source: "T4: 15360MiB" in modal-labs/modal-client#2797.
        total_bytes: 15_360 * MIB,
        mig: false,
    },
    // --- Volta ---
    GpuProduct {
        name: "v100-16gb",
        aliases: &["v100", "v100-sxm2-16gb", "tesla-v100-16gb"],
        product: "Tesla V100-SXM2-16GB",
        architecture: Architecture::Volta,
        // source: "Tesla V100-SXM2-16GB ... 5MiB /  16384MiB" in 1CatAI/1Cat-vLLM#85 (driver 570).
        // Older drivers show 16160MiB (4paradigm/k8s-vgpu-scheduler#7, driver 440).
        total_bytes: 16_384 * MIB,
        mig: false,
    },
    GpuProduct {
        name: "v100-32gb",
        aliases: &["v100-sxm2-32gb", "tesla-v100-32gb"],
        product: "Tesla V100-SXM2-32GB",
        architecture: Architecture::Volta,
        // source: "Tesla V100-SXM2... ... 308MiB / 32768MiB" in Wan-Video/Wan2.1#5 (driver 525).
        // Older drivers show 32510MiB (public nvidia-smi logs on GitHub).
        total_bytes: 32_768 * MIB,
        mig: false,
    },
    // --- MIG slices of A100-SXM4-80GB (Ampere) ---
    GpuProduct {
        name: "mig-1g.10gb",
        aliases: &["a100-mig-1g.10gb", "1g.10gb"],
        product: "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        architecture: Architecture::Ampere,
        // source: `nvidia-smi mig -lgip` on A100-SXM4-80GB lists "MIG 1g.10gb ... 9.50" GiB;
        // arcs-njit-edu.github.io/Docs/MIG/profile-comparison: "Usable Memory ~9.5 GB" for the
        // A100 80GB 10gb profile.
        total_bytes: 9_728 * MIB,
        mig: true,
    },
    GpuProduct {
        name: "mig-2g.20gb",
        aliases: &["a100-mig-2g.20gb", "2g.20gb"],
        product: "NVIDIA A100-SXM4-80GB MIG 2g.20gb",
        architecture: Architecture::Ampere,
        // source: MIG devices with 28 SMs showing "14366MiB / 19968MiB" in XuehaiPan/nvitop#8
        // (= 19.50 GiB, the lgip value).
        total_bytes: 19_968 * MIB,
        mig: true,
    },
    GpuProduct {
        name: "mig-3g.40gb",
        aliases: &["a100-mig-3g.40gb", "3g.40gb"],
        product: "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        architecture: Architecture::Ampere,
        // source: `nvidia-smi mig -lgip` on A100-SXM4-80GB lists "MIG 3g.40gb ... 39.25" GiB;
        // drivers 535/545 even name the slice "3g.39gb" (NVIDIA/mig-parted#31).
        total_bytes: 40_192 * MIB,
        mig: true,
    },
    GpuProduct {
        name: "mig-7g.80gb",
        aliases: &["a100-mig-7g.80gb", "7g.80gb"],
        product: "NVIDIA A100-SXM4-80GB MIG 7g.80gb",
        architecture: Architecture::Ampere,
        // source: `nvidia-smi mig -lgip` on A100-SXM4-80GB lists "MIG 7g.80gb ... 79.00" GiB;
        // some drivers name the slice "7g.79gb" (nebuly-ai/nos#51).
        total_bytes: 80_896 * MIB,
        mig: true,
    },
    // --- MIG slices of H100 80GB HBM3 (Hopper) ---
    GpuProduct {
        name: "h100-mig-1g.10gb",
        aliases: &[],
        product: "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        architecture: Architecture::Hopper,
        // source: `nvidia-smi mig -lgip` on H100 "MIG 1g.10gb 19 7/7 9.75" GiB in
        // jbarrow.ai/field_notes/nvidia-mig/.
        total_bytes: 9_984 * MIB,
        mig: true,
    },
    GpuProduct {
        name: "h100-mig-2g.20gb",
        aliases: &[],
        product: "NVIDIA H100 80GB HBM3 MIG 2g.20gb",
        architecture: Architecture::Hopper,
        // source: `nvidia-smi mig -lgip` on H100 "MIG 2g.20gb 14 3/3 19.62" GiB in
        // jbarrow.ai/field_notes/nvidia-mig/ (19.625 GiB).
        total_bytes: 20_096 * MIB,
        mig: true,
    },
    GpuProduct {
        name: "h100-mig-3g.40gb",
        aliases: &[],
        product: "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        architecture: Architecture::Hopper,
        // source: `nvidia-smi mig -lgip` on H100 "MIG 3g.40gb 9 2/2 39.50" GiB in
        // jbarrow.ai/field_notes/nvidia-mig/.
        total_bytes: 40_448 * MIB,
        mig: true,
    },
    GpuProduct {
        name: "h100-mig-7g.80gb",
        aliases: &[],
        product: "NVIDIA H100 80GB HBM3 MIG 7g.80gb",
        architecture: Architecture::Hopper,
        // source: `nvidia-smi mig -lgip` on H100 "MIG 7g.80gb 0 1/1 79.25" GiB in
        // jbarrow.ai/field_notes/nvidia-mig/.
        total_bytes: 81_152 * MIB,
        mig: true,
    },
];

/// Memory the driver keeps out of what CUDA can allocate on a whole card: the
/// gap between nvidia-smi's `memory.total` and CUDA's device total, 453 MiB on
/// H100 80GB, 621 MiB on A100-SXM4-40GB, 631 MiB on RTX 6000 Ada (sources in
/// the module documentation); the largest seen, rounded up.
pub const DRIVER_RESERVE_BYTES: u64 = 640 * MIB;

impl GpuProduct {
    /// Bytes a process can actually use: `memory.total` less the driver's
    /// reserve (a MIG slice's reported size is already what it offers).
    pub fn usable_bytes(&self) -> u64 {
        if self.mig {
            self.total_bytes
        } else {
            self.total_bytes.saturating_sub(DRIVER_RESERVE_BYTES)
        }
    }
}

/// Looks a product up by name or alias, ignoring ASCII case and surrounding whitespace.
pub fn find(name: &str) -> Option<&'static GpuProduct> {
    let name = name.trim();
    GPUS.iter().find(|gpu| {
        gpu.name.eq_ignore_ascii_case(name)
            || gpu
                .aliases
                .iter()
                .any(|alias| alias.eq_ignore_ascii_case(name))
    })
}

/// The whole-card products a name that is not one of ours could mean: `a100` is
/// `a100-80gb` or `a100-40gb`, whose memory differs by half. Empty when none.
pub fn candidates(name: &str) -> Vec<&'static str> {
    let name = name.trim().to_ascii_lowercase();
    if name.is_empty() {
        return Vec::new();
    }
    GPUS.iter()
        .filter(|gpu| !gpu.mig)
        .filter(|gpu| {
            std::iter::once(&gpu.name)
                .chain(gpu.aliases)
                .any(|n| n.starts_with(&format!("{name}-")))
        })
        .map(|gpu| gpu.name)
        .collect()
}

/// The `--gpu` names, in catalog order (aliases not included).
pub fn names() -> impl Iterator<Item = &'static str> {
    GPUS.iter().map(|gpu| gpu.name)
}

/// The overheads of one architecture.
pub fn overheads(a: Architecture) -> &'static ArchOverheads {
    ARCH_OVERHEADS
        .iter()
        .find(|o| o.architecture == a)
        .expect("ARCH_OVERHEADS has an entry for every Architecture")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_and_aliases_are_unique_ignoring_case() {
        let mut seen = HashSet::new();
        for gpu in GPUS {
            for key in std::iter::once(&gpu.name).chain(gpu.aliases.iter()) {
                assert!(
                    seen.insert(key.to_ascii_lowercase()),
                    "duplicate GPU name or alias: {key}"
                );
            }
        }
    }

    #[test]
    fn names_are_lowercase_kebab_case() {
        for gpu in GPUS {
            assert!(
                gpu.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
                "{} is not lowercase kebab-case",
                gpu.name
            );
        }
    }

    #[test]
    fn every_product_has_memory() {
        for gpu in GPUS {
            assert!(gpu.total_bytes > 0, "{} has no memory", gpu.name);
            assert!(!gpu.product.is_empty(), "{} has no product name", gpu.name);
        }
    }

    #[test]
    fn mig_slices_are_smaller_than_their_card() {
        let a100 = find("a100-80gb").unwrap();
        let h100 = find("h100-80gb").unwrap();
        for gpu in GPUS.iter().filter(|g| g.mig) {
            let card = if gpu.architecture == Architecture::Hopper {
                h100
            } else {
                a100
            };
            assert!(gpu.total_bytes < card.total_bytes, "{}", gpu.name);
        }
    }

    #[test]
    fn every_architecture_has_overheads() {
        for a in Architecture::ALL {
            assert_eq!(overheads(a).architecture, a);
        }
        for gpu in GPUS {
            assert!(
                ARCH_OVERHEADS
                    .iter()
                    .any(|o| o.architecture == gpu.architecture),
                "{} uses {} which has no ARCH_OVERHEADS entry",
                gpu.name,
                gpu.architecture.as_str()
            );
        }
        let mut archs = HashSet::new();
        for o in ARCH_OVERHEADS {
            assert!(
                archs.insert(o.architecture),
                "{:?} listed twice",
                o.architecture
            );
        }
    }

    #[test]
    fn cublas_workspace_matches_pytorch_defaults() {
        assert_eq!(
            overheads(Architecture::Ampere).cublas_workspace_bytes,
            8_519_680
        );
        assert_eq!(
            overheads(Architecture::Hopper).cublas_workspace_bytes,
            32 * MIB
        );
    }

    #[test]
    fn find_is_case_insensitive() {
        assert_eq!(find("H100").unwrap().name, "h100-80gb");
        assert_eq!(find("h100-SXM").unwrap().name, "h100-80gb");
        assert_eq!(find(" A100-80GB ").unwrap().name, "a100-80gb");
        // Two cards of different memory: not one of them silently.
        assert!(find("a100").is_none());
        assert_eq!(candidates(" A100 "), ["a100-80gb", "a100-40gb"]);
        assert!(candidates("h900").is_empty());
        assert_eq!(find("MIG-1G.10GB").unwrap().name, "mig-1g.10gb");
        assert!(find("h100-mig-1g.10gb").unwrap().mig);
        assert!(find("no-such-gpu").is_none());
        assert!(find("").is_none());
    }

    #[test]
    fn catalog_is_large_enough() {
        assert!(GPUS.len() >= 20);
        assert_eq!(names().count(), GPUS.len());
    }

    #[test]
    fn architecture_names() {
        assert_eq!(Architecture::Hopper.as_str(), "hopper");
        let names: HashSet<_> = Architecture::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(names.len(), Architecture::ALL.len());
    }
}
