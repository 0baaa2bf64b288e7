"""The libmelee adapter (slipstream_policy.libmelee) against `slipstream infer` (ctest
policy.libmelee): libmelee reads a real replay itself (melee.Console(is_dolphin=False)), every
in-game GameState goes through frame_of and the policy, and each frame's distribution must equal
the one `slipstream infer --probabilities` writes for that frame of the same replay and port.
    SLIPSTREAM_POLICY_LIBRARY  the built libslipstream_policy.so
    SLIPSTREAM_POLICY_TEST_RUN a run trained with replays.fields=libmelee
    SLIPSTREAM_POLICY_TEST_DELAY_RUN the same at replays.delay=3
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
DELAY_RUN = os.environ.get("SLIPSTREAM_POLICY_TEST_DELAY_RUN", "")
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

    def play(self, frame_of, run=RUN, reference=None, delay=0):
        """max |policy - infer| over the replay's frames, frame_of(gamestate) building each (None:
        no step yet); with a delay, the step at frame T saw the state of T - delay."""
        reference = self.reference if reference is None else reference
        worst, frames = 0.0, 0
        with Policy(run) as policy:
            for gamestate in replay_frames(REPLAY):
                frame = frame_of(gamestate)
                if frame is None:
                    continue
                policy.step(frame)
                want = reference.get(int(gamestate.frame) - delay)
                if want is None:  # the last frames: no next input to predict, infer leaves them
                    continue
                got = flat(policy.distribution())
                worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
                frames += 1
        return worst, frames

    def test_a_delayed_run_plays_as_infer_scores_it(self):
        # A run trained at frame delay D saw each state beside the input of D frames later:
        # DelayedFrames gives the policy the same pairs, and the distributions are infer's. The
        # plain frame_of (the state of now) is not.
        from slipstream_policy.libmelee import DelayedFrames, frame_of
        if not DELAY_RUN or not os.path.exists(DELAY_RUN):
            self.skipTest("SLIPSTREAM_POLICY_TEST_DELAY_RUN is not set to an existing path")
        with Policy(DELAY_RUN) as policy:
            delay = policy.frame_delay
            self.assertIn(f"frame delay {delay}", policy.describe())
        self.assertEqual(delay, 3)
        reference = infer_probabilities(DELAY_RUN, REPLAY, PORT)
        frames = DelayedFrames(delay)
        worst, stepped = self.play(lambda g: frames.frame(g, PORT), DELAY_RUN, reference, delay)
        print(f"delay {delay}: max |p - infer's p| over {stepped} frames: {worst:.3g}")
        self.assertEqual(stepped, len(reference))
        self.assertLessEqual(worst, 1e-5)
        undelayed, _ = self.play(lambda g: frame_of(g, PORT), DELAY_RUN, reference, 0)
        self.assertGreater(undelayed, 1e-3)

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

        from slipstream_policy.libmelee import STICK_DEAD_ZONE
        c = Controller(buttons=0b1000_0101, main_x=-1.0, main_y=0.5, c_x=0.25, c_y=0.0,
                       shoulder=0.75)
        pad = Pad()
        sent = press(pad, c)
        pad.state.processed_button = pad.state.button
        back = controller_of(pad.state)
        self.assertEqual(back.pressed(), ["A", "X", "D_UP"])
        # c_x 0.25 (20 of the stick's 80 steps) is inside the game's dead zone: sent at its edge.
        self.assertAlmostEqual(sent.c_x, STICK_DEAD_ZONE, places=6)
        self.assertAlmostEqual(c.c_x, 0.25, places=6)  # the answer itself is left as it was
        for name in ("main_x", "main_y", "c_x", "c_y", "shoulder"):
            self.assertAlmostEqual(getattr(back, name), getattr(sent, name), places=6)
        for name in ("main_x", "main_y", "c_y", "shoulder"):
            self.assertAlmostEqual(getattr(sent, name), getattr(c, name), places=6)
        self.assertAlmostEqual(press(pad, Controller(main_x=-0.125)).main_x, -STICK_DEAD_ZONE,
                               places=6)


if __name__ == "__main__":
    unittest.main()
