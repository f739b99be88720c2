/* The per-token vector work of a forward over many tokens (an extend batch): residual add +
 * RMSNorm, rope, SiLU(gate) * up, each in one pass over its rows (the same source in every
 * level's build; the SiLU's exp comes from step_<level>.c).
 *
 * As torch ops each of these is several passes over the batch (an RMSNorm: a copy to fp32, the
 * statistics, the scaling, a copy back, the weight) and costs ~14% of a 256-token prefill of the
 * default model; here each reads its rows once and writes them once.
 *
 * Numerics: the torch model's, rounding for rounding. In a bf16 model every torch op rounds its
 * result to bf16, so these round at the same points (residual sum; normalized x, then times the
 * weight; x * cos and rolled x * sin, then their sum; SiLU, then times up); an fp32 model's stay
 * fp32. Elementwise results then equal torch's bit for bit; the RMSNorm's sum of squares and
 * the SiLU's exp are computed in another order / approximation than torch's, so those can be
 * one rounding step apart (tests/kernels/test_cpu_rows.py). */
#include <math.h>
#include <stdint.h>

#include "decode.h"

/* torch rounds each product before a sum: no fused multiply-adds here */
#ifdef __clang__
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#define CHUNK 512          /* values converted to fp32 at a time */
#define PARALLEL_MIN 32768 /* values below which one thread does the whole call */

/* The value as the model's dtype holds it (bf16: rounded to nearest even). */
static inline float held(float v, int bf16) { return bf16 ? bf16_to_f32_1(f32_to_bf16(v)) : v; }

static void load_row(const void *p, int64_t n, int bf16, float *out) {
    if (bf16) for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32_1(((const uint16_t *)p)[i]);
    else for (int64_t i = 0; i < n; i++) out[i] = ((const float *)p)[i];
}

static void store_row(void *p, int64_t n, int bf16, const float *v) {
    if (bf16) for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i] = f32_to_bf16(v[i]);
    else for (int64_t i = 0; i < n; i++) ((float *)p)[i] = v[i];
}

/* Adds the squares of x[0..n) into 16 partial sums (a vector register's lanes). */
static void add_squares(const float *x, int64_t n, float *part) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) part[j] += x[i + j] * x[i + j];
    for (; i < n; i++) part[i % 16] += x[i] * x[i];
}

void rf_rows_add_rms_norm(void *x, const void *delta, const void *weight, void *out,
                          int64_t rows, int64_t n, float eps, int64_t bf16, int64_t nthreads) {
    const int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows * n >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float v[CHUNK], w[CHUNK], part[16] = {0};
        char *xr = (char *)x + r * n * size, *outr = (char *)out + r * n * size;
        for (int64_t at = 0; at < n; at += CHUNK) { /* the residual sum, its squares */
            const int64_t m = n - at < CHUNK ? n - at : CHUNK;
            load_row(xr + at * size, m, bf16, v);
            if (delta) {
                load_row((const char *)delta + (r * n + at) * size, m, bf16, w);
                for (int64_t i = 0; i < m; i++) v[i] = held(v[i] + w[i], bf16);
                store_row(xr + at * size, m, bf16, v);
            }
            add_squares(v, m, part);
        }
        float squares = 0;
        for (int j = 0; j < 16; j++) squares += part[j];
        const float inv = 1.0f / sqrtf(squares / (float)n + eps);
        for (int64_t at = 0; at < n; at += CHUNK) {
            const int64_t m = n - at < CHUNK ? n - at : CHUNK;
            load_row(xr + at * size, m, bf16, v);
            load_row((const char *)weight + at * size, m, bf16, w);
            for (int64_t i = 0; i < m; i++) v[i] = held(v[i] * inv, bf16) * w[i];
            store_row(outr + at * size, m, bf16, v);
        }
    }
}

void rf_rows_rope(void *x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_dim,
                  const void *cos, const void *signed_sin, int64_t bf16, int64_t nthreads) {
    const int64_t size = bf16 ? 2 : 4, D = head_dim, h = D / 2;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows * heads * D >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float c[MAX_HEAD_DIM], s[MAX_HEAD_DIM], v[MAX_HEAD_DIM], out[MAX_HEAD_DIM];
        load_row((const char *)cos + r * D * size, D, bf16, c);
        load_row((const char *)signed_sin + r * D * size, D, bf16, s);
        for (int64_t head = 0; head < heads; head++) {
            char *xr = (char *)x + (r * row_stride + head * D) * size;
            load_row(xr, D, bf16, v);
            for (int64_t i = 0; i < D; i++) /* x cos + roll(x, D/2) signed_sin (rope.py) */
                out[i] = held(v[i] * c[i], bf16) + held(v[i < h ? i + h : i - h] * s[i], bf16);
            store_row(xr, D, bf16, out);
        }
    }
}

void rf_rows_silu_mul(const void *gate_up, void *out, int64_t rows, int64_t n, int64_t bf16,
                      int64_t nthreads) {
    const int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows * n >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float g[CHUNK], act[CHUNK], u[CHUNK];
        const char *gate = (const char *)gate_up + r * 2 * n * size, *up = gate + n * size;
        char *outr = (char *)out + r * n * size;
        for (int64_t at = 0; at < n; at += CHUNK) {
            const int64_t m = n - at < CHUNK ? n - at : CHUNK;
            load_row(gate + at * size, m, bf16, g);
            load_row(up + at * size, m, bf16, u);
            rf_silu(g, m, act);
            for (int64_t i = 0; i < m; i++) act[i] = held(act[i], bf16) * u[i];
            store_row(outr + at * size, m, bf16, act);
        }
    }
}
