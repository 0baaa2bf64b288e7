"""libmelee (PyPI `melee`) and the policy: a GameState seen from a port as the policy's Frame, and
the policy's Controller pressed on a melee.Controller.

    import melee
    from slipstream_policy import Policy
    from slipstream_policy.libmelee import DelayedFrames, press

    with Policy(RUN) as policy:
        frames = DelayedFrames(policy.frame_delay)  # frame_of itself for a run of delay 0
        sent = None
        while True:
            gamestate = console.step()
            if gamestate.menu_state not in (melee.Menu.IN_GAME, melee.Menu.SUDDEN_DEATH):
                if sent is not None:  # the game is over: a new one starts from scratch
                    pad.release_all()
                    policy.reset()
                    frames.reset()
                    sent = None
                continue
            frame = frames.frame(gamestate, port, sent)
            if frame is not None:
                sent = press(pad, policy.step(frame))  # the input as the game reads it

libmelee shows a bot some Post-Frame fields in its own reading: the frame counters (action frame,
hitlag, hitstun) truncated to whole frames, hitstun as the Misc AS value whatever the state,
invulnerable as the hurtbox state (and the action frame of some actions shifted by one, which
frame_of undoes with libmelee's own action data). A policy to be played through libmelee is trained on the same
reading: `--set replays.fields=libmelee` (docs/melee_features.md); with it, the frames built here
from a replay give the probabilities `slipstream infer` gives on that replay (the package's
tests check it). libmelee knows six stages (its Stage enum); any other is refused.
"""

import collections
import csv
import functools
import os

import melee

from ._native import BUTTONS, Character, Controller, Frame

# libmelee's Stage enum holds the game's internal stage ids; replays, and so the policy, use the
# Game Start (external) ids.
EXTERNAL_STAGE_ID = {
    melee.Stage.FOUNTAIN_OF_DREAMS: 2,
    melee.Stage.POKEMON_STADIUM: 3,
    melee.Stage.YOSHIS_STORY: 8,
    melee.Stage.DREAMLAND: 28,
    melee.Stage.BATTLEFIELD: 31,
    melee.Stage.FINAL_DESTINATION: 32,
}

# The policy's buttons (BUTTONS order) as libmelee's.
_MELEE_BUTTONS = (
    melee.Button.BUTTON_A,
    melee.Button.BUTTON_B,
    melee.Button.BUTTON_X,
    melee.Button.BUTTON_Y,
    melee.Button.BUTTON_Z,
    melee.Button.BUTTON_L,
    melee.Button.BUTTON_R,
    melee.Button.BUTTON_D_UP,
)


@functools.lru_cache(maxsize=None)
def _reindexed_actions():
    """(character, action) pairs whose action frame libmelee's Console shifts by one (it indexes
    every action from 1; the game and the replay index these from 0), from libmelee's own
    action data, as its Console reads it."""
    path = os.path.join(os.path.dirname(melee.__file__), "actiondata.csv")
    with open(path, newline="") as f:
        return frozenset((int(r["character"]), int(r["action"]))
                         for r in csv.DictReader(f) if r["zeroindex"] == "True")


def character_of(player, follower=False):
    """A libmelee PlayerState as the policy's Character (exists 0 for None). `follower`: Nana,
    whose action frame libmelee leaves as the game counts it."""
    c = Character()
    if player is None:
        return c
    c.exists = 1
    c.character = player.character.value
    c.action_state = max(int(player.action.value), 0)
    c.action_frame = player.action_frame
    if not follower and (c.character, c.action_state) in _reindexed_actions():
        c.action_frame -= 1  # back to the game's count, which the replay holds
    c.percent = player.percent
    c.facing = 1.0 if player.facing else -1.0
    c.x = player.position.x
    c.y = player.position.y
    c.shield = player.shield_strength
    c.jumps_left = player.jumps_left
    c.on_ground = int(bool(player.on_ground))
    c.invulnerable = int(bool(player.invulnerable))
    c.hitlag = player.hitlag_left
    c.hitstun = player.hitstun_frames_left
    c.speed_air_x = player.speed_air_x_self
    c.speed_y = player.speed_y_self
    c.speed_attack_x = player.speed_x_attack
    c.speed_attack_y = player.speed_y_attack
    c.speed_ground_x = player.speed_ground_x_self
    c.stocks = player.stock
    return c


def controller_of(state):
    """A libmelee ControllerState (the game's processed input) as the policy's Controller."""
    c = Controller()
    for bit, button in enumerate(_MELEE_BUTTONS):
        if state.processed_button[button]:
            c.buttons |= 1 << bit
    # libmelee maps the sticks' [-1, 1] onto [0, 1] and the trigger is already [0, 1].
    c.main_x = 2.0 * float(state.main_stick[0]) - 1.0
    c.main_y = 2.0 * float(state.main_stick[1]) - 1.0
    c.c_x = 2.0 * float(state.c_stick[0]) - 1.0
    c.c_y = 2.0 * float(state.c_stick[1]) - 1.0
    c.shoulder = max(float(state.l_shoulder), float(state.r_shoulder))
    return c


def frame_of(gamestate, port, controller=None):
    """What the policy sees of `gamestate` playing `port`: its character (and Nana), the other
    player's, the stage, and `controller`: the input the bot last sent (a Controller), or None to
    take the port's input from the gamestate (a replay's, or the game's read of the bot's)."""
    players = gamestate.players
    ports = sorted(int(p) for p in players)  # plain ints in messages (numpy 2 prints its types)
    if port not in players:
        raise ValueError(f"port {port} has no player in this gamestate (ports {ports})")
    others = sorted(p for p in players if p != port)
    if len(others) != 1:
        raise ValueError(f"the policy plays one-on-one: ports {ports} are in the game")
    if gamestate.stage not in EXTERNAL_STAGE_ID:
        raise ValueError(f"stage {gamestate.stage} is not one libmelee identifies; the policy "
                         f"knows the Game Start stage ids of {sorted(s.name for s in EXTERNAL_STAGE_ID)}")
    me = players[port]
    f = Frame()
    f.stage = EXTERNAL_STAGE_ID[gamestate.stage]
    f.player = character_of(me)
    f.opponent = character_of(players[others[0]])
    f.follower = character_of(me.nana, follower=True)
    f.controller = controller_of(me.controller_state) if controller is None else controller
    return f


class DelayedFrames:
    """Frames for a run trained at frame delay D (Policy.frame_delay): the model sees the game D
    frames late, beside the input sent last, as the loader paired them in training (the state of
    frame t with the input of t + D). Keeps the last D + 1 gamestates; D = 0 is frame_of."""

    def __init__(self, delay):
        if delay < 0:
            raise ValueError(f"a frame delay is 0 or more, got {delay}")
        self.delay = delay
        self._states = collections.deque(maxlen=delay + 1)

    def reset(self):
        """A new game: the states of the last one are dropped."""
        self._states.clear()

    def frame(self, gamestate, port, controller=None):
        """frame_of the gamestate D frames before `gamestate`, with `controller` (the input the
        bot sent last; None: the port's input in `gamestate`, a replay's). None for a game's
        first D frames, before there is a state D frames old: the bot presses nothing yet."""
        self._states.append(gamestate)
        if len(self._states) <= self.delay:
            return None
        if controller is None:
            if port not in gamestate.players:
                ports = sorted(int(p) for p in gamestate.players)
                raise ValueError(f"port {port} has no player in this gamestate (ports {ports})")
            controller = controller_of(gamestate.players[port].controller_state)
        return frame_of(self._states[0], port, controller)


# Melee reads a stick near its centre as centred: of the tilts the shared replays record, none
# is under 22 of the stick's 80 steps and almost none at 22 (79 of some 60,000 below 34), so the
# classes nearest the centre (+-1/8, +-1/4: 10 and 20 steps) would not register as sent. They go
# out to 23 steps, the smallest tilt the replays show the game taking.
STICK_DEAD_ZONE = 23 / 80


def _registered(value):
    if value == 0 or abs(value) >= STICK_DEAD_ZONE:
        return value
    return STICK_DEAD_ZONE if value > 0 else -STICK_DEAD_ZONE


def press(pad, controller):
    """Sets a melee.Controller to the policy's answer: the 8 buttons, both sticks, the analog
    trigger (on L). libmelee sends it on the console's next step (or pad.flush()). Returns the
    Controller as sent (a stick tilt inside the game's dead zone moved out to its edge,
    STICK_DEAD_ZONE): the input to give the policy's next frame."""
    sent = Controller.from_buffer_copy(controller)
    for name in ("main_x", "main_y", "c_x", "c_y"):
        setattr(sent, name, _registered(getattr(controller, name)))
    for bit, button in enumerate(_MELEE_BUTTONS):
        if sent.buttons & (1 << bit):
            pad.press_button(button)
        else:
            pad.release_button(button)
    pad.tilt_analog(melee.Button.BUTTON_MAIN, (sent.main_x + 1) / 2, (sent.main_y + 1) / 2)
    pad.tilt_analog(melee.Button.BUTTON_C, (sent.c_x + 1) / 2, (sent.c_y + 1) / 2)
    pad.press_shoulder(melee.Button.BUTTON_L, sent.shoulder)
    return sent


assert len(_MELEE_BUTTONS) == len(BUTTONS)
