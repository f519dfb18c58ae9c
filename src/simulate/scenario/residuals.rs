//! Measured / estimated ratios by recipe that a scenario can draw each job's
//! true need from instead of a flat spread: the shipped calibration table or
//! one written in the file.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::file::ResidualsFile;
use super::{ScenarioError, field};

/// The calibration rows' measured / estimated ratios by recipe, as
/// `tests/calibration.rs` computes them from `../shared/calibration` (and
/// checks this copy against).
pub const CALIBRATION_RESIDUALS: &str = include_str!("../calibration-residuals.yaml");

/// Ratios by recipe: each list non-empty, each ratio in (0, 100].
pub type Residuals = BTreeMap<String, Vec<f64>>;

pub(super) fn residual_table(file: ResidualsFile) -> Result<Residuals, ScenarioError> {
    let table = match file {
        ResidualsFile::Named(name) if name == "calibration" => {
            #[derive(Deserialize)]
            struct Shipped {
                recipes: Residuals,
            }
            let shipped: Shipped = serde_saphyr::from_str(CALIBRATION_RESIDUALS).map_err(|e| {
                field(
                    "truth.residuals",
                    format!("the shipped calibration table: {e}"),
                )
            })?;
            shipped.recipes
        }
        ResidualsFile::Named(other) => {
            return Err(field(
                "truth.residuals",
                format!(
                    "{other:?} is not a residual table; use calibration or a map of recipe to ratios, e.g. {{lora: [0.97, 1.02]}}"
                ),
            ));
        }
        ResidualsFile::Table(t) => t,
    };
    if table.is_empty() {
        return Err(field("truth.residuals", "needs at least one recipe"));
    }
    for (recipe, ratios) in &table {
        if ratios.is_empty() {
            return Err(field(
                format!("truth.residuals.{recipe}"),
                "needs at least one ratio",
            ));
        }
        if ratios.len() > 100_000 {
            return Err(field(
                format!("truth.residuals.{recipe}"),
                format!("{} ratios; at most 100000", ratios.len()),
            ));
        }
        if let Some(r) = ratios
            .iter()
            .find(|r| !(r.is_finite() && **r > 0.0 && **r <= 100.0))
        {
            return Err(field(
                format!("truth.residuals.{recipe}"),
                format!("{r} is not a measured / estimated ratio; 0 < ratio <= 100"),
            ));
        }
    }
    Ok(table)
}
