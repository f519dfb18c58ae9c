"""Micro-batches a pipeline rank holds at its peak, walked from PyTorch's own schedules.

Each multi-stage schedule of `torch.distributed.pipelining.schedules` builds every rank's
action order in `_calculate_single_rank_operations` (the `pipeline_order` the runtime then
executes). This script calls those methods on a stand-in holding only the attributes they
read (no process group, no stages), walks each rank's order and counts the (virtual stage,
micro-batch) pairs whose forward has run and whose release has not: a full backward (B)
releases a pair, an input backward (I) does not (the weight backward, W, still needs what
forward saved: `stage_backward_input` runs `autograd.grad(..., retain_graph=True)` and
keeps the graph alive through `param_groups`, `_backward.py`), W does. A compound action
(DualPipeV's overlapped forward and backward) holds both of its pairs at once, as
`analyze_pipeline_activation_liveness` in the same file counts them.

Printed per schedule, pipeline stages p, virtual stages v, micro-batches m and rank:
`held` (the most pairs live at once, in whole-rank micro-batches: pairs / v), `split`
(of those, the pairs between their I and their W at that moment, / v) and `head` (the
most micro-batches of the last stage, the one with the loss, between their I and W at
once: each keeps the gradient of its logits). The table in
`src/estimate/pipeline.rs` (its tests) is a sample of this output, which is committed
beside this script as `pipeline_in_flight.txt`.

    target/reference-venv/bin/python benches/reference/pipeline_in_flight.py

Walked with torch 2.15.0 (git d0f2af8b66b20da4baa50644c0cd3f887a2eae2e),
torch/distributed/pipelining/schedules.py.
"""

import sys
import types
from fractions import Fraction

import torch
import torch.distributed.pipelining.schedules as S

FWD, INPUT, WEIGHT, FULL = S.FORWARD, S.BACKWARD_INPUT, S.BACKWARD_WEIGHT, S.FULL_BACKWARD


def stand_in(cls, p, v, m):
    """The attributes `cls._calculate_single_rank_operations` reads."""
    me = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, n_local_stages=v)
    me._stages = [None] * v
    me.num_stages = p * v
    rounds = max(1, m // p)
    me.number_of_rounds = rounds
    me.microbatches_per_round = m // rounds
    if cls in (S.ScheduleInterleaved1F1B, S.ScheduleInterleavedZeroBubble) and m % rounds:
        return None  # the schedule's constructor refuses it
    if cls is S.ScheduleDualPipeV and m < 2 * p:
        return None
    return me


def rank_order(cls, p, v, m, rank):
    me = stand_in(cls, p, v, m)
    if me is None:
        return None
    return cls._calculate_single_rank_operations(me, rank)


def walk(order, last_stage):
    """(most pairs live, pairs between I and W then) over one rank's action order,
    and the most pairs of `last_stage` (the loss's) between their I and W at once."""
    full, split = set(), set()
    best = (0, 0)
    head = 0

    def act(a):
        key = (a.stage_index, a.microbatch_index)
        t = a.computation_type
        if t == FWD:
            full.add(key)
        elif t == INPUT:
            full.discard(key)
            split.add(key)
        elif t in (WEIGHT, FULL):
            full.discard(key)
            split.discard(key)

    for a in order:
        if a is None:
            continue
        subs = a.sub_actions or (a,)
        # Forwards first: what a compound action makes is live while its
        # backward runs.
        for s in subs:
            if s.computation_type == FWD:
                act(s)
        now = (len(full) + len(split), len(split))
        best = max(best, now)
        for s in subs:
            if s.computation_type != FWD:
                act(s)
                now = (len(full) + len(split), len(split))
                best = max(best, now)
                head = max(head, sum(1 for k in split if k[0] == last_stage))
    assert not full and not split, "every pair released"
    return best, head


SCHEDULES = {
    "looped-bfs": (S.ScheduleLoopedBFS, None),
    "interleaved-1f1b": (S.ScheduleInterleaved1F1B, None),
    "interleaved-zero-bubble": (S.ScheduleInterleavedZeroBubble, None),
    "zbv-zero-bubble": (S.ScheduleZBVZeroBubble, 2),
    "dualpipev": (S.ScheduleDualPipeV, 2),
}


def main(argv):
    print(f"# torch {torch.__version__} {torch.version.git_version}")
    print("schedule p v m rank held split head")
    for name, (cls, only_v) in SCHEDULES.items():
        for p in (2, 3, 4, 8):
            for v in (only_v,) if only_v else (1, 2, 4):
                for m in (1, 2, 3, 4, 6, 8, 12, 16, 32):
                    for rank in sorted({0, p - 1}):
                        order = rank_order(cls, p, v, m, rank)
                        if order is None:
                            continue
                        (held, split), head = walk(order, p * v - 1)
                        print(
                            name, p, v, m, rank,
                            Fraction(held, v), Fraction(split, v), head,
                        )


if __name__ == "__main__":
    main(sys.argv[1:])
