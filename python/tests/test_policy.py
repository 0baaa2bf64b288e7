"""The Python bindings against the C library and its header (ctest policy.python):
    SLIPSTREAM_POLICY_LIBRARY  the built libslipstream_policy.so
    SLIPSTREAM_POLICY_INCLUDE  policy/include (the header the layout is checked against)
    SLIPSTREAM_POLICY_TEST_RUN a trained run (tests/policy/train_checkpoint.sh)
The layout test compiles a C program that prints every struct's size and every field's offset
from the header, so a field declared out of place or with the wrong type fails it."""

import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zipfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from slipstream_policy import (  # noqa: E402
    BUTTON_BITS, Character, Controller, Distribution, Frame, FrameTensors, Policy, PolicyError,
    frame_tensors)

RUN = os.environ.get("SLIPSTREAM_POLICY_TEST_RUN", "")
PLUGIN_RUN = os.environ.get("SLIPSTREAM_POLICY_PLUGIN_RUN", "")
INCLUDE = os.environ.get("SLIPSTREAM_POLICY_INCLUDE", "")

STRUCTS = {
    "slipstream_character": Character,
    "slipstream_controller": Controller,
    "slipstream_game_frame": Frame,
    "slipstream_distribution": Distribution,
    "slipstream_frame_tensors": FrameTensors,
}


def frame_at(t):
    """The C test's frames (tests/policy/policy_c_test.c)."""
    f = Frame(stage=32)
    p = f.player
    p.exists, p.character, p.action_state = 1, 1, 14 + t % 30
    p.action_frame, p.facing = float(t % 20), 1.0 if t % 2 else -1.0
    p.x, p.on_ground, p.stocks = float(t % 50) - 25.0, 1, 4
    ctypes.memmove(ctypes.byref(f.opponent), ctypes.byref(f.player), ctypes.sizeof(Character))
    f.opponent.character, f.opponent.x, f.opponent.percent = 2, -p.x, float(t)
    f.controller.buttons = BUTTON_BITS["A"] if t % 3 == 0 else 0
    f.controller.main_x = ((t % 17) - 8) / 8.0
    return f


def argmax(values):
    return max(range(len(values)), key=lambda i: (values[i], -i))


class Layout(unittest.TestCase):
    def test_every_field_where_the_header_puts_it(self):
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        self.assertTrue(cc, "a C compiler is needed to read the header's layout")
        self.assertTrue(INCLUDE, "SLIPSTREAM_POLICY_INCLUDE")
        lines = ["#include <slipstream/policy.h>", "#include <stddef.h>", "#include <stdio.h>",
                 "int main(void) {"]
        for c_name, py in STRUCTS.items():
            lines.append(f'  printf("{c_name} %zu\\n", sizeof({c_name}));')
            for field, _ in py._fields_:
                lines.append(f'  printf("{c_name}.{field} %zu\\n", offsetof({c_name}, {field}));')
        lines += ["  return 0;", "}"]
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            pathlib.Path(src).write_text("\n".join(lines) + "\n")
            subprocess.run([cc, "-std=c11", "-I", INCLUDE, src, "-o", exe], check=True)
            out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        header = dict(line.rsplit(" ", 1) for line in out.splitlines())
        for c_name, py in STRUCTS.items():
            self.assertEqual(int(header[c_name]), ctypes.sizeof(py), c_name)
            for field, _ in py._fields_:
                self.assertEqual(int(header[f"{c_name}.{field}"]), getattr(py, field).offset,
                                 f"{c_name}.{field}")


@unittest.skipUnless(RUN, "SLIPSTREAM_POLICY_TEST_RUN: a trained run")
class Playing(unittest.TestCase):
    def play(self, policy, frames=48):
        answers, dists = [], []
        for t in range(frames):
            answers.append(policy.step(frame_at(t)))
            dists.append(policy.distribution().as_dict())
        return answers, dists

    def test_most_likely_input_at_temperature_zero_and_reset_replays(self):
        with Policy(RUN) as policy:
            self.assertIn("step", policy.describe())
            policy.set_sampling(0.0, 0)
            answers, dists = self.play(policy)
            for c, d in zip(answers, dists):
                for name in ("buttons", "main_x", "main_y", "c_x", "c_y", "shoulder"):
                    values = d[name]
                    self.assertTrue(all(0.0 <= v <= 1.0 for v in values), name)
                    if name != "buttons":
                        self.assertAlmostEqual(sum(values), 1.0, places=4, msg=name)
                self.assertEqual(c.main_x, argmax(d["main_x"]) / 8.0 - 1.0)
                self.assertEqual(c.c_y, argmax(d["c_y"]) / 8.0 - 1.0)
                self.assertEqual(c.shoulder, argmax(d["shoulder"]) / 4.0)
                for i, p in enumerate(d["buttons"]):
                    self.assertEqual(bool(c.buttons & (1 << i)), p > 0.5)
            policy.reset()
            again, dists_again = self.play(policy)
            self.assertEqual(dists, dists_again)
            self.assertEqual([bytes(a) for a in answers], [bytes(a) for a in again])

    def test_close_waits_for_a_step_in_another_thread(self):
        # A bot shutting down (Ctrl-C leaving `with Policy(...)`) while a worker thread steps:
        # the step in progress ends normally (it frees the handle as it returns) and later calls
        # are refused; close freed the model under the step and crashed the process.
        policy = Policy(RUN)
        self.assertEqual(policy.frame_delay, 0)
        self.assertIn("frame delay 0", policy.describe())
        frames = [frame_at(t) for t in range(4096)]
        started, results = threading.Event(), []

        def worker():
            started.set()
            try:
                for _ in range(50):
                    policy.step_batch(frames)
                    results.append("ok")
            except PolicyError as e:
                results.append(str(e))

        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        time.sleep(0.05)
        policy.close()
        thread.join()
        self.assertTrue(results)
        self.assertTrue(all(r == "ok" for r in results[:-1]), results)
        self.assertTrue(results[-1] == "ok" or "closed" in results[-1], results[-1])
        with self.assertRaises(PolicyError) as e:
            policy.step(frame_at(0))
        self.assertIn("the policy is closed", str(e.exception))
        policy.close()  # twice is nothing

    def test_sampling_follows_the_seed(self):
        with Policy(RUN) as policy:
            policy.set_sampling(1.0, 7)
            a, _ = self.play(policy)
            policy.reset()
            b, _ = self.play(policy)
            policy.set_sampling(1.0, 8)
            policy.reset()
            c, _ = self.play(policy)
        self.assertEqual([bytes(x) for x in a], [bytes(x) for x in b])
        self.assertNotEqual([bytes(x) for x in a], [bytes(x) for x in c])

    def test_many_games_per_call(self):
        with Policy(RUN) as batch, Policy(RUN) as alone:
            batch.set_sampling(0.0)
            alone.set_sampling(0.0)
            for t in range(24):
                answers = batch.step_batch([frame_at(t), frame_at(t + 7), frame_at(3 * t)])
                self.assertEqual(len(answers), 3)
                single = alone.step(frame_at(t + 7))
                self.assertEqual(bytes(answers[1]), bytes(single))
                a, b = batch.distribution(1).as_dict(), alone.distribution().as_dict()
                for name in a:
                    for x, y in zip(a[name], b[name]):
                        self.assertAlmostEqual(x, y, delta=1e-5)
            batch.reset_game(2)
            with self.assertRaises(PolicyError) as e:
                batch.step_batch([frame_at(0)])
            self.assertEqual(e.exception.status, "argument")
            batch.reset()
            self.assertEqual(len(batch.step_batch([frame_at(0)])), 1)

    def test_threads_give_the_same_answers(self):
        with Policy(RUN) as one, Policy(RUN) as two:
            two.set_threads(2)
            for t in range(12):
                frames = [frame_at(t + 5 * g) for g in range(16)]
                a, b = one.step_batch(frames), two.step_batch(frames)
                self.assertEqual([bytes(x) for x in a], [bytes(x) for x in b])
            with self.assertRaises(PolicyError) as e:
                two.set_threads(0)
            self.assertEqual(e.exception.status, "argument")

    @unittest.skipUnless(PLUGIN_RUN, "SLIPSTREAM_POLICY_PLUGIN_RUN is not set")
    def test_a_graph_with_a_plugin_stage_plays(self):
        # ctypes loads the library RTLD_LOCAL; the plugin the run's graph names still finds the
        # engine in it. The run's config names the plugin by its absolute path.
        with open(os.path.join(PLUGIN_RUN, "config.yaml")) as f:
            plugins = [line.strip()[2:].split(" #")[0].strip().strip('"') for line in f
                       if line.strip().startswith("- ") and line.strip().endswith(".so")]
        self.assertTrue(plugins and all(os.path.isabs(p) for p in plugins), plugins)
        with Policy(PLUGIN_RUN) as policy:
            self.assertIn("policy_test_gain", policy.describe())
            policy.set_sampling(0.0)
            for t in range(30):
                policy.step(frame_at(t))
            d = policy.distribution().as_dict()
            self.assertAlmostEqual(sum(d["main_x"]), 1.0, places=5)

    def test_numpy_batches(self):
        import numpy as np
        from slipstream_policy import frame_array
        with Policy(RUN) as arrays, Policy(RUN) as objects:
            for t in range(10):
                frames = [frame_at(t + 3 * g) for g in range(5)]
                batch = frame_array(5)
                for g, f in enumerate(frames):  # the same bytes, field by field
                    batch[g] = np.frombuffer(bytes(f), dtype=batch.dtype)[0]
                self.assertEqual(batch["player"]["x"][2], frames[2].player.x)
                got, want = arrays.step_batch(batch), objects.step_batch(frames)
                self.assertEqual(got.dtype.names, ("buttons", "main_x", "main_y", "c_x", "c_y",
                                                   "shoulder"))
                self.assertEqual([bytes(memoryview(r)) for r in got],
                                 [bytes(c) for c in want])
                d = arrays.distributions()
                self.assertEqual(d.shape, (5,))
                for g in range(5):
                    self.assertEqual(bytes(memoryview(d[g])), bytes(objects.distribution(g)))
            with self.assertRaises(TypeError):
                arrays.step_batch(np.zeros(5, dtype=np.float32))
            # After a reset no game has an answer: an error, as distribution(g) gives.
            arrays.reset()
            with self.assertRaises(PolicyError):
                arrays.distributions()

    def test_errors_name_the_problem(self):
        with self.assertRaises(PolicyError) as e:
            Policy(os.path.join(RUN, "no-such-checkpoint"))
        self.assertEqual(e.exception.status, "checkpoint")
        with Policy(RUN) as policy:
            bad = frame_at(0)
            bad.stage = 99
            with self.assertRaises(PolicyError) as e:
                policy.step(bad)
            self.assertEqual(e.exception.status, "argument")
            self.assertIn("stage", str(e.exception))
            policy.step(frame_at(0))  # the handle still plays
            # A seed is an unsigned 64-bit int: others are refused, not wrapped.
            for seed in (-1, 2**64, 1.5, True):
                with self.assertRaises(ValueError):
                    policy.set_sampling(1.0, seed)
            policy.set_sampling(1.0, 2**64 - 1)
        # A library the caller names is the one used: one that does not load is an error naming
        # it, not a quiet step to another build's.
        with self.assertRaises(OSError) as e:
            Policy(RUN, library="/nonexistent/libslipstream_policy.so")
        self.assertIn("/nonexistent/libslipstream_policy.so does not load", str(e.exception))
        # One that loads but is another library is named as such.
        with self.assertRaises(OSError) as e:
            Policy(RUN, library="libm.so.6")
        self.assertIn("libm.so.6 is not libslipstream_policy", str(e.exception))


class FrameTensorsOf(unittest.TestCase):
    """A frame as the exported ONNX step's inputs: each field in its column, rows stacked, an
    invalid frame named."""

    def test_each_field_in_its_column(self):
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("numpy")
        f = frame_at(7)
        f.opponent.percent, f.player.shield = 35.5, 48.0
        f.controller.buttons = BUTTON_BITS["B"] | BUTTON_BITS["Z"]
        f.controller.shoulder = 1.5  # clamped to 1, as the loader clamps a recorded value
        t = frame_tensors(f)
        self.assertEqual(t["numeric"].shape, (1, 3, 18))
        self.assertEqual(t["numeric"].dtype.name, "float32")
        self.assertEqual(t["action"].dtype.name, "int64")
        player, opponent, follower = t["numeric"][0]
        self.assertEqual(player[4], 48.0)        # shield
        self.assertEqual(player[2], f.player.x)  # x
        self.assertEqual(player[17], 1.0)        # exists
        self.assertEqual(opponent[0], 35.5)      # percent
        self.assertEqual(list(follower), [0.0] * 18)  # absent: zeros
        self.assertEqual(list(t["action"][0]), [f.player.action_state, f.opponent.action_state, 0])
        self.assertEqual(list(t["character"][0]), [1, 2, 0])
        self.assertEqual(t["stage"][0], 32)
        prev = list(t["prev_controller"][0])
        self.assertEqual(prev[:8], [0, 1, 0, 0, 1, 0, 0, 0])  # B and Z
        self.assertEqual(prev[8], f.controller.main_x)
        self.assertEqual(prev[12], 1.0)
        both = frame_tensors([frame_at(1), frame_at(2)])
        self.assertEqual(both["prev_controller"].shape, (2, 13))
        self.assertEqual(both["stage"].shape, (2,))
        # frame_array()'s rows give what the Frame objects give; no frames give empty columns.
        import numpy as np
        from slipstream_policy import frame_array
        rows = frame_array(2)
        for g, fr in enumerate((frame_at(1), frame_at(2))):
            rows[g] = np.frombuffer(bytes(fr), dtype=rows.dtype)[0]
        from_rows = frame_tensors(rows)
        for name in both:
            np.testing.assert_array_equal(from_rows[name], both[name], name)
        empty = frame_tensors([])
        self.assertEqual(empty["numeric"].shape, (0, 3, 18))
        self.assertEqual(empty["stage"].shape, (0,))
        bad = frame_at(0)
        bad.player.character = 99
        with self.assertRaises(PolicyError) as e:
            frame_tensors(bad)
        self.assertEqual(e.exception.status, "argument")
        self.assertIn("frame.player.character", str(e.exception))


class Packaging(unittest.TestCase):
    def test_a_wheel_builds(self):
        # Offline (no build isolation), setuptools builds wheels with the `wheel` package, or
        # itself from 70.1 on.
        try:
            import wheel  # noqa: F401
        except ImportError:
            import setuptools
            version = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
            if version < (70, 1) and os.environ.get("CI") != "true":
                self.skipTest(f"setuptools {setuptools.__version__} builds wheels offline only "
                              "with the `wheel` package (pip install wheel)")
        root = pathlib.Path(__file__).resolve().parents[1]
        with tempfile.TemporaryDirectory() as d:
            # A copy: building in place would leave build/ and *.egg-info in the repository.
            src = os.path.join(d, "src")
            shutil.copytree(root, src, ignore=shutil.ignore_patterns("__pycache__", "tests"))
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", os.path.join(d, "dist"), src],
                           check=True)
            wheels = list(pathlib.Path(d, "dist").glob("slipstream_policy-*.whl"))
            self.assertEqual(len(wheels), 1)
            names = zipfile.ZipFile(wheels[0]).namelist()
        self.assertIn("slipstream_policy/__init__.py", names)
        self.assertIn("slipstream_policy/_native.py", names)


if __name__ == "__main__":
    unittest.main()
