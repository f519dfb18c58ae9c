use super::*;
use std::collections::HashSet;

#[test]
fn spellings_are_unambiguous_across_both_catalogs() {
    let mut all: Vec<&str> = PRESETS
        .iter()
        .flat_map(|p| std::iter::once(p.name).chain(p.aliases.iter().copied()))
        .collect();
    let owners = |n: &str| {
        let text = PRESETS
            .iter()
            .filter(|p| same_name(p.name, n) || p.aliases.iter().any(|a| same_name(a, n)));
        let vision = crate::api::vision::names().filter(|v| same_name(v, n));
        text.count() + vision.count()
    };
    all.extend(crate::api::vision::names());
    for n in all {
        assert!(owners(n) <= 1 || find(n).is_some(), "{n}");
    }
    assert_eq!(find("LLaMA_3.1 8B").map(|p| p.name), Some("llama-3.1-8b"));
    assert!(crate::api::vision::find("ResNet_50").is_some());
    assert!(crate::api::vision::find("resnet 50").is_some());
}

#[test]
fn names_and_aliases_are_unique_case_insensitively() {
    let mut seen = HashSet::new();
    for p in PRESETS {
        for spelling in std::iter::once(&p.name).chain(p.aliases.iter()) {
            assert!(
                seen.insert(spelling.to_ascii_lowercase()),
                "{spelling:?} (preset {}) is listed twice",
                p.name
            );
        }
    }
}

#[test]
fn names_are_lowercase_kebab_case() {
    for p in PRESETS {
        assert!(!p.name.is_empty());
        assert!(
            p.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'),
            "{:?} is not lowercase kebab-case",
            p.name
        );
        assert!(!p.name.starts_with('-') && !p.name.ends_with('-'));
    }
}

#[test]
fn every_shape_is_sane() {
    for p in PRESETS {
        let a = &p.arch;
        assert!(a.layers > 0, "{}: layers", p.name);
        assert!(a.hidden > 0, "{}: hidden", p.name);
        assert!(a.vocab > 0, "{}: vocab", p.name);
        assert!(a.heads > 0 && a.kv_heads > 0, "{}: heads", p.name);
        assert_eq!(a.heads % a.kv_heads, 0, "{}: heads % kv_heads", p.name);
        assert!(a.head_dim > 0, "{}: head_dim", p.name);
        assert!(a.intermediate > 0, "{}: intermediate", p.name);
        assert!(a.experts_per_token <= a.experts, "{}: experts", p.name);
        assert_eq!(
            a.decoder_layers > 0,
            a.kind == Kind::EncoderDecoder,
            "{}: decoder_layers only for encoder-decoder models",
            p.name
        );
        assert!(
            p.published_parameters > 0,
            "{}: published_parameters",
            p.name
        );
        assert!(!p.hf_id.is_empty(), "{}: hf_id", p.name);
    }
}

#[test]
fn find_is_case_insensitive_for_names_and_aliases() {
    assert_eq!(find("llama-3.1-8b").unwrap().name, "llama-3.1-8b");
    assert_eq!(find("LLAMA-3.1-8B").unwrap().name, "llama-3.1-8b");
    assert_eq!(
        find("meta-llama/llama-3.1-8b").unwrap().name,
        "llama-3.1-8b"
    );
    assert_eq!(
        find("Meta-Llama/Llama-3.1-8B").unwrap().name,
        "llama-3.1-8b"
    );
    assert_eq!(find("TinyLlama").unwrap().name, "tinyllama-1.1b");
    assert_eq!(
        find("Mistral-7B-Instruct-v0.2").unwrap().name,
        "mistral-7b-v0.2"
    );
    assert_eq!(find("bert-base-uncased").unwrap().name, "bert-base");
    assert!(find("no-such-model").is_none());
    assert!(find("").is_none());
}

#[test]
fn catalog_is_large_enough_and_names_lists_it() {
    assert!(PRESETS.len() >= 40, "only {} presets", PRESETS.len());
    assert_eq!(names().count(), PRESETS.len());
    assert!(names().any(|n| n == "gpt2"));
}
