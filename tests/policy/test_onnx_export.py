"""`slipstream export --format onnx` under ONNX Runtime (ctest policy.onnx_export): tiny runs of
each temporal model are trained, exported with a replay's frames recorded (the step's inputs and
our own step's logits, `infer`'s computation), and the exported step is run frame by frame with
its state fed back; every frame's probabilities must equal ours within 1e-5.
    SLIPSTREAM_CLI     the slipstream program
    SLIPSTREAM_SOURCE  the source tree (configs/)
    SLIPSTREAM_REPLAY  a replay (.slp); without one, a synthetic game is written
    SLIPSTREAM_POLICY_LIBRARY  libslipstream_policy, for the Python bot on ONNX Runtime (its
                       frames through slipstream_policy.frame_tensors; skipped without it)
Without onnxruntime installed (pip install onnxruntime) the tests skip, except under CI=true,
where that fails them."""

import ctypes
import json
import os
import pathlib
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))

try:
    import onnxruntime
except ImportError as e:  # noqa: F841
    onnxruntime = None
    MISSING = str(e)

CLI = os.environ.get("SLIPSTREAM_CLI", "")
LIBRARY = os.environ.get("SLIPSTREAM_POLICY_LIBRARY", "")
SOURCE = os.environ.get("SLIPSTREAM_SOURCE", "")
REPLAY = os.environ.get("SLIPSTREAM_REPLAY", "")
HEADS = ("buttons", "main_x", "main_y", "c_x", "c_y", "shoulder")
WIDTHS = (8, 17, 17, 17, 17, 5)


def read_safetensors(path):
    """name -> numpy array (the header, then the raw little-endian data)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    types = {"F32": np.float32, "I32": np.int32, "I64": np.int64}
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        begin, end = v["data_offsets"]
        data = blob[8 + n + begin:8 + n + end]
        out[name] = np.frombuffer(data, dtype=types[v["dtype"]]).reshape(v["shape"])
    return out


def probabilities(logits):
    """The 81 logits -> the policy's distribution: sigmoid per button, softmax per axis."""
    parts, off = [], 0
    for head, w in zip(HEADS, WIDTHS):
        z = logits[off:off + w]
        if head == "buttons":
            parts.append(1 / (1 + np.exp(-z)))
        else:
            e = np.exp(z - z.max())
            parts.append(e / e.sum())
        off += w
    return np.concatenate(parts)


def run(args, cwd=None):
    r = subprocess.run([CLI] + args, capture_output=True, text=True, cwd=cwd)
    return r.returncode, r.stdout + r.stderr


@unittest.skipIf(onnxruntime is None and os.environ.get("CI") != "true",
                 "onnxruntime not installed (pip install onnxruntime)")
class OnnxExport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if onnxruntime is None:
            raise unittest.SkipTest("onnxruntime not installed: " + MISSING)
        cls.dir = tempfile.TemporaryDirectory()
        cls.replay = REPLAY
        if not cls.replay or not os.path.exists(cls.replay):
            code, out = run(["synth", "--out", os.path.join(cls.dir.name, "synth"),
                             "--games", "1", "--frames", "1200"])
            assert code == 0, out
            cls.replay = os.path.join(cls.dir.name, "synth", sorted(
                os.listdir(os.path.join(cls.dir.name, "synth")))[0])

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def train(self, name, graph, sets):
        d = os.path.join(self.dir.name, name)
        args = ["run", "--config", os.path.join(SOURCE, "configs", graph),
                "--set", "replays.batch_size=8", "--set", "replays.window=16",
                "--set", "replays.stride=16", "--set", "replays.synthetic=4",
                "--set", "replays.synthetic_dir=" + os.path.join(d, "synth"),
                "--set", "run.steps=3", "--set", "run.validate_every=0",
                "--set", "run.device=cpu", "--set", "run.runs_dir=" + os.path.join(d, "runs")]
        for s in sets:
            args += ["--set", s]
        code, out = run(args)
        self.assertEqual(code, 0, out)
        runs = os.listdir(os.path.join(d, "runs"))
        return os.path.join(d, "runs", runs[0])

    def export_and_compare(self, name, graph, sets, frames=1000):
        run_dir = self.train(name, graph, sets)
        model = os.path.join(self.dir.name, name + ".onnx")
        samples = os.path.join(self.dir.name, name + ".safetensors")
        code, out = run(["export", "--checkpoint", run_dir, "--format", "onnx", "--out", model,
                         "--replay", self.replay, "--port", "1", "--frames", str(frames),
                         "--samples", samples])
        self.assertEqual(code, 0, out)
        rec = read_safetensors(samples)
        for ids in ("action", "character", "stage"):  # fed to the model as they are
            self.assertEqual(rec[ids].dtype, np.int64, ids)
        sess = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        outputs = [o.name for o in sess.get_outputs()]
        state = {i.name: np.zeros([1] + list(i.shape[1:]), np.float32)
                 for i in sess.get_inputs() if i.name.startswith("core.")}
        self.assertTrue(state, "the exported step has no state inputs")
        n = rec["logits"].shape[0]
        self.assertEqual(n, frames)
        worst = 0.0
        for t in range(n):
            feed = {"numeric": rec["numeric"][t:t + 1],
                    "prev_controller": rec["prev_controller"][t:t + 1],
                    "action": rec["action"][t:t + 1],
                    "character": rec["character"][t:t + 1],
                    "stage": rec["stage"][t:t + 1]}
            feed.update(state)
            got = dict(zip(outputs, sess.run(outputs, feed)))
            for k in state:
                state[k] = got[k + ".next"]
            p = np.concatenate([got[h][0] for h in HEADS])
            worst = max(worst, float(np.abs(p - probabilities(rec["logits"][t])).max()))
        self.assertLessEqual(worst, 1e-5, name)
        # The state matters: the same frames from zero state each time give other numbers.
        cold = {k: np.zeros_like(v) for k, v in state.items()}
        t = n - 1
        feed.update(cold)
        got = dict(zip(outputs, sess.run(outputs, feed)))
        p = np.concatenate([got[h][0] for h in HEADS])
        self.assertGreater(float(np.abs(p - probabilities(rec["logits"][t])).max()), 1e-5)
        return worst

    def test_mamba(self):
        # With the optimizer's EMA: the policy plays the EMA weights, and so must the export.
        self.export_and_compare("mamba", "train_bc.yaml",
                                ["core.d_model=16", "core.layers=2", "core.d_state=8",
                                 "step.ema=0.9"])

    def test_mamba_without_input_proj_or_classes(self):
        # d_model = the embedding's width without the class columns (192): no input_proj; a conv
        # of width 1 (no conv state); a hidden layer in the heads.
        self.export_and_compare("mamba_plain", "train_bc.yaml",
                                ["embed.prev_classes=false", "core.d_model=192",
                                 "core.layers=1", "core.d_state=4", "core.d_conv=1",
                                 "core.expand=1", "heads.hidden=8"])

    def test_gru(self):
        self.export_and_compare("gru", "train_bc_gru.yaml",
                                ["core.hidden=16", "core.layers=2", "heads.hidden=8"])

    def test_a_python_bot_on_onnx_runtime_answers_as_the_policy(self):
        """A serving stack's loop: each frame through slipstream_policy.frame_tensors into the
        exported step, its state fed back; the distribution equals the policy library's own
        step on the same frames."""
        if not LIBRARY:
            self.skipTest("SLIPSTREAM_POLICY_LIBRARY")
        from slipstream_policy import BUTTON_BITS, Character, Frame, Policy, frame_tensors
        run_dir = self.train("bot", "train_bc.yaml",
                             ["core.d_model=16", "core.layers=2", "core.d_state=8"])
        model = os.path.join(self.dir.name, "bot.onnx")
        code, out = run(["export", "--checkpoint", run_dir, "--out", model])
        self.assertEqual(code, 0, out)
        sess = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        outputs = [o.name for o in sess.get_outputs()]
        state = {i.name: np.zeros([1] + list(i.shape[1:]), np.float32)
                 for i in sess.get_inputs() if i.name.startswith("core.")}
        worst = 0.0
        with Policy(run_dir, library=LIBRARY) as policy:
            for t in range(200):
                f = Frame(stage=32)
                p = f.player
                p.exists, p.character, p.action_state = 1, 9, 14 + t % 40
                p.action_frame, p.facing, p.x = float(t % 25), 1.0 if t % 2 else -1.0, t % 60 - 30.0
                p.y, p.on_ground, p.stocks, p.percent = float(t % 7), t % 5 != 0, 4, t * 0.5
                ctypes.memmove(ctypes.byref(f.opponent), ctypes.byref(p), ctypes.sizeof(Character))
                f.opponent.character, f.opponent.x = 20, -p.x
                f.controller.buttons = BUTTON_BITS["A"] if t % 4 == 0 else 0
                f.controller.main_x = ((t % 17) - 8) / 8.0
                policy.step(f)
                want = policy.distribution().as_dict()
                feed = frame_tensors(f, library=LIBRARY)
                feed.update(state)
                got = dict(zip(outputs, sess.run(outputs, feed)))
                for k in state:
                    state[k] = got[k + ".next"]
                for head in HEADS:
                    worst = max(worst, float(np.abs(got[head][0] - np.array(want[head])).max()))
        self.assertLessEqual(worst, 1e-5)

    def test_autoregressive_heads_are_refused(self):
        run_dir = self.train("ar", "train_bc.yaml",
                             ["core.d_model=16", "core.layers=1", "heads.autoregressive=true"])
        code, out = run(["export", "--checkpoint", run_dir, "--out",
                         os.path.join(self.dir.name, "ar.onnx")])
        self.assertEqual(code, 1, out)
        self.assertIn("autoregressive", out)
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "ar.onnx")))


if __name__ == "__main__":
    unittest.main()
