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

/* Each kernel's body is written once over `bf16`, and inlined with it a constant (ROWS_OF), so
 * that every loop compiles to straight vector code for each dtype. */
#define INLINE static inline __attribute__((always_inline))
#define ROWS_OF(body, bf16, ...) ((bf16) ? body(1, __VA_ARGS__) : body(0, __VA_ARGS__))

/* Rounds v[0..n) to bf16, to nearest even, and back: the value a bf16 tensor holds. With
 * AVX512-BF16 one instruction rounds 16 (it reads denormals as zero, where torch keeps them:
 * values under 1e-38 in magnitude). */
INLINE void hold_bf16(float *v, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512BF16__
    for (; i + 16 <= n; i += 16) {
        const __m256i b = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(v + i));
        _mm512_storeu_ps(v + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
#endif
    for (; i < n; i++) v[i] = bf16_to_f32_1(f32_to_bf16(v[i]));
}

INLINE void load_row(const void *p, int64_t n, int bf16, float *out) {
    if (bf16) for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32_1(((const uint16_t *)p)[i]);
    else for (int64_t i = 0; i < n; i++) out[i] = ((const float *)p)[i];
}

/* Stores v (bf16: rounded to nearest even). */
INLINE void store_row(void *p, int64_t n, int bf16, const float *v) {
    if (!bf16) {
        for (int64_t i = 0; i < n; i++) ((float *)p)[i] = v[i];
        return;
    }
    uint16_t *out = p;
    int64_t i = 0;
#ifdef __AVX512BF16__
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(v + i)));
#endif
    for (; i < n; i++) out[i] = f32_to_bf16(v[i]);
}

/* Adds the squares of x[0..n) into 16 partial sums (a vector register's lanes). */
INLINE void add_squares(const float *x, int64_t n, float *part) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) part[j] += x[i + j] * x[i + j];
    for (; i < n; i++) part[i % 16] += x[i] * x[i];
}

INLINE void add_rms_norm_row(const int bf16, char *x, const char *delta, const char *weight,
                             char *out, int64_t n, float eps) {
    const int64_t size = bf16 ? 2 : 4;
    float v[CHUNK], w[CHUNK], part[16] = {0};
    for (int64_t at = 0; at < n; at += CHUNK) { /* the residual sum, its squares */
        const int64_t m = n - at < CHUNK ? n - at : CHUNK;
        load_row(x + at * size, m, bf16, v);
        if (delta) {
            load_row(delta + at * size, m, bf16, w);
            for (int64_t i = 0; i < m; i++) v[i] += w[i];
            if (bf16) hold_bf16(v, m);
            store_row(x + at * size, m, bf16, v);
        }
        add_squares(v, m, part);
    }
    float squares = 0;
    for (int j = 0; j < 16; j++) squares += part[j];
    const float inv = 1.0f / sqrtf(squares / (float)n + eps);
    for (int64_t at = 0; at < n; at += CHUNK) {
        const int64_t m = n - at < CHUNK ? n - at : CHUNK;
        load_row(x + at * size, m, bf16, v);
        load_row(weight + at * size, m, bf16, w);
        for (int64_t i = 0; i < m; i++) v[i] *= inv;
        if (bf16) hold_bf16(v, m);
        for (int64_t i = 0; i < m; i++) v[i] *= w[i];
        store_row(out + at * size, m, bf16, v);
    }
}

void rf_rows_add_rms_norm(void *x, const void *delta, const void *weight, void *out,
                          int64_t rows, int64_t n, float eps, int64_t bf16, int64_t nthreads) {
    const int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows * n >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        ROWS_OF(add_rms_norm_row, bf16, (char *)x + r * n * size,
                delta ? (const char *)delta + r * n * size : NULL, weight,
                (char *)out + r * n * size, n, eps);
}

/* x cos + roll(x, D/2) signed_sin (rope.py), each product rounded before the sum. */
INLINE void rope_row(const int bf16, char *x, int64_t heads, int64_t D, const char *cos,
                     const char *signed_sin) {
    const int64_t h = D / 2;
    float c[MAX_HEAD_DIM], s[MAX_HEAD_DIM], v[MAX_HEAD_DIM], a[MAX_HEAD_DIM], b[MAX_HEAD_DIM];
    load_row(cos, D, bf16, c);
    load_row(signed_sin, D, bf16, s);
    for (int64_t head = 0; head < heads; head++) {
        char *xh = x + head * D * (bf16 ? 2 : 4);
        load_row(xh, D, bf16, v);
        for (int64_t i = 0; i < D; i++) a[i] = v[i] * c[i];
        for (int64_t i = 0; i < h; i++) b[i] = v[i + h] * s[i];
        for (int64_t i = h; i < D; i++) b[i] = v[i - h] * s[i];
        if (bf16) {
            hold_bf16(a, D);
            hold_bf16(b, D);
        }
        for (int64_t i = 0; i < D; i++) a[i] += b[i];
        store_row(xh, D, bf16, a);
    }
}

void rf_rows_rope(void *x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_dim,
                  const void *cos, const void *signed_sin, int64_t bf16, int64_t nthreads) {
    const int64_t size = bf16 ? 2 : 4, D = head_dim;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows * heads * D >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        ROWS_OF(rope_row, bf16, (char *)x + r * row_stride * size, heads, D,
                (const char *)cos + r * D * size, (const char *)signed_sin + r * D * size);
}

INLINE void silu_mul_row(const int bf16, const char *gate, const char *up, char *out,
                         int64_t n) {
    const int64_t size = bf16 ? 2 : 4;
    float g[CHUNK], act[CHUNK], u[CHUNK];
    for (int64_t at = 0; at < n; at += CHUNK) {
        const int64_t m = n - at < CHUNK ? n - at : CHUNK;
        load_row(gate + at * size, m, bf16, g);
        load_row(up + at * size, m, bf16, u);
        rf_silu(g, m, act);
        if (bf16) hold_bf16(act, m);
        for (int64_t i = 0; i < m; i++) act[i] *= u[i];
        store_row(out + at * size, m, bf16, act);
    }
}

void rf_rows_silu_mul(const void *gate_up, void *out, int64_t rows, int64_t n, int64_t bf16,
                      int64_t nthreads) {
    const int64_t size = bf16 ? 2 : 4;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (rows * n >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const char *gate = (const char *)gate_up + r * 2 * n * size;
        ROWS_OF(silu_mul_row, bf16, gate, gate + n * size, (char *)out + r * n * size, n);
    }
}
