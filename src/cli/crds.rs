//! `vramguard crds`: the CRD YAML generated from the Rust types.

use std::io::Write;

use kube::CustomResourceExt;

use crate::api::{GpuNode, MemoryProfile, TrainingJob};

/// Every CRD as one multi-document YAML text.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for crd in [TrainingJob::crd(), GpuNode::crd(), MemoryProfile::crd()] {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd).expect("a CRD always serialises to YAML"));
    }
    out
}

/// Arguments of `vramguard crds`.
#[derive(Debug, Default, clap::Args)]
pub struct CrdsArgs {
    /// Print the TrainingJob spec's fields as a Markdown reference instead (what
    /// `docs/trainingjob.md` holds): every field, its values and its default.
    #[arg(long)]
    pub reference: bool,
}

/// Every field of a TrainingJob's spec, from the CRD's own schema, as Markdown.
pub fn reference_markdown() -> String {
    let spec = crate::api::structural::training_job_spec_schema();
    let mut rows = Vec::new();
    fields(spec, "spec", &mut rows);
    let mut out = String::from(
        "# Writing a TrainingJob\n\n\
         Every field of `spec`, generated from the CRD's schema by `vramguard crds --reference`\n\
         (a test fails when this file and the schema differ). `apiVersion: vramguard.io/v1alpha1`,\n\
         `kind: TrainingJob`, `metadata.name` and `spec.model` are needed; everything else has the\n\
         default shown. Objects marked *free-form* keep any keys (a pod template, a Hugging Face\n\
         `config.json`, a layer list). `vramguard estimate -f job.yaml` checks a spec against all of\n\
         this at once and names each problem's field.\n\n\
         | field | type | values | default | meaning |\n|---|---|---|---|---|\n",
    );
    for row in rows {
        out.push_str(&row);
        out.push('\n');
    }
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn fields(schema: &serde_json::Value, path: &str, rows: &mut Vec<String>) {
    use crate::api::structural::{enum_words, num};
    use serde_json::Value;
    let kind = schema["type"].as_str().unwrap_or("");
    let preserved = schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true);
    let options = schema["enum"]
        .as_array()
        .or_else(|| schema["items"]["enum"].as_array());
    let values = if let Some(options) = options {
        enum_words(options)
    } else {
        let (lo, hi) = (
            schema.get("minimum").and_then(Value::as_f64),
            schema.get("maximum").and_then(Value::as_f64),
        );
        match (lo, hi) {
            (Some(l), Some(h)) => format!("{} to {}", num(l), num(h)),
            (Some(l), None) => format!("≥ {}", num(l)),
            (None, Some(h)) => format!("≤ {}", num(h)),
            _ => String::new(),
        }
    };
    let type_name = match (kind, preserved) {
        ("object", true) => "object (free-form)".to_string(),
        ("array", _) if schema["items"]["type"].is_string() => {
            format!("list of {}", schema["items"]["type"].as_str().unwrap_or(""))
        }
        _ => kind.to_string(),
    };
    let default = match schema.get("default") {
        Some(Value::Object(_)) | Some(Value::Array(_)) | None => String::new(),
        Some(d) => format!("`{}`", enum_words(std::slice::from_ref(d))),
    };
    let meaning = schema["description"]
        .as_str()
        .map(|d| d.split("\n\n").next().unwrap_or(d).to_string())
        .unwrap_or_default();
    if path != "spec" {
        rows.push(format!(
            "| `{path}` | {type_name} | {} | {default} | {} |",
            cell(&values),
            cell(&meaning)
        ));
    }
    if let Some(props) = schema["properties"].as_object()
        && !preserved
    {
        for (name, sub) in props {
            fields(sub, &format!("{path}.{name}"), rows);
        }
    }
    if kind == "array"
        && let Some(props) = schema["items"]["properties"].as_object()
    {
        for (name, sub) in props {
            fields(sub, &format!("{path}[].{name}"), rows);
        }
    }
}

pub fn run(args: &CrdsArgs, out: &mut dyn Write) -> u8 {
    let text = if args.reference {
        reference_markdown()
    } else {
        crds_yaml()
    };
    match out.write_all(text.as_bytes()) {
        Ok(()) => super::EXIT_FITS,
        Err(e) => {
            eprintln!("error: writing the CRDs: {e}");
            super::EXIT_BAD_INPUT
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crds_parse_back() {
        let text = super::crds_yaml();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[2]["spec"]["names"]["kind"], "MemoryProfile");
        assert_eq!(docs[0]["spec"]["names"]["shortNames"][0], "tj");
        assert_eq!(docs[1]["spec"]["scope"], "Cluster");
        assert_eq!(docs[0]["spec"]["scope"], "Namespaced");
    }
}
