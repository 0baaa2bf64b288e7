"""The C interface of libslipstream_policy (policy/include/slipstream/policy.h) in ctypes: its
structs field for field, and the library found and its functions typed. The layout is checked
against the header by tests/test_policy.py (a field out of place fails it)."""

import ctypes
import ctypes.util
import os
import shutil
import subprocess

INTERFACE_VERSION = 5  # SLIPSTREAM_POLICY_VERSION of the header these bindings follow

OK, E_ARGUMENT, E_CHECKPOINT, E_CONFIG, E_DEVICE, E_RUNTIME, E_BUSY = range(7)
STATUS_NAMES = {
    OK: "ok",
    E_ARGUMENT: "argument",
    E_CHECKPOINT: "checkpoint",
    E_CONFIG: "config",
    E_DEVICE: "device",
    E_RUNTIME: "runtime",
    E_BUSY: "busy",
}

# Buttons, as bits of Controller.buttons (SLIPSTREAM_BUTTON_*), in the distribution's order.
BUTTONS = ("A", "B", "X", "Y", "Z", "L", "R", "D_UP")
BUTTON_BITS = {name: 1 << i for i, name in enumerate(BUTTONS)}


class Character(ctypes.Structure):
    """One character's state after the frame, in a Slippi replay's Post-Frame Update units."""

    _fields_ = [
        ("exists", ctypes.c_int32),
        ("character", ctypes.c_int32),
        ("action_state", ctypes.c_int32),
        ("action_frame", ctypes.c_float),
        ("percent", ctypes.c_float),
        ("facing", ctypes.c_float),
        ("x", ctypes.c_float),
        ("y", ctypes.c_float),
        ("shield", ctypes.c_float),
        ("jumps_left", ctypes.c_float),
        ("on_ground", ctypes.c_int32),
        ("invulnerable", ctypes.c_int32),
        ("hitlag", ctypes.c_float),
        ("hitstun", ctypes.c_float),
        ("speed_air_x", ctypes.c_float),
        ("speed_y", ctypes.c_float),
        ("speed_attack_x", ctypes.c_float),
        ("speed_attack_y", ctypes.c_float),
        ("speed_ground_x", ctypes.c_float),
        ("stocks", ctypes.c_int32),
    ]


class Controller(ctypes.Structure):
    """A controller: what the policy answers, and the player's last input in a frame."""

    _fields_ = [
        ("buttons", ctypes.c_uint32),
        ("main_x", ctypes.c_float),
        ("main_y", ctypes.c_float),
        ("c_x", ctypes.c_float),
        ("c_y", ctypes.c_float),
        ("shoulder", ctypes.c_float),
    ]

    def pressed(self):
        """The names of the pressed buttons, in BUTTONS order."""
        return [name for name in BUTTONS if self.buttons & BUTTON_BITS[name]]

    def __repr__(self):
        return (
            f"Controller(buttons={self.pressed()}, main=({self.main_x:+.3f}, {self.main_y:+.3f}), "
            f"c=({self.c_x:+.3f}, {self.c_y:+.3f}), shoulder={self.shoulder:.2f})"
        )


class Frame(ctypes.Structure):
    """What the policy sees of one frame (slipstream_game_frame)."""

    _fields_ = [
        ("stage", ctypes.c_int32),
        ("player", Character),
        ("opponent", Character),
        ("follower", Character),
        ("controller", Controller),
    ]


class Distribution(ctypes.Structure):
    """The policy's distribution over the next input: per-button press probabilities; stick class
    k is the value k / 8 - 1 (8 is neutral), shoulder class k is k / 4."""

    _fields_ = [
        ("buttons", ctypes.c_float * 8),
        ("main_x", ctypes.c_float * 17),
        ("main_y", ctypes.c_float * 17),
        ("c_x", ctypes.c_float * 17),
        ("c_y", ctypes.c_float * 17),
        ("shoulder", ctypes.c_float * 5),
    ]

    def as_dict(self):
        return {name: list(getattr(self, name)) for name, _ in self._fields_}


class FrameTensors(ctypes.Structure):
    """One frame as the ONNX step of `slipstream export --format onnx` reads it
    (slipstream_frame_tensors): row 0 of its inputs of the same names."""

    _fields_ = [
        ("numeric", (ctypes.c_float * 18) * 3),
        ("action", ctypes.c_int64 * 3),
        ("character", ctypes.c_int64 * 3),
        ("stage", ctypes.c_int64),
        ("prev_controller", ctypes.c_float * 13),
    ]


def _candidates(explicit):
    # A library the caller names (the argument, else the variable) is the only one tried: a
    # silent fallback would play another build's policy.
    if explicit:
        yield explicit
        return
    if os.environ.get("SLIPSTREAM_POLICY_LIBRARY"):
        yield os.environ["SLIPSTREAM_POLICY_LIBRARY"]
        return
    if shutil.which("pkg-config"):
        try:
            libdir = subprocess.run(
                ["pkg-config", "--variable=libdir", "slipstream_policy"],
                capture_output=True, text=True, check=True,
            ).stdout.strip()
            if libdir:
                yield os.path.join(libdir, "libslipstream_policy.so")
        except (subprocess.CalledProcessError, OSError):
            pass
    found = ctypes.util.find_library("slipstream_policy")
    if found:
        yield found


def load_library(explicit=None):
    """The library: `explicit`, else $SLIPSTREAM_POLICY_LIBRARY, else the installed one
    (pkg-config slipstream_policy, then the loader's search path). A library named by the
    argument or the variable that does not load is an error, not a step to the next."""
    named = explicit or os.environ.get("SLIPSTREAM_POLICY_LIBRARY")
    tried = []
    for path in _candidates(explicit):
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            if named:  # the one library asked for: why it did not load, not "not found"
                raise OSError(f"{path} does not load: {e}") from None
            tried.append(f"{path} ({e})")
            continue
        if not hasattr(lib, "slipstream_policy_version"):
            raise OSError(f"{path} is not libslipstream_policy (it has no "
                          "slipstream_policy_version)")
        _declare(lib)
        version = lib.slipstream_policy_version()
        if version < INTERFACE_VERSION:  # a newer library serves older programs
            raise OSError(
                f"{path} implements interface version {version}; these bindings need "
                f"version {INTERFACE_VERSION} or later"
            )
        return lib
    raise OSError(
        "libslipstream_policy not found: install it (cmake --install BUILD --component policy) "
        "or set SLIPSTREAM_POLICY_LIBRARY to the .so"
        + (" (tried: " + "; ".join(tried) + ")" if tried else "")
    )


def _declare(lib):
    handle = ctypes.c_void_p
    status = ctypes.c_int
    signatures = {
        "slipstream_policy_version": (ctypes.c_int, []),
        "slipstream_policy_open": (
            status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(handle)]),
        "slipstream_policy_reset": (status, [handle]),
        "slipstream_policy_step": (
            status, [handle, ctypes.POINTER(Frame), ctypes.POINTER(Controller)]),
        "slipstream_policy_distribution": (status, [handle, ctypes.POINTER(Distribution)]),
        "slipstream_policy_step_batch": (
            status, [handle, ctypes.c_int32, ctypes.POINTER(Frame), ctypes.POINTER(Controller)]),
        "slipstream_policy_reset_game": (status, [handle, ctypes.c_int32]),
        "slipstream_policy_distribution_of": (
            status, [handle, ctypes.c_int32, ctypes.POINTER(Distribution)]),
        "slipstream_policy_set_sampling": (status, [handle, ctypes.c_float, ctypes.c_uint64]),
        "slipstream_policy_set_threads": (status, [handle, ctypes.c_int32]),
        "slipstream_policy_frame_tensors": (
            status, [ctypes.POINTER(Frame), ctypes.POINTER(FrameTensors)]),
        "slipstream_policy_describe": (ctypes.c_char_p, [handle]),
        "slipstream_policy_frame_delay": (ctypes.c_int32, [handle]),
        "slipstream_policy_error": (ctypes.c_char_p, [handle]),
        "slipstream_policy_close": (None, [handle]),
    }
    for name, (restype, argtypes) in signatures.items():
        if not hasattr(lib, name):
            raise OSError(f"{lib._name} has no {name}: not a libslipstream_policy of interface "
                          f"version {INTERFACE_VERSION}")
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
