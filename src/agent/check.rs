//! "Can this node give K GPUs N bytes each, with a block of B bytes, now?"
//! answered from one probe. Pure: the verdict per device is `plan::fit`
//! (need with margin ≤ free, block ≤ largest free block); this module only
//! lists the devices a job could be given and counts.
//!
//! Devices are whole GPUs, or the MIG slices of a split GPU (a slice serves one
//! process, as in placement). Unhealthy GPUs and GPUs a pod holds exclusively
//! (published with 0 free) do not fit. Where the largest block was not
//! measured, free memory stands in for it, as in placement.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;

use super::bytes::{human, parse_bytes};
use crate::api::GpuNodeStatus;
use crate::plan::{self, GpuView};

/// What a caller asks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckRequest {
    pub gpus: u32,
    /// Per GPU, before the margin.
    pub bytes: u64,
    /// Largest single allocation (0: no block constraint).
    pub block_bytes: u64,
    /// Fraction added to `bytes`, in [0, 1).
    pub safety_margin: f64,
}

/// Parse `gpus=K&bytes=N&block=B&margin=M`; sizes take units (`16GiB`).
pub fn parse_query(query: &str) -> Result<CheckRequest, String> {
    let mut req = CheckRequest {
        gpus: 1,
        bytes: 0,
        block_bytes: 0,
        safety_margin: 0.0,
    };
    let mut have_bytes = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "gpus" => {
                req.gpus = v.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                    format!("gpus: {v:?} is not allowed; give a whole number ≥ 1")
                })?;
            }
            "bytes" => {
                req.bytes = parse_bytes(&v).map_err(|e| format!("bytes: {e}"))?;
                have_bytes = true;
            }
            "block" => req.block_bytes = parse_bytes(&v).map_err(|e| format!("block: {e}"))?,
            "margin" => {
                req.safety_margin = v
                    .parse()
                    .ok()
                    .filter(|m: &f64| (0.0..1.0).contains(m))
                    .ok_or_else(|| {
                        format!("margin: {v:?} is not allowed; give a fraction in [0, 1)")
                    })?;
            }
            other => {
                return Err(format!(
                    "{other}: unknown parameter; use gpus, bytes, block, margin"
                ));
            }
        }
    }
    if !have_bytes {
        return Err(
            "bytes: missing; give the bytes each GPU must offer, e.g. bytes=20GiB".to_string(),
        );
    }
    Ok(req)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(v)) => {
                out.push(v);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One device's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAnswer {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    pub uuid: String,
    pub product: String,
    pub free_bytes: u64,
    pub largest_free_block_bytes: u64,
    /// False when free memory stands in for an unmeasured largest block.
    pub block_measured: bool,
    pub fits: bool,
    /// Why it does not fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The node's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckAnswer {
    pub fits: bool,
    pub gpus_asked: u32,
    pub gpus_fitting: u32,
    /// Per GPU, with the margin.
    pub need_bytes: u64,
    pub block_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_time: Option<Time>,
    pub message: String,
    pub devices: Vec<DeviceAnswer>,
}

/// Judge every device of `status` against `req`.
pub fn check(status: &GpuNodeStatus, req: &CheckRequest) -> CheckAnswer {
    let mut devices = Vec::new();
    let need = plan::with_margin(req.bytes, req.safety_margin);
    let judge = |view: GpuView, measured: bool| {
        let v = plan::fit(req.bytes, req.block_bytes, req.safety_margin, view);
        let reason = if v.fits {
            None
        } else if v.short_by_bytes > 0 {
            Some(format!(
                "{} free, {} needed: short by {}",
                human(v.have_bytes),
                human(v.need_bytes),
                human(v.short_by_bytes)
            ))
        } else {
            Some(format!(
                "largest free block {}{} < the {} block asked",
                human(v.largest_block_bytes),
                if measured {
                    ""
                } else {
                    " (not measured: free memory)"
                },
                human(req.block_bytes)
            ))
        };
        (v.fits, reason)
    };
    for g in &status.gpus {
        if g.mig_devices.is_empty() {
            let free = g.free_bytes.min(g.total_bytes);
            let measured = g.largest_free_block_bytes.is_some();
            let block = g.largest_free_block_bytes.unwrap_or(free).min(free);
            let (mut fits, mut reason) = judge(
                GpuView {
                    total_bytes: g.total_bytes,
                    free_bytes: free,
                    largest_block_bytes: block,
                },
                measured,
            );
            if !g.healthy {
                fits = false;
                reason = Some(format!(
                    "unhealthy: {}",
                    g.health_message.as_deref().unwrap_or("no reason given")
                ));
            } else if let Some(pod) = g.assigned_pod.as_deref().filter(|_| free == 0) {
                fits = false;
                reason = Some(format!("held by pod {pod}"));
            }
            devices.push(DeviceAnswer {
                index: g.index,
                mig_index: None,
                mig_profile: None,
                uuid: g.uuid.clone(),
                product: g.product.clone(),
                free_bytes: free,
                largest_free_block_bytes: block,
                block_measured: measured,
                fits,
                reason,
            });
        } else {
            for m in &g.mig_devices {
                let free = m.free_bytes.min(m.total_bytes);
                let (mut fits, mut reason) = judge(
                    GpuView {
                        total_bytes: m.total_bytes,
                        free_bytes: free,
                        largest_block_bytes: free,
                    },
                    false,
                );
                if !g.healthy {
                    fits = false;
                    reason = Some(format!(
                        "unhealthy: {}",
                        g.health_message.as_deref().unwrap_or("no reason given")
                    ));
                }
                devices.push(DeviceAnswer {
                    index: g.index,
                    mig_index: Some(m.index),
                    mig_profile: Some(m.profile.clone()),
                    uuid: m.uuid.clone(),
                    product: format!("{} MIG {}", g.product, m.profile),
                    free_bytes: free,
                    largest_free_block_bytes: free,
                    block_measured: false,
                    fits,
                    reason,
                });
            }
        }
    }
    let fitting = u32::try_from(devices.iter().filter(|d| d.fits).count()).unwrap_or(u32::MAX);
    let fits = fitting >= req.gpus;
    let message = summary(req, fits, fitting, devices.len(), need);
    CheckAnswer {
        fits,
        gpus_asked: req.gpus,
        gpus_fitting: fitting,
        need_bytes: need,
        block_bytes: req.block_bytes,
        probe_time: status.probe_time.clone(),
        message,
        devices,
    }
}

/// The answer in a line: how many devices offer what is asked.
fn summary(req: &CheckRequest, fits: bool, fitting: u32, devices: usize, need: u64) -> String {
    let block = if req.block_bytes > 0 {
        format!(" with a {} block", human(req.block_bytes))
    } else {
        String::new()
    };
    if fits {
        format!(
            "fits: {fitting} of {devices} device(s) offer {} each{block}",
            human(need),
        )
    } else {
        format!(
            "does not fit: {} GPU(s) asked, {fitting} of {devices} device(s) offer {} each{block}",
            req.gpus,
            human(need),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{GpuStatus, MigDevice};

    const GIB: u64 = 1 << 30;

    fn gpu(index: u32, free: u64, block: Option<u64>) -> GpuStatus {
        GpuStatus {
            index,
            uuid: format!("GPU-{index}"),
            product: "NVIDIA A100-SXM4-40GB".into(),
            total_bytes: 40 * GIB,
            free_bytes: free,
            largest_free_block_bytes: block,
            healthy: true,
            ..Default::default()
        }
    }

    #[test]
    fn query() {
        let r = parse_query("gpus=2&bytes=20GiB&block=4%20GiB&margin=0.05").unwrap();
        assert_eq!(
            r,
            CheckRequest {
                gpus: 2,
                bytes: 20 * GIB,
                block_bytes: 4 * GIB,
                safety_margin: 0.05
            }
        );
        assert!(
            parse_query("gpus=2")
                .unwrap_err()
                .starts_with("bytes: missing")
        );
        assert!(
            parse_query("bytes=1&gpus=0")
                .unwrap_err()
                .starts_with("gpus: ")
        );
        assert!(
            parse_query("bytes=1&margin=1.5")
                .unwrap_err()
                .starts_with("margin: ")
        );
        assert!(
            parse_query("bytes=1&colour=red")
                .unwrap_err()
                .contains("unknown parameter")
        );
        assert!(
            parse_query("bytes=12parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert_eq!(percent_decode("a%2"), "a%2");
    }

    #[test]
    fn fragmentation_binds_on_the_block() {
        let status = GpuNodeStatus {
            gpus: vec![
                gpu(0, 20 * GIB, Some(GIB)),
                gpu(1, 20 * GIB, Some(10 * GIB)),
            ],
            gpu_count: 2,
            ..Default::default()
        };
        let req = CheckRequest {
            gpus: 2,
            bytes: 16 * GIB,
            block_bytes: 4 * GIB,
            safety_margin: 0.0,
        };
        let a = check(&status, &req);
        assert!(!a.fits);
        assert_eq!(a.gpus_fitting, 1);
        let why = a.devices[0].reason.as_deref().unwrap();
        assert!(why.starts_with("largest free block 1.00 GiB"), "{why}");
        assert!(a.devices[1].fits);
        let one = check(&status, &CheckRequest { gpus: 1, ..req });
        assert!(one.fits, "{}", one.message);
        let mut held = status.clone();
        held.gpus[1].free_bytes = 0;
        held.gpus[1].assigned_pod = Some("ml/trainer-0".into());
        let a = check(&held, &CheckRequest { gpus: 1, ..req });
        assert_eq!(
            a.devices[1].reason.as_deref(),
            Some("held by pod ml/trainer-0")
        );
    }

    #[test]
    fn unhealthy_and_mig() {
        let mut sick = gpu(0, 40 * GIB, None);
        sick.healthy = false;
        sick.health_message = Some("XID 79".into());
        let mut split = gpu(1, 30 * GIB, None);
        split.mig_devices = vec![
            MigDevice {
                index: 0,
                uuid: "MIG-a".into(),
                profile: "3g.20gb".into(),
                total_bytes: 20 * GIB,
                free_bytes: 19 * GIB,
            },
            MigDevice {
                index: 1,
                uuid: "MIG-b".into(),
                profile: "1g.5gb".into(),
                total_bytes: 5 * GIB,
                free_bytes: 5 * GIB,
            },
        ];
        let status = GpuNodeStatus {
            gpus: vec![sick, split],
            ..Default::default()
        };
        let a = check(
            &status,
            &CheckRequest {
                gpus: 1,
                bytes: 10 * GIB,
                block_bytes: 0,
                safety_margin: 0.0,
            },
        );
        assert!(a.fits);
        assert_eq!(a.devices.len(), 3);
        assert_eq!(a.devices[0].reason.as_deref(), Some("unhealthy: XID 79"));
        assert!(a.devices[1].fits && a.devices[1].mig_profile.as_deref() == Some("3g.20gb"));
        assert!(a.devices[2].reason.as_deref().unwrap().contains("short by"));
    }
}
