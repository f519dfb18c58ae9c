//! Facts of the software a job runs with that narrow the estimate's range:
//! the PyTorch, CUDA and Transformers releases (`spec.training.runtime`, or
//! read from the trainer image's tag), how batches are shaped
//! (`spec.training.batching`), and the caching allocator's settings
//! (`PYTORCH_CUDA_ALLOC_CONF` in the trainer's environment). All optional:
//! what is not known leaves its mechanism's range open (`estimate::bounds`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TrainingJobSpec;
use crate::api::framework::env_var;

/// `spec.training.runtime`: release versions, `MAJOR.MINOR[.PATCH][+local]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeSpec {
    /// PyTorch release, e.g. `2.4.0` (a `+cu121` suffix is read too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pytorch: Option<String>,
    /// CUDA release PyTorch was built with, e.g. `12.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    /// Transformers release, e.g. `4.44.2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformers: Option<String>,
}

/// packed | padded | variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Batching {
    /// Samples concatenated to exactly `sequenceLength` tokens, no padding.
    Packed,
    /// Every batch padded to `sequenceLength`: one shape, with padding.
    Padded,
    /// Padded to the longest sample of each batch: the shape changes from step to step.
    Variable,
}

/// A release as (major, minor).
pub type Version = (u32, u32);

/// Where a runtime fact came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    #[default]
    Unknown,
    Spec,
    /// Read from the trainer container's image tag.
    Image,
}

/// The runtime facts known of a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeFacts {
    pub pytorch: Option<Version>,
    pub cuda: Option<Version>,
    pub transformers: Option<Version>,
    pub pytorch_from: Source,
    pub cuda_from: Source,
    pub transformers_from: Source,
}

impl RuntimeFacts {
    /// Whether CUDA modules load lazily: CUDA 11.7 brought lazy loading and
    /// PyTorch turns it on when `CUDA_MODULE_LOADING` is unset since 1.13.
    /// `None` when either release is unknown.
    pub fn lazy_module_loading(&self) -> Option<bool> {
        match (self.cuda, self.pytorch) {
            (Some(c), Some(p)) => Some(c >= (11, 7) && p >= (1, 13)),
            // CUDA 12.2 and later default to lazy loading whatever the caller.
            (Some(c), None) if c >= (12, 2) => Some(true),
            (Some(c), _) if c < (11, 7) => Some(false),
            (None, Some(p)) if p < (1, 13) => Some(false),
            _ => None,
        }
    }

    /// Whether a Transformers causal-LM's `forward` returns fp32 logits at
    /// train time: through 4.45 the models ran `logits = logits.float()`
    /// before their loss (4.45 warns "Starting from v4.46, the `logits` model
    /// output will have the same type as the model"); 4.46 moved the upcast
    /// into `ForCausalLMLoss` (huggingface/transformers#34147), so the output
    /// keeps the model's dtype. `None` when the release is unknown.
    pub fn transformers_returns_fp32_logits(&self) -> Option<bool> {
        self.transformers.map(|v| v < (4, 46))
    }

    /// Whether the Transformers release copies the shifted logits in its
    /// causal-LM loss (releases before 4.49, `estimate::bounds::logits_extra_bytes`).
    pub fn transformers_shifts_logits(&self) -> Option<bool> {
        self.transformers.map(|v| v < (4, 49))
    }
}

/// The caching allocator's settings from `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorConf {
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
}

/// A user's text in an error: quoted, at most 40 characters.
fn shown(s: &str) -> String {
    let t: String = s.chars().take(40).collect();
    format!("{t:?}")
}

/// `MAJOR.MINOR[.PATCH...][+local|aN|rcN|.devN]` → (major, minor).
pub fn parse_version(s: &str) -> Option<Version> {
    let core = s.trim().trim_start_matches('v');
    let core = core.split(['+', '-']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse::<u32>().ok()?;
    let minor_text = parts.next()?;
    // "4a0" in "2.4.0a0" sits in the patch; a minor is digits only.
    let minor = minor_text.parse::<u32>().ok()?;
    (major < 1000 && minor < 1000).then_some((major, minor))
}

/// Versions read from an image reference's tag, e.g.
/// `pytorch/pytorch:2.4.0-cuda12.1-cudnn9-devel` (PyTorch 2.4, CUDA 12.1),
/// `…:2.1.0-cu121` (CUDA 12.1), `huggingface/transformers-pytorch-gpu:4.41.3`.
fn from_image(image: &str) -> RuntimeFacts {
    let mut f = RuntimeFacts::default();
    // The tag follows the last ':' after the last '/' (a registry port is not a tag).
    let name_end = image.rfind('/').map_or(0, |i| i + 1);
    let Some(colon) = image[name_end..].find(':') else {
        return f;
    };
    let repo = image[..name_end + colon].to_ascii_lowercase();
    let tag = image[name_end + colon + 1..]
        .split('@')
        .next()
        .unwrap_or("");
    let lower = tag.to_ascii_lowercase();
    let first = lower.split('-').next().unwrap_or("");
    if repo.ends_with("pytorch/pytorch") || repo.contains("/pytorch-") || repo.ends_with("/torch") {
        f.pytorch = parse_version(first);
    } else if repo.contains("transformers") {
        f.transformers = parse_version(first);
    }
    for part in lower.split('-') {
        if let Some(v) = part.strip_prefix("cuda").and_then(parse_version) {
            f.cuda = Some(v);
        } else if let Some(digits) = part.strip_prefix("cu")
            && digits.len() >= 3
            && digits.chars().all(|c| c.is_ascii_digit())
        {
            // cu121 → 12.1, cu118 → 11.8
            let (major, minor) = digits.split_at(digits.len() - 1);
            if let (Ok(a), Ok(b)) = (major.parse(), minor.parse()) {
                f.cuda = Some((a, b));
            }
        }
    }
    f.pytorch_from = if f.pytorch.is_some() {
        Source::Image
    } else {
        Source::Unknown
    };
    f.cuda_from = if f.cuda.is_some() {
        Source::Image
    } else {
        Source::Unknown
    };
    f.transformers_from = if f.transformers.is_some() {
        Source::Image
    } else {
        Source::Unknown
    };
    f
}

fn image_of(spec: &TrainingJobSpec) -> Option<&str> {
    spec.template
        .as_ref()?
        .get("spec")?
        .get("containers")?
        .get(0)?
        .get("image")
        .and_then(Value::as_str)
}

/// The runtime facts of a spec (the spec's fields first, the image tag for
/// what they leave out) and the allocator settings, or every field that
/// cannot be read, as (path, reason).
pub fn runtime_of(
    spec: &TrainingJobSpec,
) -> Result<(RuntimeFacts, AllocatorConf), Vec<(String, String)>> {
    let mut errors = Vec::new();
    let mut facts = image_of(spec).map(from_image).unwrap_or_default();
    if let Some(r) = &spec.training.runtime {
        let fields = [
            ("pytorch", &r.pytorch, "2.4.0"),
            ("cuda", &r.cuda, "12.1"),
            ("transformers", &r.transformers, "4.44.2"),
        ];
        for (name, value, example) in fields {
            let Some(text) = value else { continue };
            let Some(v) = parse_version(text) else {
                errors.push((
                    format!("spec.training.runtime.{name}"),
                    format!(
                        "{} is not a release; write MAJOR.MINOR or MAJOR.MINOR.PATCH, e.g. {example}",
                        shown(text)
                    ),
                ));
                continue;
            };
            match name {
                "pytorch" => (facts.pytorch, facts.pytorch_from) = (Some(v), Source::Spec),
                "cuda" => (facts.cuda, facts.cuda_from) = (Some(v), Source::Spec),
                _ => (facts.transformers, facts.transformers_from) = (Some(v), Source::Spec),
            }
        }
    }
    let mut conf = AllocatorConf::default();
    for name in ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] {
        // A value set through valueFrom cannot be read: the settings stay unknown.
        if let Ok(Some(value)) = env_var(spec, name) {
            {
                for option in value.split(',') {
                    let Some((key, v)) = option.split_once(':') else {
                        continue;
                    };
                    if key.trim() == "expandable_segments" {
                        match v.trim() {
                            "True" | "true" | "1" => conf.expandable_segments = true,
                            "False" | "false" | "0" => conf.expandable_segments = false,
                            other => errors.push((
                                format!("spec.template.spec.containers[0].env[{name}]"),
                                format!(
                                    "expandable_segments:{other} is not True or False (PyTorch reads only those)"
                                ),
                            )),
                        }
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok((facts, conf))
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_pip_and_conda_write_them() {
        assert_eq!(parse_version("2.4.0"), Some((2, 4)));
        assert_eq!(parse_version("2.5.1+cu121"), Some((2, 5)));
        assert_eq!(parse_version("12.1"), Some((12, 1)));
        assert_eq!(parse_version("v4.44.2"), Some((4, 44)));
        assert_eq!(parse_version("2.4.0a0"), Some((2, 4)));
        assert_eq!(parse_version("lots"), None);
        assert_eq!(parse_version("4"), None);
    }

    #[test]
    fn image_tags_say_what_they_carry() {
        let f = from_image("pytorch/pytorch:2.4.0-cuda12.1-cudnn9-devel");
        assert_eq!((f.pytorch, f.cuda), (Some((2, 4)), Some((12, 1))));
        assert_eq!(f.pytorch_from, Source::Image);
        let f = from_image("registry.local:5000/team/trainer:2.1.0-cu118");
        assert_eq!((f.pytorch, f.cuda), (None, Some((11, 8))));
        let f = from_image("huggingface/transformers-pytorch-gpu:4.41.3");
        assert_eq!(f.transformers, Some((4, 41)));
        assert_eq!(from_image("trainer"), RuntimeFacts::default());
    }

    #[test]
    fn lazy_loading_needs_both_releases_or_a_late_cuda() {
        let mut f = RuntimeFacts::default();
        assert_eq!(f.lazy_module_loading(), None);
        f.cuda = Some((12, 4));
        assert_eq!(f.lazy_module_loading(), Some(true));
        f.cuda = Some((12, 1));
        assert_eq!(f.lazy_module_loading(), None);
        f.pytorch = Some((2, 1));
        assert_eq!(f.lazy_module_loading(), Some(true));
        f.pytorch = Some((1, 12));
        assert_eq!(f.lazy_module_loading(), Some(false));
    }
}
