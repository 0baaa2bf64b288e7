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
from slipstream_policy.libmelee import EXTERNAL_STAGE_ID, DelayedFrames, press


def acts(c):
    """Anything pressed: a button, a stick off centre or the trigger."""
    return bool(c.buttons or c.main_x or c.main_y or c.c_x or c.c_y or c.shoulder)


def in_game(gamestate):
    return gamestate is not None and gamestate.menu_state in (melee.Menu.IN_GAME,
                                                              melee.Menu.SUDDEN_DEATH)


def play(policy, args):
    """Plays `args.port` until the console closes: the menus through libmelee's MenuHelper (its
    character and stage; pick the opponent's at the other port), each game from a fresh state,
    the controller released when a game ends."""
    console = melee.Console(path=args.dolphin)
    pad = melee.Controller(console=console, port=args.port)
    console.run(iso_path=args.iso)
    if not console.connect() or not pad.connect():
        sys.exit("cannot connect to Dolphin or to the controller's pipe")
    menus = melee.MenuHelper()
    character = melee.Character[args.character.upper()]
    stage = melee.Stage[args.stage.upper()]
    frames = DelayedFrames(policy.frame_delay)
    sent = None  # the input the bot sent last, as the game reads it
    playing = said = False  # said: the frame the policy cannot see was reported this game
    while True:
        gamestate = console.step()
        if gamestate is None:
            return
        if not in_game(gamestate):
            if playing:  # the game is over: nothing stays held through the menus
                pad.release_all()
                playing, sent = False, None
            menus.menu_helper_simple(gamestate, pad, character, stage, cpu_level=0,
                                     autostart=args.autostart)
            continue
        if not playing:  # a new game: nothing the menus left pressed, a fresh state
            pad.release_all()
            policy.reset()
            frames.reset()
            playing, said = True, False
        try:
            frame = frames.frame(gamestate, args.port, sent)
        except ValueError as e:  # a stage or a player the policy cannot see: stand still
            if not said:  # once a game, not sixty lines a second
                print(f"frame {gamestate.frame}: {e}; standing still", file=sys.stderr)
                said = True
            pad.release_all()
            sent = None
            continue
        if frame is not None:  # with a frame delay, nothing for a game's first D frames
            sent = press(pad, policy.step(frame))  # sent on the next console.step()


def dry_run(policy, args):
    """Steps the replay's frames with the recorded player's inputs (as training paired them,
    the state D frames late with a delay) and counts how often the policy acts; `slipstream
    infer` scores it against the player."""
    console = melee.Console(is_dolphin=False, allow_old_version=True, path=args.replay)
    console.connect()
    frames = DelayedFrames(policy.frame_delay)
    stepped = acting = 0
    while args.frames == 0 or stepped < args.frames:
        try:
            gamestate = console.step()
        except Exception as e:  # libmelee's reading of an old or odd replay
            sys.exit(f"{args.replay}: libmelee cannot read it ({type(e).__name__}: {e})")
        if gamestate is None:
            break
        if not in_game(gamestate):
            continue
        if args.port not in gamestate.players:
            sys.exit(f"{args.replay}: port {args.port} has no player (ports "
                     f"{sorted(int(p) for p in gamestate.players)})")
        try:
            frame = frames.frame(gamestate, args.port)
        except ValueError as e:  # a game the policy cannot see (not one-on-one, another stage)
            sys.exit(f"{args.replay}: {e}")
        if frame is None:
            continue
        acting += acts(policy.step(frame))
        stepped += 1
    if stepped == 0:
        sys.exit(f"{args.replay}: no in-game frame of port {args.port}")
    print(f"{args.replay}, port {args.port}: {stepped} frames, the policy acting on "
          f"{100.0 * acting / stepped:.1f} % (temperature {args.temperature}, seed {args.seed})")


def port_number(text):
    port = int(text)
    if not 1 <= port <= 4:
        raise argparse.ArgumentTypeError(f"a port is 1 to 4, got {port}")
    return port


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a run directory or a checkpoint")
    parser.add_argument("--port", type=port_number, required=True,
                        help="the port the policy plays (1-4)")
    parser.add_argument("--replay", help="step through this .slp instead of playing")
    parser.add_argument("--frames", type=int, default=0, help="with --replay: at most this many")
    parser.add_argument("--dolphin", help="Slippi Dolphin's folder or executable")
    parser.add_argument("--iso", help="the Melee 1.02 ISO")
    parser.add_argument("--character", default="fox",
                        help="the bot's character at the menus (libmelee's Character name)")
    parser.add_argument("--stage", default="final_destination",
                        help="the stage it picks (libmelee's Stage name: battlefield, "
                        "final_destination, dreamland, yoshis_story, fountain_of_dreams, "
                        "pokemon_stadium)")
    parser.add_argument("--autostart", action="store_true",
                        help="start the game once both ports are ready (no one at the menus)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: the most likely input")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.replay and not (args.dolphin and args.iso):
        parser.error("give --replay FILE, or --dolphin and --iso to play")
    # The stages the policy can see (libmelee names six) and the characters one can pick.
    choices = {"stage": sorted(s.name.lower() for s in EXTERNAL_STAGE_ID),
               "character": sorted(c.name.lower() for c in melee.Character
                                   if c.name not in ("UNKNOWN_CHARACTER", "WIREFRAME_MALE",
                                                     "WIREFRAME_FEMALE", "GIGA_BOWSER", "SANDBAG",
                                                     "NANA"))}
    for name, allowed in choices.items():
        if getattr(args, name).lower() not in allowed:
            parser.error(f"--{name} {getattr(args, name)}: not one of {', '.join(allowed)}")
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
