/* The products' entry points for Python (kernels/cpu/__init__.py: gemm), the same at every
 * instruction-set level: prepare M rows of x on the calling thread (rf_split_x), then split the
 * level's tile loops (gemv_<level>.c) over OpenMP threads. This library links the libgomp torch
 * has loaded, so both share one thread pool. */
#include <stdlib.h>

#include "gemv.h"

int rf_batch_int8_rows = 3; /* gemv.h's split_mode */

void rf_set_batch_int8_rows(int rows) { rf_batch_int8_rows = rows; }

/* The integer formats for M rows of fp32 x. */
static void quantized_gemm(int fmt, const uint8_t *w, const float *x, void *y, int y_bf16,
                           int64_t M, int64_t N, int64_t K, int nthreads) {
    const int64_t G = K / GROUP, row_bytes = 2 * K + 2 * G * sizeof(float);
    split_x xs[MAX_ROWS];
    if (M > MAX_ROWS) abort(); /* the Python side checks M */
    uint8_t *mem = malloc(M * row_bytes);
    if (mem == NULL) abort();
    for (int64_t m = 0; m < M; m++) {
        uint8_t *base = mem + m * row_bytes;
        xs[m] = (split_x){(int8_t *)base, (int8_t *)(base + K), (float *)(base + 2 * K),
                          (float *)(base + 2 * K) + G};
        rf_split_x(x + m * K, K, split_mode(fmt, M), xs + m);
    }
    const int64_t T = (N + TILE - 1) / TILE;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t t0, t1;
        thread_range(T, &t0, &t1);
        if (fmt == FORMAT_Q8_0)
            rf_q8_0_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q6)
            rf_q6_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q4_K)
            rf_q4_k_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q6_K)
            rf_q6_k_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q5_K)
            rf_q5_k_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q4_0)
            rf_q4_0_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q5_0)
            rf_q5_0_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q5_1)
            rf_q5_1_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q2_K)
            rf_q2_k_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_Q3_K)
            rf_q3_k_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_IQ4_NL)
            rf_iq4_nl_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else if (fmt == FORMAT_IQ4_XS)
            rf_iq4_xs_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
        else
            rf_q4_1_gemm_tiles(w, xs, y, y_bf16, M, N, K, t0, t1);
    }
    free(mem);
}

void rf_q4_1_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q4_1, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q8_0_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q8_0, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q6_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q6, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q4_k_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q4_K, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q4_0_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q4_0, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q5_0_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q5_0, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q5_1_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q5_1, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q2_k_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q2_K, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q3_k_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q3_K, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_iq4_nl_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                    int64_t K, int nthreads) {
    quantized_gemm(FORMAT_IQ4_NL, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_iq4_xs_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                    int64_t K, int nthreads) {
    quantized_gemm(FORMAT_IQ4_XS, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q5_k_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q5_K, w, x, y, y_bf16, M, N, K, nthreads);
}

void rf_q6_k_gemm(const uint8_t *w, const float *x, void *y, int y_bf16, int64_t M, int64_t N,
                  int64_t K, int nthreads) {
    quantized_gemm(FORMAT_Q6_K, w, x, y, y_bf16, M, N, K, nthreads);
}

/* bf16 for M rows of bf16 x. */
void rf_bf16_gemm(const uint8_t *w, const uint16_t *x, void *y, int y_bf16, int64_t M,
                  int64_t N, int64_t K, int nthreads) {
    const int64_t T = (N + TILE - 1) / TILE;
#pragma omp parallel num_threads(nthreads)
    {
        int64_t t0, t1;
        thread_range(T, &t0, &t1);
        rf_bf16_gemm_tiles(w, x, y, y_bf16, M, N, K, t0, t1);
    }
}

/* Output rows [n0, n0 + rows) of a tiled weight of format fmt (n0 a multiple of TILE, n0 + rows
 * at most N), dense [rows, K] in bf16 (out_bf16) or fp32: the many-row products'
 * dequantization (kernels/cpu/__init__.py: dequantize, gemm_dequant), tiles split over
 * threads. */
void rf_dequant_rows(int fmt, const uint8_t *w, void *out, int out_bf16, int64_t n0,
                     int64_t rows, int64_t K, int nthreads) {
    const int64_t n1 = n0 + rows, T0 = n0 / TILE, T1 = (n1 + TILE - 1) / TILE;
    if (n0 % TILE || rows <= 0) return; /* the Python side checks both */
    if (nthreads > T1 - T0) nthreads = (int)(T1 - T0);
#pragma omp parallel num_threads(nthreads)
    {
        int64_t t0, t1;
        thread_range(T1 - T0, &t0, &t1);
        rf_dequant_tiles(fmt, w, out, out_bf16, n0, n1, K, T0 + t0, T0 + t1);
    }
}
