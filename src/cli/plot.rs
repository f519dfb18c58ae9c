//! `estimate -o svg` and `--plot FILE.svg`: per-GPU memory through the step, one stacked
//! bar per phase (forward, backward start, ..., optimizer step) by component, the range as a
//! band over each bar, and the GPU's usable memory as a line. Built with the `svg` crate;
//! every shape people read carries a class (`component`, `range`, `usable`) and a `<title>`
//! (the hover text), so a test can find them.

use svg::Document;
use svg::node::element::{Group, Line, Rectangle, Text, Title};

use crate::api::ValidatedJob;
use crate::estimate::{self, Component, Estimate, GIB, GpuProduct};

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 56.0;

/// The layers of a bar, bottom first: what is there in every phase, then what the step
/// allocates. The CUDA context and the allocator's overhead are the peak's, on every bar.
const LAYERS: &[(&str, &str)] = &[
    ("cudaContext", "#7f7f7f"),
    ("allocatorOverhead", "#c7c7c7"),
    ("weights", "#1f77b4"),
    ("gradients", "#ff7f0e"),
    ("optimizerStates", "#2ca02c"),
    ("pagedOptimizerStates", "#98df8a"),
    ("activations", "#d62728"),
    ("logits", "#9467bd"),
    ("inputs", "#8c564b"),
    ("temporaries", "#e377c2"),
    ("workspaces", "#bcbd22"),
    ("communication", "#17becf"),
];

/// One bar: the phase and its layers' bytes (in [`LAYERS`] order).
struct Bar {
    phase: &'static str,
    layers: Vec<f64>,
}

impl Bar {
    fn total(&self) -> f64 {
        self.layers.iter().sum()
    }
}

fn bars(est: &Estimate) -> Vec<Bar> {
    let b = &est.status.breakdown;
    est.phases
        .iter()
        .map(|p| {
            let mut layers = vec![b.cuda_context as f64, b.allocator_overhead as f64];
            for (name, _) in &LAYERS[2..] {
                let bytes = Component::ALL
                    .iter()
                    .find(|c| c.name() == *name)
                    .map_or(0.0, |c| p.get(*c));
                layers.push(bytes);
            }
            Bar {
                phase: p.phase.name(),
                layers,
            }
        })
        .collect()
}

fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / GIB)
}

fn text(x: f64, y: f64, s: impl Into<String>) -> Text {
    Text::new(s)
        .set("x", x)
        .set("y", y)
        .set("font-family", "sans-serif")
        .set("font-size", 12)
}

/// The picture of `job` on `gpu`, as SVG text.
pub fn step_svg(
    job: &ValidatedJob,
    name: &str,
    gpu: &'static GpuProduct,
) -> Result<String, String> {
    let est = estimate::estimate(job, gpu).map_err(|e| e.to_string())?;
    let bars = bars(&est);
    if bars.is_empty() {
        return Err("the estimate has no phase to draw".to_string());
    }
    let point = est.status.per_gpu_bytes.max(1) as f64;
    let low = est.status.lower.map_or(point, |l| l.per_gpu_bytes as f64) / point;
    let high = est
        .status
        .upper
        .map_or(point, |u| (u.per_gpu_bytes as f64).max(point))
        / point;
    let usable = gpu.usable_bytes() as f64;
    let top = bars.iter().map(|b| b.total() * high).fold(usable, f64::max) * 1.08;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let y = |bytes: f64| TOP + plot_h * (1.0 - bytes / top);
    let slot = plot_w / bars.len() as f64;
    let bar_w = slot * 0.5;

    let mut doc = Document::new()
        .set("xmlns", "http://www.w3.org/2000/svg")
        .set("width", WIDTH)
        .set("height", HEIGHT)
        .set("viewBox", (0, 0, WIDTH, HEIGHT))
        .add(
            Rectangle::new()
                .set("width", WIDTH)
                .set("height", HEIGHT)
                .set("fill", "white"),
        )
        .add(
            text(
                LEFT,
                24.0,
                format!(
                    "{name}: {} on {} — memory per GPU through the step",
                    job.model_name, gpu.name
                ),
            )
            .set("font-size", 15)
            .set("font-weight", "bold"),
        )
        .add(text(
            LEFT,
            42.0,
            format!(
                "peak {} at {} (range {} – {}); bands: the range; line: usable memory",
                gib(point),
                est.peak_phase.name(),
                gib(point * low),
                gib(point * high)
            ),
        ));

    doc = doc.add(axis_group(top, plot_w, plot_h, &y));

    for (i, bar) in bars.iter().enumerate() {
        let x = LEFT + slot * i as f64 + (slot - bar_w) / 2.0;
        doc = doc.add(bar_group(bar, x, bar_w, (low, high), &y));
    }

    let uy = y(usable);
    doc = doc
        .add(
            Line::new()
                .set("class", "usable")
                .set("x1", LEFT)
                .set("x2", LEFT + plot_w)
                .set("y1", uy)
                .set("y2", uy)
                .set("stroke", "#d00000")
                .set("stroke-width", 2)
                .add(Title::new(format!("{} usable: {}", gpu.name, gib(usable)))),
        )
        .add(
            text(
                LEFT + plot_w - 4.0,
                uy - 6.0,
                format!("{} usable {}", gpu.name, gib(usable)),
            )
            .set("text-anchor", "end")
            .set("fill", "#d00000"),
        );

    doc = doc.add(legend(&bars));
    Ok(doc.to_string())
}

/// The axis: GiB ticks up to `top` bytes, and its title.
fn axis_group(top: f64, plot_w: f64, plot_h: f64, y: &dyn Fn(f64) -> f64) -> Group {
    let step = nice_step(top / GIB);
    let mut axis = Group::new().set("class", "axis");
    let mut tick = 0.0;
    while tick * GIB <= top {
        let ty = y(tick * GIB);
        axis = axis
            .add(
                Line::new()
                    .set("x1", LEFT)
                    .set("x2", LEFT + plot_w)
                    .set("y1", ty)
                    .set("y2", ty)
                    .set("stroke", "#eeeeee"),
            )
            .add(text(LEFT - 8.0, ty + 4.0, format!("{tick}")).set("text-anchor", "end"));
        tick += step;
    }
    axis = axis.add(
        text(16.0, TOP + plot_h / 2.0, "GiB per GPU")
            .set(
                "transform",
                format!("rotate(-90 16 {})", TOP + plot_h / 2.0),
            )
            .set("text-anchor", "middle"),
    );
    axis
}

/// One phase's bar: its components stacked, the band of the range, its name.
fn bar_group(
    bar: &Bar,
    x: f64,
    bar_w: f64,
    (low, high): (f64, f64),
    y: &dyn Fn(f64) -> f64,
) -> Group {
    let mut group = Group::new()
        .set("class", "phase")
        .set("data-phase", bar.phase);
    let mut base = 0.0;
    for ((layer, colour), bytes) in LAYERS.iter().zip(&bar.layers) {
        if *bytes <= 0.0 {
            continue;
        }
        group = group.add(
            Rectangle::new()
                .set("class", "component")
                .set("data-component", *layer)
                .set("x", x)
                .set("y", y(base + bytes))
                .set("width", bar_w)
                .set("height", (y(base) - y(base + bytes)).max(0.0))
                .set("fill", *colour)
                .add(Title::new(format!(
                    "{}: {layer} {}",
                    bar.phase,
                    gib(*bytes)
                ))),
        );
        base += bytes;
    }
    let (lo, hi) = (base * low, base * high);
    group = group
        .add(
            Rectangle::new()
                .set("class", "range")
                .set("x", x - bar_w * 0.1)
                .set("y", y(hi))
                .set("width", bar_w * 1.2)
                .set("height", (y(lo) - y(hi)).max(1.0))
                .set("fill", "#000000")
                .set("fill-opacity", 0.12)
                .set("stroke", "#000000")
                .set("stroke-dasharray", "3 2")
                .add(Title::new(format!(
                    "{}: {} (range {} – {})",
                    bar.phase,
                    gib(base),
                    gib(lo),
                    gib(hi)
                ))),
        )
        .add(text(x + bar_w / 2.0, HEIGHT - BOTTOM + 18.0, bar.phase).set("text-anchor", "middle"));
    group
}

/// The legend: the layers that appear in some bar.
fn legend(bars: &[Bar]) -> Group {
    let mut legend = Group::new().set("class", "legend");
    let mut ly = TOP;
    for (i, (layer, colour)) in LAYERS.iter().enumerate().rev() {
        if bars.iter().all(|b| b.layers[i] <= 0.0) {
            continue;
        }
        legend = legend
            .add(
                Rectangle::new()
                    .set("x", WIDTH - RIGHT + 20.0)
                    .set("y", ly)
                    .set("width", 12)
                    .set("height", 12)
                    .set("fill", *colour),
            )
            .add(text(WIDTH - RIGHT + 38.0, ly + 10.0, *layer));
        ly += 18.0;
    }
    legend
}

/// 1, 2 or 5 times a power of ten, for about six ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = (max / 6.0).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}
