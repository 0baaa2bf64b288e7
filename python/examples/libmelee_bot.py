"""A bot on libmelee: a checkpoint's policy plays a port of Slippi Dolphin, or, with --replay,
steps through a recorded game as libmelee reads it and reports what it would have pressed.

    python libmelee_bot.py RUN --dolphin PATH --iso ISO --port 2     # plays (Slippi Dolphin)
    python libmelee_bot.py RUN --replay game.slp --port 1           # a dry run on a replay

RUN is a run directory or a checkpoint, trained with replays.fields=libmelee (the reading libmelee
gives a bot). Needs `pip install "./python[libmelee]"` and the policy library
($SLIPSTREAM_POLICY_LIBRARY or an installed libslipstream_policy)."""

import argparse
import sys

import melee

from slipstream_policy import Policy
from slipstream_policy.libmelee import frame_of, press


def acts(c):
    """Anything pressed: a button, a stick off centre or the trigger."""
    return bool(c.buttons or c.main_x or c.main_y or c.c_x or c.c_y or c.shoulder)


def in_game(gamestate):
    return gamestate is not None and gamestate.menu_state in (melee.Menu.IN_GAME,
                                                              melee.Menu.SUDDEN_DEATH)


def play(policy, args):
    """Plays `args.port` until the console closes; a new game resets the policy's state."""
    console = melee.Console(path=args.dolphin)
    pad = melee.Controller(console=console, port=args.port)
    console.run(iso_path=args.iso)
    if not console.connect() or not pad.connect():
        sys.exit("cannot connect to Dolphin or to the controller's pipe")
    answer = None
    while True:
        gamestate = console.step()
        if gamestate is None:
            return
        if not in_game(gamestate):
            answer = None
            continue
        if answer is None:
            policy.reset()  # a new game
        answer = policy.step(frame_of(gamestate, args.port, answer))  # what it sent last frame
        press(pad, answer)  # sent on the next console.step()


def dry_run(policy, args):
    """Steps the replay's frames with the recorded player's previous inputs (as training saw
    them) and counts how often the policy acts; `slipstream infer` scores it against the player."""
    console = melee.Console(is_dolphin=False, allow_old_version=True, path=args.replay)
    console.connect()
    frames = acting = 0
    while args.frames == 0 or frames < args.frames:
        gamestate = console.step()
        if gamestate is None:
            break
        if not in_game(gamestate):
            continue
        acting += acts(policy.step(frame_of(gamestate, args.port)))
        frames += 1
    if frames == 0:
        sys.exit(f"{args.replay}: no in-game frame of port {args.port}")
    print(f"{args.replay}, port {args.port}: {frames} frames, the policy acting on "
          f"{100.0 * acting / frames:.1f} % (temperature {args.temperature}, seed {args.seed})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a run directory or a checkpoint")
    parser.add_argument("--port", type=int, required=True, help="the port the policy plays (1-4)")
    parser.add_argument("--replay", help="step through this .slp instead of playing")
    parser.add_argument("--frames", type=int, default=0, help="with --replay: at most this many")
    parser.add_argument("--dolphin", help="Slippi Dolphin's folder or executable")
    parser.add_argument("--iso", help="the Melee 1.02 ISO")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: the most likely input")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.replay and not (args.dolphin and args.iso):
        parser.error("give --replay FILE, or --dolphin and --iso to play")
    with Policy(args.checkpoint, args.device) as policy:
        policy.set_sampling(args.temperature, args.seed)
        print(policy.describe())
        if policy.fields != "libmelee":
            print(f"warning: the run read its replays with fields {policy.fields}; libmelee shows "
                  "a bot its own reading (train with --set replays.fields=libmelee)",
                  file=sys.stderr)
        (dry_run if args.replay else play)(policy, args)


if __name__ == "__main__":
    main()
