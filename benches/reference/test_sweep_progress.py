"""The sweep's progress line: on a terminal only, quiet in pipes and CI.

    python3 -m unittest benches/reference/test_sweep_progress.py
"""

import io
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sweep import Progress, progress_wanted  # noqa: E402


class Tty(io.StringIO):
    def isatty(self):
        return True


class ProgressTest(unittest.TestCase):
    def test_auto_is_on_for_a_terminal_only_and_never_in_ci(self):
        self.assertTrue(progress_wanted("auto", Tty(), {"TERM": "xterm"}))
        self.assertFalse(progress_wanted("auto", io.StringIO(), {"TERM": "xterm"}))
        self.assertFalse(progress_wanted("auto", Tty(), {"CI": "true"}))
        self.assertFalse(progress_wanted("auto", Tty(), {"TERM": "dumb"}))
        self.assertTrue(progress_wanted("always", io.StringIO(), {"CI": "true"}))
        self.assertFalse(progress_wanted("never", Tty(), {}))

    def test_the_line_counts_and_estimates_the_time_left(self):
        out = Tty()
        ticks = iter([0.0, 10.0, 20.0])
        p = Progress(4, out, True, clock=lambda: next(ticks))
        p.step("a")
        p.step("b", failed=True)
        p.close()
        text = out.getvalue()
        self.assertIn("[1/4] 0 failed, 10 s, ~30 s left: a", text)
        self.assertIn("[2/4] 1 failed, 20 s, ~20 s left: b", text)
        self.assertTrue(text.endswith("\r\x1b[K"))

    def test_a_failure_line_starts_on_a_cleared_line(self):
        out = Tty()
        p = Progress(3, out, True, clock=iter([0.0, 1.0]).__next__)
        p.step("a", failed=True)
        p.clear()
        out.write("a: failed\n")
        self.assertTrue(out.getvalue().endswith("\r\x1b[Ka: failed\n"))

    def test_off_writes_nothing(self):
        out = io.StringIO()
        p = Progress(2, out, False)
        p.step("a")
        p.close()
        self.assertEqual(out.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
