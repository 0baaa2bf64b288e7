// The input projections of all steps are one GEMM; the recurrence does one (B, H) x (H, 3H)
// GEMM per step plus a gate pass parallel over the batch. The backward collects the gate-input
// gradients of every step so the weight gradients and dx are again single large GEMMs.
#include "kernels/gru.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "kernels/bf16.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/parallel.h"
#include "kernels/vector_math.h"

namespace slipstream::kernels {

size_t gru_saved_elems(int B, int L, int H) {
  return size_t(B) * L * 4 * H;
}
size_t gru_forward_workspace_elems(int B, int L, int H) {
  return size_t(B) * L * 3 * H + size_t(B) * 3 * H;
}
size_t gru_backward_workspace_elems(int B, int L, int H) {
  return 2 * size_t(B) * L * 3 * H + size_t(B) * L * H + 2 * size_t(B) * H;
}

namespace {

// The bf16 form's workspace: the layer input, the states W_hh multiplies, the two gate-input
// gradients and the initial state rounded to bf16, then gemm_bf16's workspace for the largest of
// the layer's products.
struct Bf16Area {
  uint16_t *x, *h, *dgi, *dgh, *h0;
  float* gemm;
  static size_t gemm_elems(int B, int L, int In, int H) {
    const int M = B * L, G = 3 * H;
    return std::max({gemm_bf16_workspace_elems(M, G, In), gemm_bf16_workspace_elems(B, G, H),
                     gemm_bf16_workspace_elems(B, H, G), gemm_bf16_workspace_elems(M, In, G),
                     gemm_bf16_workspace_elems(G, In, M), gemm_bf16_workspace_elems(G, H, M)});
  }
  static size_t halves(int B, int L, int In, int H) {
    const size_t M = size_t(B) * L;
    return (M * In + M * H + 2 * M * 3 * H + size_t(B) * H + 1) / 2 *
           2;  // keeps the floats after it aligned
  }
  Bf16Area(void* ws, int B, int L, int In, int H) {
    const size_t M = size_t(B) * L;
    x = static_cast<uint16_t*>(ws);
    h = x + M * In;
    dgi = h + M * H;
    dgh = dgi + M * 3 * H;
    h0 = dgh + M * 3 * H;
    gemm = reinterpret_cast<float*>(x + halves(B, L, In, H));
  }
};

template <class T>
void check_bf16_form(const GruBf16* bf, const char* op) {
  if (!bf) return;
  if (!std::is_same_v<T, float>)
    throw std::invalid_argument(std::string(op) + ": the bf16 form computes in float");
  if (!bf->w_ih || !bf->w_hh || !bf->workspace)
    throw std::invalid_argument(std::string(op) +
                                ": the bf16 form needs both weight copies and its workspace");
}

template <class T>
T sigm(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// One row's gates from its input and recurrent projections gi, gh (3H each, PyTorch's r, z, n
// order): y = (1 - z) n + z h_prev; saved (4H) gets r, z, n, W_hn h + b_hn.
template <class T>
void gate_row(const T* gi, const T* gh, const T* hp, T* y, T* saved, int H) {
  for (int j = 0; j < H; ++j) {
    const T r = sigm(gi[j] + gh[j]);
    const T z = sigm(gi[H + j] + gh[H + j]);
    const T hn = gh[2 * H + j];
    const T n = std::tanh(gi[2 * H + j] + r * hn);
    const T h = hp ? hp[j] : T(0);
    y[j] = (T(1) - z) * n + z * h;
    if (saved) {
      saved[j] = r;
      saved[H + j] = z;
      saved[2 * H + j] = n;
      saved[3 * H + j] = hn;
    }
  }
}

// float: the sigmoids and tanh as vector calls (vector_math.h), 256 units at a time.
template <>
void gate_row<float>(const float* gi, const float* gh, const float* hp, float* y, float* saved,
                     int H) {
  constexpr int kChunk = 256;
  float r[kChunk], z[kChunk], n[kChunk];
  for (int j0 = 0; j0 < H; j0 += kChunk) {
    const int m = std::min(kChunk, H - j0);
    const float *gir = gi + j0, *giz = gi + H + j0, *gin = gi + 2 * H + j0;
    const float *ghr = gh + j0, *ghz = gh + H + j0, *ghn = gh + 2 * H + j0;
    for (int j = 0; j < m; ++j) {
      r[j] = gir[j] + ghr[j];
      z[j] = giz[j] + ghz[j];
    }
    vec_sigmoid(r, r, size_t(m));
    vec_sigmoid(z, z, size_t(m));
    for (int j = 0; j < m; ++j) n[j] = gin[j] + r[j] * ghn[j];
    vec_tanh(n, n, size_t(m));
    for (int j = 0; j < m; ++j) {
      const float h = hp ? hp[j0 + j] : 0.0f;
      y[j0 + j] = (1.0f - z[j]) * n[j] + z[j] * h;
    }
    if (saved) {
      std::copy(r, r + m, saved + j0);
      std::copy(z, z + m, saved + H + j0);
      std::copy(n, n + m, saved + 2 * H + j0);
      std::copy(ghn, ghn + m, saved + 3 * H + j0);
    }
  }
}
}  // namespace

size_t gru_bf16_workspace_bytes(int B, int L, int In, int H) {
  return Bf16Area::halves(B, L, In, H) * sizeof(uint16_t) +
         Bf16Area::gemm_elems(B, L, In, H) * sizeof(float);
}

template <class T>
void gru_forward(const T* x, const T* h0, const T* w_ih, const T* w_hh, const T* b_ih,
                 const T* b_hh, T* y, T* saved, T* workspace, int B, int L, int In, int H,
                 const GruBf16* bf) {
  check_bf16_form<T>(bf, "gru_forward");
  const int G = 3 * H;
  const size_t M = size_t(B) * L;
  T* gi = workspace;          // (B, L, 3H)
  T* gh = workspace + M * G;  // (B, 3H)
  // The bf16 form: a->h keeps each state rounded as the gates write it (the next step's product
  // reads it).
  std::optional<Bf16Area> a;
  if (bf) a.emplace(bf->workspace, B, L, In, H);
  if constexpr (std::is_same_v<T, float>) {
    if (a) {
      fp32_to_bf16(x, a->x, M * size_t(In));
      gemm_bf16(false, true, B * L, G, In, 1.0f, a->x, In, bf->w_ih, In, 0.0f, gi, G, a->gemm);
      if (b_ih) add_bias_rows(gi, b_ih, M, size_t(G));
      if (h0) fp32_to_bf16(h0, a->h0, size_t(B) * H);
    }
  }
  if (!a) linear_forward(x, w_ih, b_ih, gi, B * L, In, G);
  for (int t = 0; t < L; ++t) {
    // gh = h_{t-1} W_hh^T + b_hh
    const T* hp = t == 0 ? h0 : y + size_t(t - 1) * H;
    const int ldh = t == 0 ? H : L * H;
    for (int b = 0; b < B; ++b) {
      T* row = gh + size_t(b) * G;
      if (b_hh) {
        std::copy(b_hh, b_hh + G, row);
      } else {
        std::fill(row, row + G, T(0));
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (a && hp)
        gemm_bf16(false, true, B, G, H, 1.0f, t == 0 ? a->h0 : a->h + size_t(t - 1) * H, ldh,
                  bf->w_hh, H, 1.0f, gh, G, a->gemm);
    }
    if (!a && hp) gemm<T>(false, true, B, G, H, T(1), hp, ldh, w_hh, H, T(1), gh, G);
    parallel_blocks(B, 8 * H, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t row = b * L + t;
        gate_row(gi + row * G, gh + b * G, hp ? hp + b * ldh : nullptr, y + row * H,
                 saved ? saved + row * 4 * H : nullptr, H);
        if constexpr (std::is_same_v<T, float>) {
          if (a) fp32_to_bf16_scalar(y + row * H, a->h + row * H, size_t(H));
        }
      }
    });
  }
}

template <class T>
void gru_backward(const T* x, const T* h0, const T* w_ih, const T* w_hh, const T* y, const T* saved,
                  const T* dy, const T* dh_last, T* dx, T* dh0, T* dw_ih, T* dw_hh, T* db_ih,
                  T* db_hh, T* workspace, int B, int L, int In, int H, const GruBf16* bf) {
  check_bf16_form<T>(bf, "gru_backward");
  const int G = 3 * H;
  const size_t M = size_t(B) * L;
  // The bf16 form: a->dgh gets each step's recurrent gate gradients rounded as they are made.
  std::optional<Bf16Area> a;
  if (bf) a.emplace(bf->workspace, B, L, In, H);
  T* dgi = workspace;                    // (B, L, 3H)
  T* dgh = dgi + size_t(B) * L * G;      // (B, L, 3H)
  T* hprev = dgh + size_t(B) * L * G;    // (B, L, H)
  T* carry = hprev + size_t(B) * L * H;  // (B, H): dL/dh_t from later steps
  T* next = carry + size_t(B) * H;       // (B, H)
  if (dh_last) {
    std::copy(dh_last, dh_last + size_t(B) * H, carry);
  } else {
    std::fill(carry, carry + size_t(B) * H, T(0));
  }
  // hprev[b, t] = h_{t-1}: the states the recurrent weights multiplied.
  parallel_blocks(B, size_t(L) * H, [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) {
      T* hb = hprev + b * L * H;
      if (h0) {
        std::copy(h0 + b * H, h0 + (b + 1) * H, hb);
      } else {
        std::fill(hb, hb + H, T(0));
      }
      std::copy(y + b * L * H, y + b * L * H + size_t(L - 1) * H, hb + H);
    }
  });
  for (int t = L - 1; t >= 0; --t) {
    parallel_blocks(B, 16 * H, [&](size_t b0, size_t b1) {
      for (size_t b = b0; b < b1; ++b) {
        const size_t row = b * L + t;
        const T* sb = saved + row * 4 * H;
        const T* hp = hprev + row * H;
        const T* g = dy + row * H;
        const T* c = carry + b * H;
        T* nb = next + b * H;
        T* dgib = dgi + row * G;
        T* dghb = dgh + row * G;
        for (int j = 0; j < H; ++j) {
          const T r = sb[j], z = sb[H + j], n = sb[2 * H + j], hn = sb[3 * H + j];
          const T dh = g[j] + c[j];
          const T dn = dh * (T(1) - z);
          const T dz = dh * (hp[j] - n);
          const T dan = dn * (T(1) - n * n);
          const T dr = dan * hn;
          const T dar = dr * r * (T(1) - r);
          const T daz = dz * z * (T(1) - z);
          dgib[j] = dar;
          dgib[H + j] = daz;
          dgib[2 * H + j] = dan;
          dghb[j] = dar;
          dghb[H + j] = daz;
          dghb[2 * H + j] = dan * r;
          nb[j] = dh * z;
        }
        if constexpr (std::is_same_v<T, float>) {
          if (a) fp32_to_bf16_scalar(dghb, a->dgh + row * G, size_t(G));
        }
      }
    });
    // dh_{t-1} = dh * z + dgh_t W_hh
    if (a) {
      // Past t = 0 only when dh0 is asked for.
      if constexpr (std::is_same_v<T, float>) {
        if (t > 0 || dh0)
          gemm_bf16(false, false, B, H, G, 1.0f, a->dgh + size_t(t) * G, L * G, bf->w_hh, H, 1.0f,
                    next, H, a->gemm);
      }
    } else {
      gemm<T>(false, false, B, H, G, T(1), dgh + size_t(t) * G, L * G, w_hh, H, T(1), next, H);
    }
    std::swap(carry, next);
  }
  if (dh0) std::copy(carry, carry + size_t(B) * H, dh0);
  if constexpr (std::is_same_v<T, float>) {
    if (a) {
      fp32_to_bf16(x, a->x, M * size_t(In));
      fp32_to_bf16(hprev, a->h, M * size_t(H));
      fp32_to_bf16(dgi, a->dgi, M * size_t(G));
      if (dx)
        gemm_bf16(false, false, B * L, In, G, 1.0f, a->dgi, G, bf->w_ih, In, 0.0f, dx, In, a->gemm);
      if (dw_ih)
        gemm_bf16(true, false, G, In, B * L, 1.0f, a->dgi, G, a->x, In, 1.0f, dw_ih, In, a->gemm);
      if (dw_hh)
        gemm_bf16(true, false, G, H, B * L, 1.0f, a->dgh, G, a->h, H, 1.0f, dw_hh, H, a->gemm);
      if (db_ih) column_sum_accumulate(dgi, db_ih, M, size_t(G));
      if (db_hh) column_sum_accumulate(dgh, db_hh, M, size_t(G));
      return;
    }
  }
  linear_backward(x, w_ih, dgi, dx, dw_ih, db_ih, B * L, In, G);
  linear_backward(hprev, w_hh, dgh, static_cast<T*>(nullptr), dw_hh, db_hh, B * L, H, G);
}

#define INSTANTIATE(T)                                                                             \
  template void gru_forward<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, \
                               T*, int, int, int, int, const GruBf16*);                            \
  template void gru_backward<T>(const T*, const T*, const T*, const T*, const T*, const T*,        \
                                const T*, const T*, T*, T*, T*, T*, T*, T*, T*, int, int, int,     \
                                int, const GruBf16*);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace slipstream::kernels
