/* Shared by gemv.c (weight-only matrix products) and decode.c (the fused decode step). */
#ifndef RADIXFLOW_GEMV_H
#define RADIXFLOW_GEMV_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define TILE 16  /* output rows side by side in one register */
#define GROUP 32 /* quantization group along k */
#define MAX_ROWS 8 /* rows of x per call */
#define Q4_1_BLOCK (64 + 4 * 64) /* one tile x group: fp16 d[16], fp16 m[16], 256 B nibbles */
#define Q8_0_BLOCK (64 + 8 * 64) /* fp32 d[16], 8 quads x 16 rows x 4 int8 */

/* One row of x split for the integer kernels (rf_split_x): per group g of 32,
 * x ~= scale[g] * (256 hi + lo) (signed), or scale[g] * (256 hi + lo - 32768) (unsigned,
 * hi and lo read as uint8); sum[g] is the exact fp32 sum of the group. */
typedef struct {
    int8_t *hi, *lo;
    float *scale, *sum;
} split_x;

enum { FORMAT_BF16 = 0, FORMAT_Q4_1 = 1, FORMAT_Q8_0 = 2 };

static inline __m512 bf16_to_f32(__m256i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* This thread's share [t0, t1) of n items, inside an OpenMP parallel region. */
static inline void thread_range(int64_t n, int64_t *t0, int64_t *t1) {
    int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
    *t0 = n * id / threads;
    *t1 = n * (id + 1) / threads;
}

void rf_split_x(const float *x, int64_t K, int is_unsigned, split_x out);
void rf_q4_1_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q8_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_bf16_gemm_tiles(const uint8_t *w, const uint16_t *x, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);

#endif
