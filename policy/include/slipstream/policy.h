/* libslipstream_policy: a trained slipstream checkpoint as a Melee controller policy inside a
 * program that plays (a bot). Open a checkpoint, then once per game frame hand the policy the
 * game's state and get back the controller to press. The temporal model carries its state from
 * one frame to the next (Mamba: its conv window and SSM state; GRU: its hidden state), so a step
 * costs one frame's work, and the answers equal the training graph's window forward over the
 * same frames.
 *
 * The policy is the graph the checkpoint's weights carry (the run's config.yaml as it was at that
 * step; for checkpoints older than that, RUN/config.yaml) with its replay loader replaced by a feed
 * of these frames, the checkpoint's weights loaded (the EMA weights when the run kept them):
 * the features are the ones the model trained on (docs/melee_features.md).
 *
 * Threads: thread-compatible. Distinct handles may be used from distinct threads at once; one
 * handle from one thread at a time: a call that finds its handle in use by another thread
 * returns SLIPSTREAM_E_BUSY and changes nothing. A step runs on the calling thread alone unless
 * slipstream_policy_set_threads gave the handle more.
 * Errors: no C++ exception crosses this interface. Every call returns a status; the message of
 * the last failed call on a handle is slipstream_policy_error(handle), and of a failed call
 * without one (slipstream_policy_open, a NULL handle) on this thread slipstream_policy_error(NULL).
 */
#ifndef SLIPSTREAM_POLICY_H
#define SLIPSTREAM_POLICY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLIPSTREAM_POLICY_VERSION                              \
  5 /* this header's interface; see slipstream_policy_version. \
     2: many games per call (step_batch, reset_game,           \
     distribution_of); 3: set_threads; 4: frame_tensors;       \
     5: frame_delay; a program of an earlier version runs      \
     unchanged */

typedef enum slipstream_status {
  SLIPSTREAM_OK = 0,
  SLIPSTREAM_E_ARGUMENT = 1,   /* a NULL pointer or empty path; a frame's id, flag or button
                                  field out of range, or a field not finite (sticks and triggers
                                  are clamped); a game index or count the stream does not have; a
                                  distribution before the game's first step; a temperature or
                                  thread count out of range */
  SLIPSTREAM_E_CHECKPOINT = 2, /* no checkpoint there, or one that does not load (damaged, or
                                  made by another graph or other sizes) */
  SLIPSTREAM_E_CONFIG = 3,     /* the run's config cannot be rebuilt into a policy */
  SLIPSTREAM_E_DEVICE = 4,     /* the device asked for is not available */
  SLIPSTREAM_E_RUNTIME = 5,    /* a stage failed while stepping (the message names it) */
  SLIPSTREAM_E_BUSY = 6        /* the handle is in use by another thread at this moment (the
                                  message is this thread's: slipstream_policy_error(NULL)) */
} slipstream_status;

/* Buttons, as bits of slipstream_controller.buttons. */
enum {
  SLIPSTREAM_BUTTON_A = 1u << 0,
  SLIPSTREAM_BUTTON_B = 1u << 1,
  SLIPSTREAM_BUTTON_X = 1u << 2,
  SLIPSTREAM_BUTTON_Y = 1u << 3,
  SLIPSTREAM_BUTTON_Z = 1u << 4,
  SLIPSTREAM_BUTTON_L = 1u << 5, /* digital L */
  SLIPSTREAM_BUTTON_R = 1u << 6, /* digital R */
  SLIPSTREAM_BUTTON_D_UP = 1u << 7,
  SLIPSTREAM_BUTTONS_ALL = 0xffu
};

/* One character's state after the frame, in the units of a Slippi replay's Post-Frame Update
 * (project-slippi SPEC.md), which is what the model trained on. A run trained with
 * replays.fields=libmelee read them as libmelee shows them (docs/loader.md): give it libmelee's
 * values (python/slipstream_policy/libmelee.py builds them). */
typedef struct slipstream_character {
  int32_t exists;       /* 1: the slot has a character this frame; 0: every other field is
                           ignored (the model sees zeros, as in training) */
  int32_t character;    /* internal character id, 0..32 */
  int32_t action_state; /* action state id, >= 0 (ids past 398 read as 398, as in training) */
  float action_frame;   /* frames into the action state ("action state frame counter") */
  float percent;        /* damage percent */
  float facing;         /* +1 facing right, -1 left */
  float x, y;           /* position */
  float shield;         /* shield size, 0..60 */
  float jumps_left;     /* jumps remaining */
  int32_t on_ground;    /* 1 grounded, 0 airborne */
  int32_t invulnerable; /* 1 while intangible or invincible (state bit flags 2, 0x04) */
  float hitlag;         /* hitlag frames left */
  float hitstun;        /* hitstun frames left; 0 when not in hitstun (state bit flags 4, 0x02) */
  float speed_air_x;    /* self-induced air x speed */
  float speed_y;        /* self-induced y speed */
  float speed_attack_x; /* knockback x speed */
  float speed_attack_y; /* knockback y speed */
  float speed_ground_x; /* self-induced ground x speed */
  int32_t stocks;       /* stocks remaining */
} slipstream_character;

/* A controller: what the policy answers, and the player's last input in a frame. */
typedef struct slipstream_controller {
  uint32_t buttons; /* SLIPSTREAM_BUTTON_* bits */
  float main_x;     /* main stick, [-1, 1] */
  float main_y;
  float c_x; /* C-stick, [-1, 1] */
  float c_y;
  float shoulder; /* analog trigger (the larger of L and R), [0, 1] */
} slipstream_controller;

/* What the policy sees of one frame. */
typedef struct slipstream_game_frame {
  int32_t stage;                    /* stage id (Game Start), 0..63 */
  slipstream_character player;      /* the character the policy plays */
  slipstream_character opponent;    /* the other player's character */
  slipstream_character follower;    /* the player's Ice Climbers follower (Nana); exists 0 else */
  slipstream_controller controller; /* the player's input the model conditions on: the last
                                       controller the program sent (with a run trained at frame
                                       delay D, the input of frame t + D) */
} slipstream_game_frame;

/* The policy's distribution over the next input, as probabilities. Stick class k is the value
 * k / 8 - 1 (class 8 is neutral); shoulder class k is k / 4. */
typedef struct slipstream_distribution {
  float buttons[8]; /* probability that each button (bit order) is pressed */
  float main_x[17];
  float main_y[17];
  float c_x[17];
  float c_y[17];
  float shoulder[5];
} slipstream_distribution;

typedef struct slipstream_policy slipstream_policy;

/* SLIPSTREAM_POLICY_VERSION of the library as built (compare with the header's). */
int slipstream_policy_version(void);

/* Opens `checkpoint`: a run directory (its newest checkpoint), RUN/checkpoints/step-N, or a
 * checkpoint directory copied out of its run.
 * `device`: "cpu" (also for NULL or ""), "cuda" or "cuda:N" (the weights and the temporal
 * model's state stay on that GPU; each step copies the frames in, draws the controllers there
 * and copies them and the distributions out), or
 * "emulated" (the CUDA code path on the CPU emulator: for checking, slow); a device that is not
 * there is refused with SLIPSTREAM_E_DEVICE. On failure *out is NULL and
 * slipstream_policy_error(NULL) says why. */
slipstream_status slipstream_policy_open(const char* checkpoint, const char* device,
                                         slipstream_policy** out);

/* A new game (every game of a batch stream; the next step fixes their number again): clears the
 * temporal model's state and starts the sampling draws again from their first frame's (the same
 * frames then give the same answers). Also the state right after open. */
slipstream_status slipstream_policy_reset(slipstream_policy* policy);

/* One frame: the controller to press next, drawn from the model's distribution (temperature 1,
 * seed 0 by default; see slipstream_policy_set_sampling). A frame that fails validation changes
 * no state. */
slipstream_status slipstream_policy_step(slipstream_policy* policy,
                                         const slipstream_game_frame* frame,
                                         slipstream_controller* out);

/* The distribution behind the last successful step's answer (at temperature 1); game 0's in a
 * stream of several games. With autoregressive heads each item's probabilities are given the
 * most likely earlier items, while a draw conditions on the items actually drawn. */
slipstream_status slipstream_policy_distribution(const slipstream_policy* policy,
                                                 slipstream_distribution* out);

/* Many games per call (self-play, evaluation): one frame of each of n independent games,
 * frames[i] and out[i] game i's, stepped together in one pass through the model (its products
 * over the n rows at once). Each game carries its own temporal state and its own draws,
 * seeded from (seed, i) — game 0's from the seed itself, so slipstream_policy_step is the
 * n = 1 form. The first step after open or reset fixes n; another n is refused
 * (SLIPSTREAM_E_ARGUMENT) until slipstream_policy_reset. A frame that fails validation (with
 * n > 1 the message names its game) steps no game. */
slipstream_status slipstream_policy_step_batch(slipstream_policy* policy, int32_t n,
                                               const slipstream_game_frame* frames,
                                               slipstream_controller* out);

/* Game `game` (0 <= game < n) starts again — a new game on that slot: its temporal state
 * cleared and its draws started again; the other games carry on. */
slipstream_status slipstream_policy_reset_game(slipstream_policy* policy, int32_t game);

/* The distribution behind game `game`'s last answer (at temperature 1; autoregressive heads as
 * slipstream_policy_distribution says). */
slipstream_status slipstream_policy_distribution_of(const slipstream_policy* policy, int32_t game,
                                                    slipstream_distribution* out);

/* temperature > 0 (1, the default): each step draws buttons and sticks from the distribution
 * sharpened (< 1) or flattened (> 1) by the temperature, with draws keyed by `seed` (0 by
 * default; the same seed and frames give the same answers; give each game or agent its own to
 * vary them). temperature 0: the most likely input, each button pressed when its probability
 * exceeds 1/2 and each stick at its most likely class; a behaviour-cloned policy then mostly
 * stands still, since "no change" is the likeliest input on almost every frame. Every game's
 * draws start again from their first frame's, as after reset_game (the model state is kept). */
slipstream_status slipstream_policy_set_sampling(slipstream_policy* policy, float temperature,
                                                 uint64_t seed);

/* How many threads the handle's steps use (1, the default: the calling thread alone). With
 * threads > 1 the model's loops over a batch of games (step_batch) are spread over the calling
 * thread and threads - 1 of TBB's workers (the process's pool), in an arena of the handle's own;
 * the answers are the same as with one thread. Worth it for many games per call; a single game's
 * step is too small to share. More threads than the cores TBB may use take those cores.
 * threads outside [1, 1024]: SLIPSTREAM_E_ARGUMENT. */
slipstream_status slipstream_policy_set_threads(slipstream_policy* policy, int32_t threads);

/* One frame as the step exported by `slipstream export --format onnx` reads it (docs/policy.md):
 * the loader's tensors of one position, for a serving stack that runs the exported model itself.
 * Row 0 of the ONNX inputs of the same names: the player's, the opponent's and the follower's
 * raw numeric features (kPercent..kExists order, docs/melee_features.md; zeros for an absent
 * character), their action and character ids, the stage, the previous controller (8 buttons
 * 0/1, then main x, main y, c x, c y in [-1, 1] and the shoulder in [0, 1]). */
typedef struct slipstream_frame_tensors {
  float numeric[3][18];
  int64_t action[3];
  int64_t character[3];
  int64_t stage;
  float prev_controller[13];
} slipstream_frame_tensors;

/* `frame` as those tensors into *out, checked as a step checks its frame; no handle needed.
 * SLIPSTREAM_E_ARGUMENT for a NULL pointer or an invalid frame, with slipstream_policy_error(NULL)
 * naming the field. */
slipstream_status slipstream_policy_frame_tensors(const slipstream_game_frame* frame,
                                                  slipstream_frame_tensors* out);

/* The checkpoint's step, model, the replay reading its frames must follow ("fields slippi" or
 * "fields libmelee": the run's replays.fields), its frame delay and device, one line (valid
 * until the handle closes). */
const char* slipstream_policy_describe(const slipstream_policy* policy);

/* The run's frame delay D (replays.delay; -1 for NULL): the model was trained to see the game
 * D frames late. Each step's frame then holds the game state of D frames ago with the input the
 * program sent last: a program keeps the last D + 1 states and gives the oldest (the package's
 * slipstream_policy.libmelee.DelayedFrames does). With D = 0, the frame just read. */
int32_t slipstream_policy_frame_delay(const slipstream_policy* policy);

/* The last failed call's message: of `policy`, or with NULL of this thread's last failed call
 * without a handle (slipstream_policy_open, a NULL handle). Valid until the next call on the
 * same handle or thread. */
const char* slipstream_policy_error(const slipstream_policy* policy);

/* Frees the policy. NULL is allowed. A call in progress on the handle from another thread
 * returns first (close waits for it); a call made after close uses freed memory. */
void slipstream_policy_close(slipstream_policy* policy);

#ifdef __cplusplus
}
#endif

#endif /* SLIPSTREAM_POLICY_H */
