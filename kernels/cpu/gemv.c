/* Weight-only Q8_0 matrix-vector product for CPU decode (AVX-512).
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] for a few rows m, with w stored as GGUF's Q8_0 blocks
 * (groups of 32 along k): q [N][K] int8 and scale [N][K / 32] float, w = q * scale. The
 * default model's embedding, tied to its output head, is Q8_0 in its file: this reads it as
 * 1.125 bytes per weight instead of bf16's 2, exactly. Accumulation is fp32; x [M][K] and
 * y [M][N] are float.
 *
 * Rows n are split over OpenMP threads; this library links the same libgomp as torch, so
 * both share one thread pool.
 *
 * (Q4_1 kernels, fp32 and AVX512-VNNI with int8 activations, were tried for the layers and
 * lost to or tied with torch's int4 kernel: see bench/results/decode-step-2026-11-29.md.)
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline __m512 q8_group_dot(const int8_t *q, const float *x) {
    __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
    __m512 t = _mm512_mul_ps(a, _mm512_loadu_ps(x));
    return _mm512_fmadd_ps(b, _mm512_loadu_ps(x + 16), t);
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
