//! Micro-batches a pipeline rank holds at its peak, schedule by schedule.
//!
//! The zero-bubble and V schedules follow PyTorch's own action orders
//! (`_calculate_single_rank_operations` of `ScheduleLoopedBFS`,
//! `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble` and
//! `ScheduleDualPipeV`, torch/distributed/pipelining/schedules.py, torch
//! 2.15.0, git d0f2af8b66b20da4baa50644c0cd3f887a2eae2e):
//! `benches/reference/pipeline_in_flight.py` walks each rank's order and
//! counts the (virtual stage, micro-batch) pairs whose forward has run and
//! whose full backward (B) or weight backward (W) has not, as
//! `analyze_pipeline_activation_liveness` in the same file does: an input
//! backward (I) releases nothing, because `stage_backward_input`
//! (torch/distributed/pipelining/_backward.py) runs `autograd.grad` with
//! `retain_graph=True` and keeps the graph's nodes alive through the
//! `param_groups` the stage stores until W. The tests below hold that walk's
//! output for the first and the last rank; the closed forms here agree with
//! every row.
//!
//! Interleaved 1F1B's order (`ScheduleInterleaved1F1B`) is walked the same
//! way. GPipe runs every forward before any backward; 1F1B keeps the
//! estimator's earlier figures (p on the first stage, one micro-batch on
//! the last).
//!
//! Stage 0 runs no input backward of its own (`backward_one_chunk` skips it
//! for the first stage and W runs the whole backward, stage.py): its pairs
//! between I and W keep everything, with no linear output gradients; they
//! are counted as any other split pair, a little high.

use crate::api::PipelineSchedule;

/// Which pipeline rank: rank 0 (the embedding's; under a V schedule also
/// the head's) or rank p − 1 (the last stage's; under a V schedule the one
/// holding the two middle stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rank {
    First,
    Last,
}

/// What one rank holds at its peak, in micro-batches of the whole rank: a
/// pair of one virtual stage and one micro-batch counts 1 / v.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InFlight {
    /// Micro-batches whose forward has run and whose backward (or weight
    /// backward) has not.
    pub held: f64,
    /// Of those, the ones between their input backward and their weight
    /// backward at that moment.
    pub split: f64,
    /// Micro-batches of the loss's stage between their I and their W at
    /// once beyond the one the head's backward holds anyway: each keeps the
    /// gradient of its logits (the head's output gradient).
    pub extra_logit_grads: f64,
}

impl InFlight {
    fn whole(held: f64) -> InFlight {
        InFlight {
            held,
            split: 0.0,
            extra_logit_grads: 0.0,
        }
    }
}

/// The rank's peak under `schedule` with `p` pipeline stages of `v` virtual
/// stages each and `m` micro-batches per step (`None`: not given, taken as
/// enough to fill the pipeline, except where every micro-batch is held).
pub fn in_flight(
    schedule: PipelineSchedule,
    p: u64,
    v: u64,
    m: Option<u64>,
    rank: Rank,
) -> InFlight {
    if p <= 1 {
        return InFlight::whole(1.0);
    }
    let (pf, vf) = (p as f64, v.max(1) as f64);
    match schedule {
        // Every micro-batch's forward, then the backwards
        // (`ScheduleGPipe._step_microbatches`): all of them on every rank.
        PipelineSchedule::Gpipe => InFlight::whole(m.unwrap_or(1).max(1) as f64),
        // `Schedule1F1B._step_microbatches`: rank r runs min(m, p − r)
        // warm-up forwards, then a backward before each forward, so the
        // first rank holds min(m, p) and the last one (PyTorch's class
        // refuses m < p; Megatron's 1F1B takes it, with the same warm-up).
        PipelineSchedule::OneFOneB => InFlight::whole(match rank {
            Rank::First => m.map_or(pf, |m| (m.max(1) as f64).min(pf)),
            Rank::Last => 1.0,
        }),
        PipelineSchedule::Interleaved1f1b => {
            // Warm-up of (v − 1) rounds plus two forwards per hop to the last
            // rank (multiply_factor 2), then one more forward before the
            // first backward. With m a multiple of p, rank 0 holds
            // p × (1 + (p − 1) / (p v)), Megatron's figure.
            let known = m.is_some();
            let m = m.unwrap_or(p).max(1);
            let per_round = m / (m / p).max(1);
            let hops = match rank {
                Rank::First => 2.0 * (pf - 1.0),
                Rank::Last => 0.0,
            };
            let held = ((vf - 1.0) * per_round as f64 + hops + 1.0) / vf;
            InFlight::whole(if known { held.min(m as f64) } else { held })
        }
        // Every local stage's forwards of every micro-batch, then the
        // backwards: all of them on every rank.
        PipelineSchedule::LoopedBfs => InFlight::whole(m.unwrap_or(1).max(1) as f64),
        PipelineSchedule::InterleavedZeroBubble => {
            // Warm-up of (v − 1) rounds plus one forward per hop to the last
            // rank (multiply_factor 1); the last rank defers its first p − 1
            // weight passes (num_1f1b_microbatches = rank), so every rank
            // peaks at the same count.
            let m = m.unwrap_or(p).max(1);
            let per_round = m / (m / p).max(1);
            let mf = m as f64;
            let held = mf.min(((vf - 1.0) * per_round as f64 + pf) / vf);
            match rank {
                Rank::First => InFlight {
                    held,
                    split: 1.0 / vf,
                    extra_logit_grads: 0.0,
                },
                Rank::Last => InFlight {
                    held,
                    split: pf.min(vf * mf) / vf,
                    extra_logit_grads: pf.min(mf) - 1.0,
                },
            }
        }
        PipelineSchedule::ZbvZeroBubble => {
            let mf = m.unwrap_or(2 * p).max(1) as f64;
            InFlight {
                held: match rank {
                    Rank::First => pf.min((mf + 1.0) / 2.0),
                    Rank::Last => pf.min(mf),
                },
                split: 0.5,
                extra_logit_grads: 0.0,
            }
        }
        // Validation asks for at least 2p micro-batches; overlapped forward
        // and backward hold both pairs.
        PipelineSchedule::DualPipeV => InFlight::whole(pf + 0.5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `target/reference-venv/bin/python benches/reference/pipeline_in_flight.py`
    /// (torch 2.15.0, d0f2af8b): schedule, p, v, m, rank (0 or p − 1),
    /// held, split (both as whole-rank micro-batches), and the most pairs
    /// of the loss's stage between their I and W at once. A sample of its
    /// 730 rows: small and large m, m not a multiple of p, every v.
    /// schedule, p, v, m, rank, held, split, loss-stage pairs between I and W.
    type Walked = (&'static str, u64, u64, u64, u64, f64, f64, f64);

    const WALKED: &[Walked] = &[
        ("looped-bfs", 2, 1, 1, 0, 1.0, 0.0, 0.0),
        ("looped-bfs", 4, 2, 8, 0, 8.0, 0.0, 0.0),
        ("looped-bfs", 4, 2, 8, 3, 8.0, 0.0, 0.0),
        ("looped-bfs", 8, 4, 32, 7, 32.0, 0.0, 0.0),
        ("looped-bfs", 3, 4, 6, 0, 6.0, 0.0, 0.0),
        ("interleaved-zero-bubble", 2, 1, 32, 0, 2.0, 1.0, 0.0),
        ("interleaved-zero-bubble", 2, 1, 32, 1, 2.0, 2.0, 2.0),
        ("interleaved-zero-bubble", 2, 2, 3, 0, 2.5, 0.5, 0.0),
        ("interleaved-zero-bubble", 2, 4, 3, 1, 2.75, 0.5, 2.0),
        ("interleaved-zero-bubble", 3, 2, 4, 0, 3.5, 0.5, 0.0),
        ("interleaved-zero-bubble", 3, 2, 4, 2, 3.5, 1.5, 3.0),
        ("interleaved-zero-bubble", 3, 4, 8, 2, 3.75, 0.75, 3.0),
        ("interleaved-zero-bubble", 4, 1, 2, 3, 2.0, 2.0, 2.0),
        ("interleaved-zero-bubble", 4, 2, 3, 0, 3.0, 0.5, 0.0),
        ("interleaved-zero-bubble", 4, 2, 6, 0, 5.0, 0.5, 0.0),
        ("interleaved-zero-bubble", 4, 2, 6, 3, 5.0, 2.0, 4.0),
        ("interleaved-zero-bubble", 4, 2, 32, 0, 4.0, 0.5, 0.0),
        ("interleaved-zero-bubble", 4, 2, 32, 3, 4.0, 2.0, 4.0),
        ("interleaved-zero-bubble", 4, 4, 1, 3, 1.0, 1.0, 1.0),
        ("interleaved-zero-bubble", 4, 4, 6, 3, 5.5, 1.0, 4.0),
        ("interleaved-zero-bubble", 8, 2, 3, 7, 3.0, 3.0, 3.0),
        ("interleaved-zero-bubble", 8, 2, 12, 0, 10.0, 0.5, 0.0),
        ("interleaved-zero-bubble", 8, 4, 3, 7, 3.0, 2.0, 3.0),
        ("interleaved-zero-bubble", 8, 4, 12, 7, 11.0, 2.0, 8.0),
        ("interleaved-zero-bubble", 8, 4, 16, 0, 8.0, 0.25, 0.0),
        ("interleaved-zero-bubble", 8, 4, 16, 7, 8.0, 2.0, 8.0),
        ("zbv-zero-bubble", 2, 2, 2, 0, 1.5, 0.5, 1.0),
        ("zbv-zero-bubble", 2, 2, 32, 1, 2.0, 0.5, 0.0),
        ("zbv-zero-bubble", 3, 2, 4, 0, 2.5, 0.5, 1.0),
        ("zbv-zero-bubble", 3, 2, 3, 2, 3.0, 0.5, 0.0),
        ("zbv-zero-bubble", 4, 2, 6, 0, 3.5, 0.5, 1.0),
        ("zbv-zero-bubble", 4, 2, 6, 3, 4.0, 0.5, 0.0),
        ("zbv-zero-bubble", 4, 2, 8, 0, 4.0, 0.5, 1.0),
        ("zbv-zero-bubble", 8, 2, 1, 0, 1.0, 0.5, 1.0),
        ("zbv-zero-bubble", 8, 2, 6, 7, 6.0, 0.5, 0.0),
        ("zbv-zero-bubble", 8, 2, 12, 0, 6.5, 0.5, 1.0),
        ("zbv-zero-bubble", 8, 2, 32, 0, 8.0, 0.5, 1.0),
        ("zbv-zero-bubble", 8, 2, 32, 7, 8.0, 0.5, 0.0),
        ("interleaved-1f1b", 2, 1, 4, 0, 3.0, 0.0, 0.0),
        ("interleaved-1f1b", 2, 1, 4, 1, 1.0, 0.0, 0.0),
        ("interleaved-1f1b", 3, 4, 8, 0, 4.25, 0.0, 0.0),
        ("interleaved-1f1b", 3, 4, 8, 2, 3.25, 0.0, 0.0),
        ("interleaved-1f1b", 4, 1, 2, 0, 2.0, 0.0, 0.0),
        ("interleaved-1f1b", 4, 1, 2, 3, 1.0, 0.0, 0.0),
        ("interleaved-1f1b", 4, 2, 6, 0, 6.0, 0.0, 0.0),
        ("interleaved-1f1b", 4, 2, 6, 3, 3.5, 0.0, 0.0),
        ("interleaved-1f1b", 4, 2, 32, 0, 5.5, 0.0, 0.0),
        ("interleaved-1f1b", 4, 2, 32, 3, 2.5, 0.0, 0.0),
        ("interleaved-1f1b", 8, 4, 12, 0, 12.0, 0.0, 0.0),
        ("interleaved-1f1b", 8, 4, 12, 7, 9.25, 0.0, 0.0),
        ("interleaved-1f1b", 8, 4, 32, 0, 9.75, 0.0, 0.0),
        ("interleaved-1f1b", 8, 4, 32, 7, 6.25, 0.0, 0.0),
        ("dualpipev", 2, 2, 4, 0, 2.5, 0.0, 1.0),
        ("dualpipev", 3, 2, 6, 2, 3.5, 0.0, 0.0),
        ("dualpipev", 4, 2, 8, 0, 4.5, 0.0, 1.0),
        ("dualpipev", 4, 2, 32, 3, 4.5, 0.0, 0.0),
        ("dualpipev", 8, 2, 16, 0, 8.5, 0.0, 1.0),
        ("dualpipev", 8, 2, 32, 7, 8.5, 0.0, 0.0),
    ];

    fn schedule(name: &str) -> PipelineSchedule {
        serde_json::from_value(serde_json::Value::String(name.into())).expect("a schedule")
    }

    #[test]
    fn closed_forms_agree_with_the_walk_of_pytorchs_schedules() {
        let mut wrong = Vec::new();
        for &(name, p, v, m, rank, held, split, head) in WALKED {
            let r = if rank == 0 { Rank::First } else { Rank::Last };
            let got = in_flight(schedule(name), p, v, Some(m), r);
            // The loss's stage is on the last rank, or on rank 0 in a V; its
            // first pair between I and W is the head's backward's own.
            let loss_rank = if schedule(name).v_shape() { 0 } else { p - 1 };
            let extra = if rank == loss_rank {
                (head - 1.0).max(0.0)
            } else {
                0.0
            };
            let want = InFlight {
                held,
                split,
                extra_logit_grads: extra,
            };
            if got != want {
                wrong.push(format!(
                    "{name} p{p} v{v} m{m} rank {rank}: {got:?}, walked {want:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Interleaved 1F1B's first rank holds Megatron's p × (1 + (p − 1) /
    /// (p v)) where m is a multiple of p, and so when m is not given.
    #[test]
    fn interleaved_1f1b_first_rank_is_megatrons_figure_in_the_steady_state() {
        for (p, v) in [(4, 2), (8, 4), (3, 1), (2, 4)] {
            let megatron = p as f64 * (1.0 + (p as f64 - 1.0) / (p * v) as f64);
            for m in [Some(32), Some(4 * p), None] {
                let got = in_flight(PipelineSchedule::Interleaved1f1b, p, v, m, Rank::First);
                assert_eq!(got.held, megatron, "p{p} v{v} m{m:?}");
            }
        }
    }

    /// 1F1B's first rank runs min(m, p) warm-up forwards
    /// (`Schedule1F1B._step_microbatches`): fewer micro-batches than stages
    /// hold only those; the last rank holds one.
    #[test]
    fn one_f_one_b_holds_the_warm_up_on_the_first_rank() {
        let held = |m, rank| in_flight(PipelineSchedule::OneFOneB, 4, 1, m, rank).held;
        assert_eq!(held(Some(2), Rank::First), 2.0);
        assert_eq!(held(Some(4), Rank::First), 4.0);
        assert_eq!(held(Some(32), Rank::First), 4.0);
        assert_eq!(held(None, Rank::First), 4.0);
        assert_eq!(held(Some(32), Rank::Last), 1.0);
    }

    /// Unknown micro-batch counts take the pipeline as full: the steady
    /// state of each schedule.
    #[test]
    fn an_unknown_count_is_the_full_pipelines() {
        let full = |s, v| in_flight(s, 4, v, None, Rank::First).held;
        assert_eq!(full(PipelineSchedule::InterleavedZeroBubble, 2), 4.0);
        assert_eq!(full(PipelineSchedule::ZbvZeroBubble, 2), 4.0);
        assert_eq!(full(PipelineSchedule::DualPipeV, 2), 4.5);
        assert_eq!(full(PipelineSchedule::LoopedBfs, 2), 1.0);
        assert_eq!(
            in_flight(
                PipelineSchedule::InterleavedZeroBubble,
                4,
                2,
                None,
                Rank::Last
            )
            .extra_logit_grads,
            3.0
        );
        // One stage is no pipeline.
        assert_eq!(
            in_flight(PipelineSchedule::ZbvZeroBubble, 1, 2, Some(8), Rank::First),
            InFlight::whole(1.0)
        );
    }
}
