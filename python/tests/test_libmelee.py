"""The libmelee adapter (slipstream_policy.libmelee) against `slipstream infer` (ctest
policy.libmelee): libmelee reads a real replay itself (melee.Console(is_dolphin=False)), every
in-game GameState goes through frame_of and the policy, and each frame's distribution must equal
the one `slipstream infer --probabilities` writes for that frame of the same replay and port.
    SLIPSTREAM_POLICY_LIBRARY  the built libslipstream_policy.so
    SLIPSTREAM_POLICY_TEST_RUN a run trained with replays.fields=libmelee
    SLIPSTREAM_CLI             the slipstream program
    SLIPSTREAM_LIBMELEE_REPLAY a real replay (.slp) libmelee reads
Without libmelee installed the tests skip, except under CI=true, where that fails them."""

import csv
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from slipstream_policy import BUTTONS, Policy  # noqa: E402

try:
    import melee
except ImportError as e:  # noqa: F841
    melee = None
    MISSING = str(e)

RUN = os.environ.get("SLIPSTREAM_POLICY_TEST_RUN", "")
CLI = os.environ.get("SLIPSTREAM_CLI", "")
REPLAY = os.environ.get("SLIPSTREAM_LIBMELEE_REPLAY", "")
PORT = 1
HEADS = (("main_x", 17), ("main_y", 17), ("c_x", 17), ("c_y", 17), ("shoulder", 5))


def infer_probabilities(run, replay, port):
    """frame -> the 81 probabilities `slipstream infer` wrote for it."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "frames.csv")
        subprocess.run([CLI, "infer", "--checkpoint", run, "--replay", replay, "--port", str(port),
                        "--csv", out, "--probabilities"], check=True, capture_output=True)
        with open(out, newline="") as f:
            rows = list(csv.DictReader(f))
    names = ["p_" + ("DUp" if b == "D_UP" else b) for b in BUTTONS]
    names += [f"p_{h}_{c}" for h, n in HEADS for c in range(n)]
    return {int(r["frame"]): [float(r[n]) for n in names] for r in rows}


def flat(distribution):
    d = distribution.as_dict()
    return list(d["buttons"]) + [p for h, _ in HEADS for p in d[h]]


def replay_frames(replay):
    """The in-game GameStates of `replay`, as libmelee reads them."""
    console = melee.Console(is_dolphin=False, allow_old_version=True, path=replay)
    console.connect()
    while True:
        gamestate = console.step()
        if gamestate is None:
            return
        if gamestate.menu_state in (melee.Menu.IN_GAME, melee.Menu.SUDDEN_DEATH):
            yield gamestate


@unittest.skipUnless(melee or os.environ.get("CI") == "true",
                     "libmelee is not installed (pip install melee)")
class LibmeleeAdapter(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if melee is None:
            raise AssertionError(f"CI=true but libmelee does not import: {MISSING}")
        for what, value in (("SLIPSTREAM_POLICY_TEST_RUN", RUN), ("SLIPSTREAM_CLI", CLI),
                            ("SLIPSTREAM_LIBMELEE_REPLAY", REPLAY)):
            if not value or not os.path.exists(value):
                raise unittest.SkipTest(f"{what} is not set to an existing path")
        cls.reference = infer_probabilities(RUN, REPLAY, PORT)

    def play(self, frame_of):
        """max |policy - infer| over the replay's frames, frame_of(gamestate) building each."""
        worst, frames = 0.0, 0
        with Policy(RUN) as policy:
            for gamestate in replay_frames(REPLAY):
                policy.step(frame_of(gamestate))
                want = self.reference.get(int(gamestate.frame))
                if want is None:  # the last frame: no next input to predict, infer leaves it out
                    continue
                got = flat(policy.distribution())
                worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
                frames += 1
        return worst, frames

    def test_probabilities_equal_infers(self):
        from slipstream_policy.libmelee import frame_of
        worst, frames = self.play(lambda g: frame_of(g, PORT))
        print(f"libmelee adapter: max |p - infer's p| over {frames} frames: {worst:.3g}")
        self.assertEqual(frames, len(self.reference))
        self.assertLessEqual(worst, 1e-5)

    def test_a_field_mapped_wrongly_fails(self):
        # The check is sharp enough to see one field out of place: the opponent's x for ours.
        from slipstream_policy.libmelee import frame_of

        def wrong(gamestate):
            f = frame_of(gamestate, PORT)
            f.player.x = f.opponent.x
            return f
        worst, _ = self.play(wrong)
        self.assertGreater(worst, 1e-3)

    def test_the_example_bot_plays_a_replay(self):
        # python/examples/libmelee_bot.py's dry run: the policy through libmelee's reading of a
        # real replay, acting on some frames (sampling at temperature 1).
        bot = pathlib.Path(__file__).resolve().parents[1] / "examples" / "libmelee_bot.py"
        env = dict(os.environ, PYTHONPATH=str(bot.parents[1]))
        out = subprocess.run([sys.executable, str(bot), RUN, "--replay", REPLAY, "--port",
                              str(PORT), "--frames", "600"], env=env, capture_output=True,
                             text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("fields libmelee", out.stdout)
        self.assertNotIn("warning", out.stderr)
        self.assertRegex(out.stdout, r"600 frames, the policy acting on [0-9.]+ %")
        acting = float(out.stdout.split("acting on ")[1].split(" %")[0])
        self.assertGreater(acting, 0.0)

    def test_press_sets_the_pad(self):
        from slipstream_policy import Controller
        from slipstream_policy.libmelee import controller_of, press

        class Pad:  # the melee.Controller calls press() makes, recorded
            def __init__(self):
                self.state = melee.ControllerState()

            def press_button(self, b):
                self.state.button[b] = True

            def release_button(self, b):
                self.state.button[b] = False

            def tilt_analog(self, b, x, y):
                if b == melee.Button.BUTTON_MAIN:
                    self.state.main_stick = (x, y)
                else:
                    self.state.c_stick = (x, y)

            def press_shoulder(self, b, amount):
                self.state.l_shoulder = amount

        c = Controller(buttons=0b1000_0101, main_x=-1.0, main_y=0.5, c_x=0.25, c_y=0.0,
                       shoulder=0.75)
        pad = Pad()
        press(pad, c)
        pad.state.processed_button = pad.state.button
        back = controller_of(pad.state)
        self.assertEqual(back.pressed(), ["A", "X", "D_UP"])
        for name in ("main_x", "main_y", "c_x", "c_y", "shoulder"):
            self.assertAlmostEqual(getattr(back, name), getattr(c, name), places=6)


if __name__ == "__main__":
    unittest.main()
