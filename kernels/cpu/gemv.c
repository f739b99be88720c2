/* Weight-only quantized matrix-vector products for CPU decode (AVX-512).
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] for a few rows m, with w stored as in GGUF's Q4_1 and Q8_0
 * block formats (groups of 32 along k), so the default model's weights are used as they are
 * in its file: a decode step at batch 1 is bound by reading the weights, and these read 0.75
 * (Q4_1 with fp32 scales) or 1.125 bytes per weight instead of bf16's 2.
 *
 * Layouts (row-major, G = K / 32 groups per row):
 *   Q4_1: nibbles [N][G][16] uint8: byte j of a group holds q[j] (low nibble) and q[j + 16]
 *         (high nibble); scale, low [N][G] float; w = low + q * scale, q in 0..15.
 *   Q8_0: q [N][G][32] int8; scale [N][G] float; w = q * scale.
 *   x [M][K] float, y [M][N] float. Q4_1 also takes xsum [M][G]: the sum of x over each group,
 *   which carries the `low` term: sum_i (low + q_i * scale) x_i = low * xsum + scale * q.x.
 *
 * Accumulation is fp32 throughout. Rows n are split over OpenMP threads; this library links
 * the same libgomp as torch, so both share one thread pool.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __m512 q4_group_dot(const uint8_t *nibbles, const float *x) {
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)nibbles);
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(v, mask)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
    __m512 t = _mm512_mul_ps(lo, _mm512_loadu_ps(x));
    return _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), t);
}

static inline __m512 q8_group_dot(const int8_t *q, const float *x) {
    __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
    __m512 t = _mm512_mul_ps(a, _mm512_loadu_ps(x));
    return _mm512_fmadd_ps(b, _mm512_loadu_ps(x + 16), t);
}

static inline float dot_f32(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* Four weight rows at a time: each x block is loaded once for four independent FMA chains. */
#define ROWS 4

void rf_q4_1_gemv(const uint8_t *nibbles, const float *scale, const float *low, const float *x,
                  const float *xsum, float *y, int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / 32, blocks = (N + ROWS - 1) / ROWS;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t n0 = b * ROWS, rows = N - n0 < ROWS ? N - n0 : ROWS;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * K, *xsm = xsum + m * G;
            if (rows == ROWS) {
                const uint8_t *w0 = nibbles + n0 * G * 16, *w1 = w0 + G * 16, *w2 = w1 + G * 16,
                              *w3 = w2 + G * 16;
                const float *s0 = scale + n0 * G, *s1 = s0 + G, *s2 = s1 + G, *s3 = s2 + G;
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t g = 0; g < G; g++) {
                    const float *xg = xm + g * 32;
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(s0[g]), q4_group_dot(w0 + g * 16, xg), a0);
                    a1 = _mm512_fmadd_ps(_mm512_set1_ps(s1[g]), q4_group_dot(w1 + g * 16, xg), a1);
                    a2 = _mm512_fmadd_ps(_mm512_set1_ps(s2[g]), q4_group_dot(w2 + g * 16, xg), a2);
                    a3 = _mm512_fmadd_ps(_mm512_set1_ps(s3[g]), q4_group_dot(w3 + g * 16, xg), a3);
                }
                float *ym = y + m * N + n0;
                ym[0] = _mm512_reduce_add_ps(a0) + dot_f32(low + (n0 + 0) * G, xsm, G);
                ym[1] = _mm512_reduce_add_ps(a1) + dot_f32(low + (n0 + 1) * G, xsm, G);
                ym[2] = _mm512_reduce_add_ps(a2) + dot_f32(low + (n0 + 2) * G, xsm, G);
                ym[3] = _mm512_reduce_add_ps(a3) + dot_f32(low + (n0 + 3) * G, xsm, G);
                continue;
            }
            for (int64_t n = n0; n < n0 + rows; n++) {
                const uint8_t *wn = nibbles + n * G * 16;
                const float *sn = scale + n * G;
                __m512 acc = _mm512_setzero_ps();
                for (int64_t g = 0; g < G; g++)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(sn[g]), q4_group_dot(wn + g * 16, xm + g * 32), acc);
                y[m * N + n] = _mm512_reduce_add_ps(acc) + dot_f32(low + n * G, xsm, G);
            }
        }
    }
}

void rf_q8_0_gemv(const int8_t *q, const float *scale, const float *x, float *y, int64_t M,
                  int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / 32;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int8_t *qn = q + n * K;
        const float *sn = scale + n * G;
        for (int64_t m = 0; m < M; m++) {
            const float *xm = x + m * K;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t g = 0; g < G; g++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(sn[g]), q8_group_dot(qn + g * 32, xm + g * 32), acc);
            y[m * N + n] = _mm512_reduce_add_ps(acc);
        }
    }
}

/* ---- Q4_1 weights x int8 activations (AVX512-VNNI), as llama.cpp's Q4_1 x Q8_1 ----
 *
 * The activations are quantized per group of 32 to int8 with a scale (dx = max|x| / 127), so
 * one vpdpbusd multiplies 64 weight nibbles by 64 activation bytes: about a third of the
 * instructions of the float kernel above, at the cost of rounding x to 8 bits per group.
 *
 * Two groups g, g+1 are done at once. Their 32 nibble bytes unpack to the 64 bytes
 *   [g q0..15 | g+1 q0..15 | g q16..31 | g+1 q16..31]
 * and rf_quantize_x_q8 writes each row of x in the same order, so lanes 0-3 and 8-11 of the
 * int32 result belong to group g and lanes 4-7 and 12-15 to g+1.
 */

/* xq [M][K] int8 in the pair order above; dx [M][G] scales; xs [M][G] = dx * sum(xq) */
void rf_quantize_x_q8(const float *x, int8_t *xq, float *dx, float *xs, int64_t M, int64_t K) {
    const int64_t G = K / 32;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + m * K + g * 32;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                float a = xg[i] < 0 ? -xg[i] : xg[i];
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            /* position of element i of group g within its pair block of 64 bytes */
            int8_t *block = xq + m * K + (g & ~(int64_t)1) * 32;
            const int odd = (int)(g & 1);
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                float v = xg[i] * inv;
                int q = (int)(v < 0 ? v - 0.5f : v + 0.5f);
                q = q > 127 ? 127 : (q < -127 ? -127 : q);
                sum += q;
                int pos = (i < 16 ? 0 : 32) + odd * 16 + (i & 15);
                if (G % 2 == 1 && g == G - 1)  /* a last unpaired group keeps plain order */
                    pos = i;
                block[pos] = (int8_t)q;
            }
            dx[m * G + g] = d;
            xs[m * G + g] = d * (float)sum;
        }
    }
}

static inline __m512i q4_pair_bytes(const uint8_t *nibbles) {
    const __m256i mask = _mm256_set1_epi8(0x0F);
    __m256i v = _mm256_loadu_si256((const __m256i *)nibbles);
    __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

void rf_q4_1_q8_gemv(const uint8_t *nibbles, const float *scale, const float *low,
                     const int8_t *xq, const float *dx, const float *xs, float *y, int64_t M,
                     int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / 32, pairs = G / 2;
    const __m512i spread = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *wn = nibbles + n * G * 16;
        const float *sn = scale + n * G, *ln = low + n * G;
        for (int64_t m = 0; m < M; m++) {
            const int8_t *xm = xq + m * K;
            const float *dxm = dx + m * G;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t p = 0; p < pairs; p++) {
                __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q4_pair_bytes(wn + p * 32),
                                                  _mm512_loadu_si512((const void *)(xm + p * 64)));
                __m128 s = _mm_mul_ps(_mm_castpd_ps(_mm_load_sd((const double *)(sn + 2 * p))),
                                      _mm_castpd_ps(_mm_load_sd((const double *)(dxm + 2 * p))));
                __m512 svec = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), svec, acc);
            }
            float total = _mm512_reduce_add_ps(acc);
            if (G % 2 == 1) {  /* the last group alone, plain order */
                const int64_t g = G - 1;
                const uint8_t *b = wn + g * 16;
                const int8_t *xg = xm + g * 32;
                int sum = 0;
                for (int i = 0; i < 16; i++)
                    sum += (b[i] & 0x0F) * xg[i] + (b[i] >> 4) * xg[i + 16];
                total += sn[g] * dxm[g] * (float)sum;
            }
            y[m * N + n] = total + dot_f32(ln, xs + m * G, G);
        }
    }
}
