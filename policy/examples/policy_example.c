/* A bot's loop around libslipstream_policy: open a checkpoint, then once per game frame hand the
 * policy what the game shows and press what it answers. The game here is a scripted scene (Fox
 * against Falco on Battlefield, the opponent walking in and out of range); a bot fills the frame
 * from the running game instead and sends the answer to its controller. Plays two games (reset
 * between them), prints the first answers and the latency of a step.
 *
 *   policy_example CHECKPOINT [FRAMES_PER_GAME] [DEVICE]
 *
 * CHECKPOINT: a run directory (its newest checkpoint) or RUN/checkpoints/step-N.
 * Build against an installed library: cc policy_example.c $(pkg-config --cflags --libs
 * slipstream_policy) -lm
 */
#define _POSIX_C_SOURCE 199309L
#include <slipstream/policy.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kFox = 1, kFalco = 22, kBattlefield = 31, kWait = 14, kWalk = 15 };

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Frame `t` of the scene, the player's last input in `pressed`. */
static slipstream_game_frame scene(int t, const slipstream_controller* pressed) {
  slipstream_game_frame f;
  memset(&f, 0, sizeof f);
  f.stage = kBattlefield;
  f.player.exists = 1;
  f.player.character = kFox;
  f.player.action_state = kWait;
  f.player.action_frame = (float)(t % 60);
  f.player.facing = 1;
  f.player.x = -20;
  f.player.on_ground = 1;
  f.player.jumps_left = 2;
  f.player.shield = 60;
  f.player.stocks = 4;
  f.opponent = f.player;
  f.opponent.character = kFalco;
  f.opponent.action_state = kWalk;
  f.opponent.facing = -1;
  f.opponent.x = 20.0f + 15.0f * sinf((float)t / 40.0f); /* in and out of range */
  f.opponent.percent = (float)(t / 30);
  f.controller = *pressed; /* what the bot sent last frame */
  return f;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CHECKPOINT [FRAMES_PER_GAME] [DEVICE]\n", argv[0]);
    return 2;
  }
  const int frames = argc > 2 ? atoi(argv[2]) : 600;
  if (frames < 1) {
    fprintf(stderr, "FRAMES_PER_GAME must be a positive number\n");
    return 2;
  }
  if (slipstream_policy_version() != SLIPSTREAM_POLICY_VERSION) {
    fprintf(stderr, "library interface %d, header %d\n", slipstream_policy_version(),
            SLIPSTREAM_POLICY_VERSION);
    return 1;
  }
  slipstream_policy* policy = NULL;
  if (slipstream_policy_open(argv[1], argc > 3 ? argv[3] : NULL, &policy) != SLIPSTREAM_OK) {
    fprintf(stderr, "error: %s\n", slipstream_policy_error(NULL));
    return 1;
  }
  printf("%s\n", slipstream_policy_describe(policy));
  /* A run trained at frame delay D sees the game D frames late: the state of frame t - D beside
   * the input sent last, nothing pressed for a game's first D frames. */
  const int delay = slipstream_policy_frame_delay(policy);

  double* latency = malloc(sizeof(double) * (size_t)frames * 2);
  if (!latency) return 1;
  int steps = 0;
  for (int game = 0; game < 2; ++game) {
    slipstream_controller pressed = {0, 0, 0, 0, 0, 0};
    if (slipstream_policy_reset(policy) != SLIPSTREAM_OK) goto fail;
    for (int t = delay; t < frames; ++t) {
      const slipstream_game_frame f = scene(t - delay, &pressed);
      const double t0 = now_us();
      if (slipstream_policy_step(policy, &f, &pressed) != SLIPSTREAM_OK) goto fail;
      latency[steps++] = now_us() - t0;
      if (game == 0 && t < delay + 5)
        printf("frame %d: buttons 0x%02x main (%+.2f, %+.2f) c (%+.2f, %+.2f) shoulder %.2f\n", t,
               (unsigned)pressed.buttons, pressed.main_x, pressed.main_y, pressed.c_x, pressed.c_y,
               pressed.shoulder);
    }
  }
  if (steps == 0) {
    fprintf(stderr, "FRAMES_PER_GAME %d is within the run's frame delay %d: nothing stepped\n",
            frames, delay);
    free(latency);
    slipstream_policy_close(policy);
    return 2;
  }
  qsort(latency, (size_t)steps, sizeof(double), by_value);
  printf("%d steps: latency p50 %.1f us, p99 %.1f us\n", steps, latency[steps / 2],
         latency[(int)((double)steps * 0.99)]);
  free(latency);
  slipstream_policy_close(policy);
  return 0;

fail:
  fprintf(stderr, "error: %s\n", slipstream_policy_error(policy));
  free(latency);
  slipstream_policy_close(policy);
  return 1;
}
