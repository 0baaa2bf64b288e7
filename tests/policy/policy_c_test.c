/* libslipstream_policy linked from C (C11, -pedantic): open a trained run, play frames, check
 * that answers are valid inputs and, at temperature 0, the most likely ones of their
 * distribution, that reset replays a game exactly, and that misuse returns a status with a
 * message.
 *   policy_c_test RUN_DIR */
#include <slipstream/policy.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

static slipstream_game_frame frame_at(int t) {
  slipstream_game_frame f;
  memset(&f, 0, sizeof f);
  f.stage = 32;
  f.player.exists = 1;
  f.player.character = 1;
  f.player.action_state = 14 + t % 30;
  f.player.action_frame = (float)(t % 20);
  f.player.facing = t % 2 ? 1.0f : -1.0f;
  f.player.x = (float)(t % 50) - 25.0f;
  f.player.on_ground = 1;
  f.player.stocks = 4;
  f.opponent = f.player;
  f.opponent.character = 2;
  f.opponent.x = -f.player.x;
  f.opponent.percent = (float)t;
  f.controller.buttons = (uint32_t)(t % 3 == 0 ? SLIPSTREAM_BUTTON_A : 0);
  f.controller.main_x = (float)((t % 17) - 8) / 8.0f;
  return f;
}

static int argmax(const float* p, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (p[i] > p[best]) best = i;
  return best;
}

static double total(const float* p, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += p[i];
  return s;
}

enum { kFrames = 64 };

static void play(slipstream_policy* p, slipstream_distribution* out) {
  for (int t = 0; t < kFrames; ++t) {
    slipstream_game_frame f = frame_at(t);
    slipstream_controller c;
    CHECK(slipstream_policy_step(p, &f, &c) == SLIPSTREAM_OK);
    CHECK(slipstream_policy_distribution(p, &out[t]) == SLIPSTREAM_OK);
    const slipstream_distribution* d = &out[t];
    CHECK(fabs(total(d->main_x, 17) - 1) < 1e-4 && fabs(total(d->shoulder, 5) - 1) < 1e-4);
    CHECK(c.main_x == (float)argmax(d->main_x, 17) / 8.0f - 1.0f);
    CHECK(c.c_y == (float)argmax(d->c_y, 17) / 8.0f - 1.0f);
    CHECK(c.shoulder == (float)argmax(d->shoulder, 5) / 4.0f);
    for (int b = 0; b < 8; ++b) CHECK(((c.buttons >> b) & 1u) == (d->buttons[b] > 0.5f ? 1u : 0u));
    CHECK((c.buttons & ~(uint32_t)SLIPSTREAM_BUTTONS_ALL) == 0);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s RUN_DIR\n", argv[0]);
    return 2;
  }
  slipstream_policy* p = NULL;
  if (slipstream_policy_open(argv[1], "cpu", &p) != SLIPSTREAM_OK) {
    fprintf(stderr, "open: %s\n", slipstream_policy_error(NULL));
    return 1;
  }
  printf("%s\n", slipstream_policy_describe(p));
  /* Temperature 0: the most likely input, which play() checks (sampling is the default). */
  CHECK(slipstream_policy_set_sampling(p, 0.0f, 0) == SLIPSTREAM_OK);
  static slipstream_distribution first[kFrames], again[kFrames];
  play(p, first);
  CHECK(slipstream_policy_reset(p) == SLIPSTREAM_OK);
  play(p, again);
  CHECK(memcmp(first, again, sizeof first) == 0);

  /* Misuse: a status and a message, never a crash. */
  slipstream_policy* q = p;
  CHECK(slipstream_policy_open("/nonexistent/run", "cpu", &q) == SLIPSTREAM_E_CHECKPOINT);
  CHECK(q == NULL);
  CHECK(strstr(slipstream_policy_error(NULL), "/nonexistent/run") != NULL);
  CHECK(slipstream_policy_open(argv[1], "cuda:99", &q) == SLIPSTREAM_E_DEVICE);
  CHECK(slipstream_policy_open(NULL, NULL, &q) == SLIPSTREAM_E_ARGUMENT);
  slipstream_game_frame bad = frame_at(0);
  bad.player.x = NAN;
  slipstream_controller c;
  CHECK(slipstream_policy_step(p, &bad, &c) == SLIPSTREAM_E_ARGUMENT);
  CHECK(strstr(slipstream_policy_error(p), "frame.player.x") != NULL);
  CHECK(slipstream_policy_step(p, NULL, &c) == SLIPSTREAM_E_ARGUMENT);
  CHECK(slipstream_policy_reset(NULL) == SLIPSTREAM_E_ARGUMENT);
  /* The run's frame delay (replays.delay; 0 here), -1 for no handle. */
  CHECK(slipstream_policy_frame_delay(p) == 0);
  CHECK(strstr(slipstream_policy_describe(p), "frame delay 0") != NULL);
  CHECK(slipstream_policy_frame_delay(NULL) == -1);
  slipstream_policy_close(p);
  slipstream_policy_close(NULL);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("policy C interface: all checks passed\n");
  return 0;
}
