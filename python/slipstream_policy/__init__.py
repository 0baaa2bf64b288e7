"""A trained slipstream checkpoint as a Melee controller policy, from Python.

    with Policy("runs/cpu_quick-...") as policy:
        controller = policy.step(frame)      # a Frame: the game's state and the last input sent

Each step carries the temporal model's state to the next frame (reset() starts a new game) and
draws the answer from the model's distribution (temperature 1, seed 0: set_sampling changes
both; temperature 0 gives the most likely input, which for a behaviour-cloned policy mostly
stands still). The bindings are ctypes over libslipstream_policy's C interface
(policy/include/slipstream/policy.h), whose documentation holds for every call here.
"""

import ctypes
import re
import threading

from ._native import (
    BUTTON_BITS,
    BUTTONS,
    STATUS_NAMES,
    Character,
    Controller,
    Distribution,
    Frame,
    FrameTensors,
    load_library,
)

__all__ = [
    "BUTTONS",
    "BUTTON_BITS",
    "Character",
    "Controller",
    "Distribution",
    "Frame",
    "FrameTensors",
    "Policy",
    "frame_array",
    "frame_tensors",
    "PolicyError",
]


class PolicyError(RuntimeError):
    """A call the library refused: `status` names why (argument, checkpoint, config, device,
    runtime, busy), the message is the library's."""

    def __init__(self, status, message):
        self.status = STATUS_NAMES.get(status, str(status))
        super().__init__(f"{self.status}: {message}")


def frame_array(n):
    """n zeroed frames as a numpy structured array in the Frame layout (a["player"]["x"] is
    every game's x), for step_batch without a Frame object per game. Needs numpy."""
    import numpy as np
    return np.zeros(n, dtype=np.dtype(Frame))


def frame_tensors(frames, *, library=None):
    """Frames as the inputs of the step `slipstream export --format onnx` writes: a dict of
    numpy arrays, one row per frame (numeric (n, 3, 18) float32, action and character (n, 3)
    int64, stage (n,) int64, prev_controller (n, 13) float32), each frame checked as a step
    checks it (PolicyError names the field). `frames`: a Frame or a sequence of them. The model's
    state inputs are the caller's (zeros at a game's first frame, then the last `.next`)."""
    import numpy as np
    lib = load_library(library)
    if isinstance(frames, np.ndarray):  # frame_array()'s rows, read in place
        if frames.dtype != np.dtype(Frame) or frames.ndim != 1:
            raise TypeError(f"frames is a numpy array of shape {frames.shape}, not a 1-D array of "
                            "frame_array()'s dtype")
        frames = np.ascontiguousarray(frames)
        first = frames.ctypes.data_as(ctypes.POINTER(Frame))
        frames = [first[i] for i in range(len(frames))]
    else:
        frames = [frames] if isinstance(frames, Frame) else list(frames)
    rows = []
    for f in frames:
        t = FrameTensors()
        status = lib.slipstream_policy_frame_tensors(ctypes.byref(f), ctypes.byref(t))
        if status != 0:
            raise PolicyError(status, lib.slipstream_policy_error(None).decode())
        rows.append(t)
    out = {}
    for name, dtype, shape in (("numeric", np.float32, (3, 18)), ("action", np.int64, (3,)),
                               ("character", np.int64, (3,)), ("stage", np.int64, ()),
                               ("prev_controller", np.float32, (13,))):
        column = [np.ctypeslib.as_array(getattr(t, name)) if name != "stage" else t.stage
                  for t in rows]
        out[name] = np.array(column, dtype=dtype).reshape((len(rows),) + shape)
    return out


class Policy:
    def __init__(self, checkpoint, device="cpu", *, library=None):
        """Opens `checkpoint`: a run directory (its newest checkpoint), RUN/checkpoints/step-N,
        or a checkpoint directory copied out of its run. `library`: the .so to use (default:
        $SLIPSTREAM_POLICY_LIBRARY, else the installed one; one named that does not load is an
        error)."""
        self._lib = load_library(library)
        self._handle = ctypes.c_void_p()
        # Calls in progress: close() while one is (another thread's, or a signal handler's on
        # this one) leaves the freeing to the last of them, so the handle stays valid under a
        # call until it returns and close() never waits.
        self._guard = threading.RLock()  # a signal handler's close() on a thread inside it
        self._calls = 0
        self._closing = None  # the handle close() left to the last call in progress
        status = self._lib.slipstream_policy_open(
            str(checkpoint).encode(), (device or "").encode(), ctypes.byref(self._handle))
        if status != 0:
            raise PolicyError(status, self._lib.slipstream_policy_error(None).decode())
        self._controller = Controller()
        self._games = 0  # games in the stream (the last step's n)

    def _call(self, fn, *args, checked=False):
        """fn(handle, *args) on the open handle, counted as in progress (close() frees the handle
        only once no call is); `checked`: a status, raised as PolicyError with the library's
        message while the handle is still the call's. PolicyError once the policy is closed."""
        with self._guard:
            self._calls += 1  # counted first: a close() from here on leaves the handle to us
            handle = self._handle
            if not handle:
                self._leave()
                raise PolicyError(1, "the policy is closed")
        try:
            result = fn(handle, *args)
            if checked and result != 0:
                where = handle if result != 6 else None  # busy: this thread's message
                raise PolicyError(result, self._lib.slipstream_policy_error(where).decode())
            return result
        finally:
            with self._guard:
                self._leave()

    def _leave(self):
        """A call ends (under the guard): the last one frees the handle close() left to it."""
        self._calls -= 1
        if self._calls == 0 and self._closing is not None:
            closing, self._closing = self._closing, None
            self._lib.slipstream_policy_close(closing)

    def _checked(self, fn, *args):
        return self._call(fn, *args, checked=True)

    def step(self, frame):
        """The controller to press next, for `frame` (a Frame). A frame that fails validation
        raises PolicyError and changes no state."""
        out = Controller()
        self._checked(self._lib.slipstream_policy_step, ctypes.byref(frame),
                      ctypes.byref(out))
        self._games = 1
        return out

    def step_batch(self, frames):
        """One frame of each of n games (a sequence of Frame, or a ctypes array of them), stepped
        together: a list of n Controllers. Each game keeps its own state and draws; the
        first call after open or reset fixes n. `frames` may also be a numpy structured array of
        frame_array()'s dtype: the answers then come back as a numpy structured array of the
        Controller layout (fields buttons, main_x, main_y, c_x, c_y, shoulder), no copy per game."""
        if type(frames).__module__ == "numpy":
            return self._step_batch_numpy(frames)
        n = len(frames)
        if not isinstance(frames, ctypes.Array):
            frames = (Frame * n)(*frames)
        out = (Controller * n)()
        self._checked(self._lib.slipstream_policy_step_batch, n, frames, out)
        self._games = n
        return list(out)

    def _step_batch_numpy(self, frames):
        import numpy as np
        if frames.dtype != np.dtype(Frame) or frames.ndim != 1:
            raise TypeError(f"frames is a numpy array of {frames.dtype} and shape {frames.shape}; "
                            "step_batch takes a 1-D array of frame_array()'s dtype")
        frames = np.ascontiguousarray(frames)
        out = np.zeros(len(frames), dtype=np.dtype(Controller))
        self._checked(self._lib.slipstream_policy_step_batch, len(frames),
                      frames.ctypes.data_as(ctypes.POINTER(Frame)),
                      out.ctypes.data_as(ctypes.POINTER(Controller)))
        self._games = len(frames)
        return out

    def distributions(self):
        """Every game's distribution behind its last answer, as one numpy structured array of the
        Distribution layout (fields buttons (8), main_x, main_y, c_x, c_y (17), shoulder (5)).
        Raises PolicyError when a game was reset and has not stepped since."""
        import numpy as np
        if self._games == 0:
            self.distribution(0)  # raises: no game has stepped since the open or the reset
        out = np.zeros(self._games, dtype=np.dtype(Distribution))
        for game in range(self._games):
            self._checked(
                self._lib.slipstream_policy_distribution_of, game,
                out[game:game + 1].ctypes.data_as(ctypes.POINTER(Distribution)))
        return out

    def distribution(self, game=0):
        """The distribution behind game `game`'s last answer (at temperature 1)."""
        out = Distribution()
        self._checked(self._lib.slipstream_policy_distribution_of, int(game),
                      ctypes.byref(out))
        return out

    def reset(self):
        """A new game (every game of a batch): clears the model's state and restarts the
        sampling from its seed; the next step fixes the number of games again."""
        self._checked(self._lib.slipstream_policy_reset)
        self._games = 0

    def reset_game(self, game):
        """Game `game` of the batch starts again; the others carry on."""
        self._checked(self._lib.slipstream_policy_reset_game, int(game))

    def set_sampling(self, temperature=1.0, seed=0):
        """Temperature (0: the most likely input) and the seed of the draws (an int in
        [0, 2**64)); restarts every game's draws from it."""
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2**64), not {seed!r}")
        self._checked(self._lib.slipstream_policy_set_sampling, float(temperature),
                      int(seed))

    def set_threads(self, threads):
        """How many threads the steps use (1, the default: the calling thread alone); more
        spread a step_batch of many games over TBB's workers in an arena of the handle's own,
        same answers; at most the cores TBB may use."""
        self._checked(self._lib.slipstream_policy_set_threads, int(threads))

    def describe(self):
        """The checkpoint's step, model, fields, frame delay and device, one line."""
        return self._call(self._lib.slipstream_policy_describe).decode()

    @property
    def fields(self):
        """How the run read its replays (its replays.fields): "slippi" or "libmelee". Frames
        built by slipstream_policy.libmelee's frame_of follow "libmelee"."""
        found = re.search(r", fields (\w+),", self.describe())
        return found.group(1) if found else None

    @property
    def frame_delay(self):
        """The run's frame delay D (its replays.delay): each frame holds the game state of D
        frames ago with the input sent last (slipstream_policy.libmelee.DelayedFrames keeps
        them). 0: the frame just read."""
        return int(self._call(self._lib.slipstream_policy_frame_delay))

    def close(self):
        """Frees the handle, or with a call in progress (another thread's) leaves that to the
        call as it returns; either way later calls raise PolicyError. Never waits."""
        guard = getattr(self, "_guard", None)
        if guard is None:  # the open failed
            return
        with guard:
            handle, self._handle = self._handle, ctypes.c_void_p()
            if not handle:
                return
            if self._calls:
                self._closing = handle
                return
        self._lib.slipstream_policy_close(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()
