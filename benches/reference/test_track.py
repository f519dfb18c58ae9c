"""The tracker on steps small enough to count by hand (meta device, no GPU).

    python3 -m unittest benches/reference/test_track.py
"""

import os
import sys
import unittest

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from track import BLOCK, GpuSemantics, Tracker  # noqa: E402


class TrackerTest(unittest.TestCase):
    def test_rounds_to_blocks_and_sees_frees(self):
        tr = Tracker()
        with tr:
            t = torch.empty(1000, device="meta")  # 4000 bytes
            self.assertEqual(tr.live, BLOCK * 8)
            del t
            self.assertEqual(tr.live, 0)
            u = torch.empty(10, device="meta")
        self.assertEqual(tr.peak, BLOCK * 8)
        self.assertEqual(tr.live, BLOCK)
        del u

    def test_saved_tensors_are_activations_and_scratch_is_not(self):
        lin = torch.nn.Linear(256, 512, bias=False, device="meta")
        tr = Tracker()
        tr.mark(lin.weight, "weights")
        with tr:
            tr.kind = "inputs"
            x = torch.empty(8, 256, device="meta")
            tr.kind = None
            tr.set_phase("forward")
            # mm's output dies inside the expression; relu keeps its result for backward.
            loss = torch.relu(lin(x)).sum()
            tr.set_phase("backward")
            fwd = tr.breakdown_at(tr.forward_end[0])
            loss.backward()
            del loss
            tr.mark(lin.weight.grad, "gradients")
            end = tr.breakdown_at(tr.seq)
        self.assertEqual(fwd["weights"], 512 * 256 * 4)
        self.assertEqual(fwd["inputs"], 8 * 256 * 4)
        # relu's result, plus the loss scalar (one block), alive when forward ends
        self.assertEqual(fwd["activations"], 8 * 512 * 4 + BLOCK)
        self.assertEqual(fwd["temporaries"], 0)  # mm's output died inside forward
        self.assertEqual(end["gradients"], 512 * 256 * 4)
        self.assertEqual(end["activations"], 0)  # freed by backward

    def test_sdpa_takes_flash_and_keeps_no_scores(self):
        b, h, s, d = 2, 8, 1024, 64
        tr = Tracker()
        sem = GpuSemantics(tr)
        q, k, v = (torch.empty(b, h, s, d, device="meta", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        with tr, sem:
            tr.set_phase("forward")
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        self.assertEqual(sem.kernels, {"flash": 1})
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertLess(tr.peak, b * h * s * s * 2)  # the math path would keep S x S

    def test_autocast_casts_weights_once_and_tags_the_copy(self):
        lin = torch.nn.Linear(256, 256, bias=False, device="meta")
        tr = Tracker()
        tr.mark(lin.weight, "weights")
        sem = GpuSemantics(tr, torch.bfloat16)
        x = torch.empty(4, 256, device="meta", requires_grad=True)
        with tr, sem:
            tr.set_phase("forward")
            y = lin(lin(x))
            tr.set_phase("backward")
        self.assertEqual(y.dtype, torch.bfloat16)
        copies = [r for r in tr.records if r.kind == "weights" and r.phase == "forward"]
        self.assertEqual([r.bytes for r in copies], [256 * 256 * 2])  # one cached copy


if __name__ == "__main__":
    unittest.main()
