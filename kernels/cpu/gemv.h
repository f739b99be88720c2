/* What every instruction-set level's weight-only products (gemv_avx512.c, gemv_avx2.c) and the
 * fused decode step (decode.c) share: the tiled layouts' constants, x prepared for the integer
 * kernels, the products' entry points, scalar bf16 conversions. */
#ifndef RADIXFLOW_GEMV_H
#define RADIXFLOW_GEMV_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define TILE 16  /* output rows side by side in one register */
#define GROUP 32 /* quantization group along k */
#define MAX_ROWS 64 /* rows of x per product call (gemm.c; a 32-row one reads the weights once) */
#define Q4_1_BLOCK (64 + 4 * 64) /* one tile x group: fp16 d[16], fp16 m[16], 256 B nibbles */
#define Q4_0_BLOCK (32 + 4 * 64) /* one tile x group: fp16 d[16], 256 B nibbles (w = d (q - 8)) */
#define Q5_0_BLOCK (Q4_0_BLOCK + 64) /* q4_0's, then the fifth bits (w = d (q - 16)) */
#define Q5_1_BLOCK (Q4_1_BLOCK + 64) /* q4_1's, then the fifth bits (w = d q + m) */
#define Q8_0_BLOCK (64 + 8 * 64) /* fp32 d[16], 8 quads x 16 rows x 4 int8 */
#define Q6_BLOCK (64 + 6 * 64) /* fp16 d[2][16], 256 B low nibbles, 128 B high bit pairs */
#define SUPER_BLOCK 256 /* q4_k's weights along k per d/dmin (GGUF's Q4_K super-block) */
#define Q4_K_BLOCK (256 + 8 * 256) /* one tile x super-block: fp16 d[16], dmin[16], six-bit
                                      scales and mins (192 B), 8 sub-blocks of q4_1 nibbles */
#define Q4_K_GROUP (Q4_K_BLOCK / 8) /* a tile's bytes per group of 32, as the others' blocks */
#define Q5_K_BLOCK (256 + 8 * 320) /* q4_k's header, then 8 groups of q4_1 nibbles each followed
                                      by 64 bytes of fifth bits (GGUF's Q5_K: 5.5 bits) */
#define Q5_K_GROUP (Q5_K_BLOCK / 8)
#define Q6_K_BLOCK (288 + 8 * 384) /* one tile x super-block: fp16 d[16], int8 scales (16 B per
                                      16 weights: byte 16 s + r, row r's s-th), then 8 groups
                                      of q6's nibbles and high bit pairs (GGUF's Q6_K bits) */
#define Q6_K_GROUP (Q6_K_BLOCK / 8)
#define Q3_K_BLOCK (288 + 8 * 192) /* one tile x super-block: q6_k's header (fp16 d[16], int8
                                      scales per 16), then 8 groups of q + 4's low bit pairs (as
                                      q6's high ones) and their third bits (GGUF's Q3_K) */
#define Q3_K_GROUP (Q3_K_BLOCK / 8)
#define Q2_K_BLOCK (320 + 8 * 128) /* one tile x super-block: fp16 d[16], dmin[16], the scale
                                      bytes of its 16 half groups (sc | m << 4, as GGUF's Q2_K:
                                      byte 64 + 16 s + r, row r's s-th), then 8 groups of 2-bit
                                      values as q3_k's low bit pairs: 2.625 bits, as the file */
#define Q2_K_GROUP (Q2_K_BLOCK / 8)
#define IQ4_XS_BLOCK (160 + 8 * 256) /* one tile x super-block: fp16 d[16], the int8 scales of its
                                        8 groups (ls - 32: byte 16 j + r, row r's j-th), then 8
                                        groups of q4_1 nibbles: indices into IQ4_VALUES */
#define IQ4_XS_GROUP (IQ4_XS_BLOCK / 8)

/* One q2_k tile's G groups as dense rows: local rows row0 .. row0 + 15 below `rows`, K wide,
 * bf16 (to nearest even) or fp32. Scalar (only dense copies and lookups dequantize q2_k): each
 * weight (d sc) q - dmin m, d sc q exact, one rounding, as ggml's. */
static inline void dequant_q2_k_tile(const uint8_t *tile, int64_t G, void *out, int out_bf16,
                                     int64_t K, int64_t row0, int64_t rows);

/* One row of x prepared for the integer kernels (rf_split_x), per group g of 32.
 * AVX-512: x ~= scale[g] * (256 hi + lo) (X_SIGNED16), or scale[g] * (256 hi + lo - 32768)
 * (X_UNSIGNED16, hi and lo read as uint8); sum[g] is the exact fp32 sum of the group. Or, for
 * a batch's products (split_mode), as AVX2 splits it (X_INT8, int8 set; lo then holds int16
 * sums of X per half group).
 * AVX2: x ~= scale[g] * hi, int8 in -127..127 (lo: int16 sums of hi per half group, for
 * q3_k's products); sum[g] = scale[g] * sum of hi, the sum of the values the products see
 * (llama.cpp's Q8_1: with Q4_1's minimums near -max|w|, the exact sum would add their product
 * with the rounding error, 2-3x the error). */
typedef struct {
    int8_t *hi, *lo;
    float *scale, *sum;
    int int8; /* x held as int8 in hi (X_INT8; always at AVX2), else as 16-bit integers */
} split_x;

enum { X_SIGNED16 = 0, X_UNSIGNED16 = 1, X_INT8 = 2 }; /* rf_split_x's modes */

enum { FORMAT_BF16 = 0, FORMAT_Q4_1 = 1, FORMAT_Q8_0 = 2, FORMAT_Q6 = 3, FORMAT_Q4_K = 4,
       FORMAT_Q6_K = 5, FORMAT_Q5_K = 6, FORMAT_Q4_0 = 7, FORMAT_Q5_0 = 8, FORMAT_Q5_1 = 9,
       FORMAT_IQ4_NL = 10, FORMAT_IQ4_XS = 11, FORMAT_Q3_K = 12, FORMAT_Q2_K = 13 };

/* GGUF's IQ4_NL and IQ4_XS: a weight is its scale times IQ4_VALUES[its 4-bit index] (ggml's
 * kvalues_iq4nl). The levels look the values up with a byte shuffle: AVX-512 as value + 128
 * (unsigned, 1..241, with the group's low -128 d), AVX2 as the signed value. */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
static inline int has_lut(int fmt) { return fmt == FORMAT_IQ4_NL || fmt == FORMAT_IQ4_XS; }

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t rounded = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    const uint16_t quiet_nan = (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (u & 0x7fffffff) > 0x7f800000 ? quiet_nan : rounded; /* (a select: vectorizes) */
}

/* Bytes of a tiled integer weight's tile (K / GROUP groups; q4_k's per group on average). */
static inline __attribute__((always_inline)) int64_t group_bytes_of(const int fmt) {
    return fmt == FORMAT_Q4_1 ? Q4_1_BLOCK
         : fmt == FORMAT_Q4_0 || fmt == FORMAT_IQ4_NL ? Q4_0_BLOCK
         : fmt == FORMAT_Q5_0 ? Q5_0_BLOCK
         : fmt == FORMAT_Q5_1 ? Q5_1_BLOCK
         : fmt == FORMAT_Q6   ? Q6_BLOCK
         : fmt == FORMAT_Q4_K ? Q4_K_GROUP
         : fmt == FORMAT_Q6_K ? Q6_K_GROUP
         : fmt == FORMAT_Q5_K ? Q5_K_GROUP
         : fmt == FORMAT_IQ4_XS ? IQ4_XS_GROUP
         : fmt == FORMAT_Q3_K ? Q3_K_GROUP
         : fmt == FORMAT_Q2_K ? Q2_K_GROUP
                              : Q8_0_BLOCK;
}

/* Whether rf_split_x makes x the unsigned operand (the formats whose weights are signed bytes). */
static inline int x_unsigned(int fmt) {
    return fmt == FORMAT_Q8_0 || fmt == FORMAT_Q6 || fmt == FORMAT_Q6_K || fmt == FORMAT_Q3_K;
}

/* q6, q6_k and q3_k: symmetric values (q6: -32..31, q3_k: -4..3) with a scale per half group
 * of 16, unpacked a quad at a time into signed bytes (the q6 products); q6_k and q3_k hold
 * their scales as q6_k's header does (is_k6). */
static inline int is_q6(int fmt) {
    return fmt == FORMAT_Q6 || fmt == FORMAT_Q6_K || fmt == FORMAT_Q3_K;
}
static inline int is_k6(int fmt) { return fmt == FORMAT_Q6_K || fmt == FORMAT_Q3_K; }
static inline int64_t k6_block_bytes(int fmt) { return fmt == FORMAT_Q3_K ? Q3_K_BLOCK : Q6_K_BLOCK; }
static inline int64_t q6_group_bits(int fmt) { return fmt == FORMAT_Q3_K ? 192 : 384; }
/* What makes a q6-family value unsigned (q + offset: the int8 products' operand). */
static inline int q6_offset(int fmt) { return fmt == FORMAT_Q3_K ? 4 : 32; }

/* q4_1, q4_0, q5_1, q5_0, iq4_nl: a group's fp16 d[16] (q4_1, q5_1: then m[16]), then its
 * nibbles (q5_*: then their fifth bits, as q5_k's); q4_0's low m is -8 d (GGUF's Q4_0: w =
 * d (q - 8)), q5_0's -16 d; iq4_nl's nibbles are indices into IQ4_VALUES (GGUF's IQ4_NL, laid
 * out as q4_0). */
static inline int is_group_affine(int fmt) {
    return fmt == FORMAT_Q4_1 || fmt == FORMAT_Q4_0 || fmt == FORMAT_Q5_0 || fmt == FORMAT_Q5_1 ||
           fmt == FORMAT_IQ4_NL;
}
static inline int64_t group_header(int fmt) {
    return fmt == FORMAT_Q4_0 || fmt == FORMAT_Q5_0 || fmt == FORMAT_IQ4_NL ? 32 : 64;
}
/* The formats whose values have a fifth bit (the 64 bytes after a group's nibbles). */
static inline int has_fifth(int fmt) {
    return fmt == FORMAT_Q5_K || fmt == FORMAT_Q5_0 || fmt == FORMAT_Q5_1;
}

/* q4_k, q5_k and iq4_xs: a super-block's 8 groups of 32 under one header (q4_k, q5_k: fp16 d,
 * dmin, six-bit scales and mins: 256 bytes; iq4_xs: fp16 d, int8 scales: 160 bytes), then each
 * group's q4_1 nibbles (256 bytes), q5_k's followed by its fifth bits (64 bytes: byte 4 r + i
 * holds, at bit 2 c, that of column 8 c + i of row r and, at bit 2 c + 1, that of column
 * 8 c + 4 + i: chunk c's two nibble halves). */
static inline int is_k_affine(int fmt) {
    return fmt == FORMAT_Q4_K || fmt == FORMAT_Q5_K || fmt == FORMAT_IQ4_XS;
}
static inline int64_t k_block_bytes(int fmt) {
    return fmt == FORMAT_Q5_K ? Q5_K_BLOCK : fmt == FORMAT_IQ4_XS ? IQ4_XS_BLOCK : Q4_K_BLOCK;
}
static inline int64_t k_header_bytes(int fmt) { return fmt == FORMAT_IQ4_XS ? 160 : 256; }
static inline int64_t k_group_bytes(int fmt) { return fmt == FORMAT_Q5_K ? 320 : 256; }
static inline const uint8_t *k_header(int fmt, const uint8_t *tile, int64_t g) {
    return tile + (g / 8) * k_block_bytes(fmt);
}
static inline const uint8_t *k_nibbles(int fmt, const uint8_t *tile, int64_t g) {
    return k_header(fmt, tile, g) + k_header_bytes(fmt) + k_group_bytes(fmt) * (g % 8);
}

/* q2_k: w = (d sc) q - (dmin m) per half group of 16, q in 0..3 (GGUF's Q2_K as stored). Its
 * group g's 2-bit values (128 bytes, q3_k's low bit pairs' layout) and super-block header. */
static inline const uint8_t *q2_k_header(const uint8_t *tile, int64_t g) {
    return tile + (g / 8) * Q2_K_BLOCK;
}
static inline const uint8_t *q2_k_bits(const uint8_t *tile, int64_t g) {
    return q2_k_header(tile, g) + 320 + 128 * (g % 8);
}

/* Group g's values in a q6, q6_k or q3_k tile: q6, q6_k: its 256 bytes of low nibbles, then
 * its 128 of high bit pairs (the same two fields in both); q3_k: q + 4's low bit pairs (128
 * bytes, as q6's high ones), then its third bits (64 bytes: bit p of byte 4 r + i, that of
 * row r's column 4 p + i). */
static inline const uint8_t *q6_bits(int fmt, const uint8_t *tile, int64_t g) {
    return is_k6(fmt) ? tile + (g / 8) * k6_block_bytes(fmt) + 288 + q6_group_bits(fmt) * (g % 8)
                      : tile + g * Q6_BLOCK + 64;
}

/* How to split x for a product of `rows` rows with a weight of format fmt. The AVX-512 build
 * splits x into exact 16-bit integers: two vpdpbusd per weight byte, which costs nothing while
 * the weights' reading bounds a product (one or two rows) but makes a batch's products
 * compute-bound (a 1B model's batch-8 step: 62 ms against a 16 ms bandwidth bound). From
 * rf_batch_int8_rows rows on (default 3; 0: never), the 4- and 5-bit formats and q6 (a Q4
 * model's bytes) take x as int8 per group of 32 instead, llama.cpp's (and this project's AVX2)
 * precision: one vpdpbusd a weight byte; a batch's outputs then differ from each request's
 * alone by that rounding. The 5-bit formats, q6 and q6_k take int8 x from one row on (while
 * rf_batch_int8_rows > 0; kernels/cpu's INT8_X_FROM_ONE_ROW): their 16-bit products unpack
 * each weight quad before two or three vpdpbusd, which binds them to compute (q6 at ~40 GB/s:
 * a 1B's Q6_K head is a third of its step's bytes; q5_k at ~57 in L3, 84 with int8 x), where
 * int8 x reads ~60 and q4_k ~75 (32768 x 2048, 2 threads, avx512), as llama.cpp's K-quants take
 * their x as int8. (The AVX2 build splits every x as int8.) */
extern int rf_batch_int8_rows; /* gemm.c's, set by rf_set_batch_int8_rows */
static inline int split_mode(int fmt, int64_t rows) {
    const int int8_from_one_row = is_q6(fmt) || has_fifth(fmt);
    if (fmt == FORMAT_Q2_K) return X_INT8; /* (its only products: half groups' sums of X) */
    if (rf_batch_int8_rows > 0 && fmt != FORMAT_Q8_0 && (rows >= rf_batch_int8_rows || int8_from_one_row))
        return X_INT8;
    return x_unsigned(fmt) ? X_UNSIGNED16 : X_SIGNED16;
}

static inline float bf16_to_f32_1(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A bf16 tile's pairs [p0, P) (pairs[p * TILE + row]: two bf16 weights of a row each) for
 * rows 0 .. live - 1, written one at a time to out's rows row0 + row (K wide) as bf16 or
 * fp32: the tail the levels' vector loops leave of a dequantized tile. */
static inline void store_pairs_tail(const uint32_t *pairs, int64_t live, int64_t p0, int64_t P,
                                    void *out, int out_bf16, int64_t K, int64_t row0) {
    for (int64_t i = 0; i < live; i++)
        for (int64_t p = p0; p < P; p++) {
            const uint32_t v = pairs[p * TILE + i];
            if (out_bf16) {
                uint16_t *o = (uint16_t *)out + (row0 + i) * K + 2 * p;
                o[0] = (uint16_t)v, o[1] = (uint16_t)(v >> 16);
            } else {
                float *o = (float *)out + (row0 + i) * K + 2 * p;
                o[0] = bf16_to_f32_1((uint16_t)v), o[1] = bf16_to_f32_1((uint16_t)(v >> 16));
            }
        }
}

static inline void dequant_q2_k_tile(const uint8_t *tile, int64_t G, void *out, int out_bf16,
                                     int64_t K, int64_t row0, int64_t rows) {
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *hd = q2_k_header(tile, g), *bits = q2_k_bits(tile, g);
        for (int r = 0; r < TILE && row0 + r < rows; r++) {
            uint16_t dh, mh;
            memcpy(&dh, hd + 2 * r, 2), memcpy(&mh, hd + 32 + 2 * r, 2);
            const float d = _cvtsh_ss(dh), dmin = _cvtsh_ss(mh);
            for (int c = 0; c < GROUP; c++) {
                const int h = c / 16, j = (c % 16) / 4, i = c % 4;
                const uint8_t sb = hd[64 + 16 * (2 * (g % 8) + h) + r];
                const int q = (bits[(h * TILE + r) * 4 + i] >> (2 * j)) & 3;
                const float v = d * (float)(sb & 15) * (float)q - dmin * (float)(sb >> 4);
                const int64_t at = (row0 + r) * K + g * GROUP + c;
                if (out_bf16) ((uint16_t *)out)[at] = f32_to_bf16(v);
                else ((float *)out)[at] = v;
            }
        }
    }
}

/* This thread's share [t0, t1) of n items, inside an OpenMP parallel region. */
static inline void thread_range(int64_t n, int64_t *t0, int64_t *t1) {
    int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
    *t0 = n * id / threads;
    *t1 = n * (id + 1) / threads;
}

void rf_split_x(const float *x, int64_t K, int mode, split_x *out);
void rf_q4_1_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q8_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q6_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                      int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q4_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q4_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q5_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q5_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q5_1_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q2_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q3_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_iq4_nl_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                          int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_iq4_xs_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                          int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_q6_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
void rf_bf16_gemm_tiles(const uint8_t *w, const uint16_t *x, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1);
/* Output rows [n0, n1) of a tiled weight (n0 a multiple of TILE) as dense rows [n1 - n0, K] of
 * bf16 or fp32: the tiles [t0, t1) of them (gemm.c's rf_dequant_rows splits them). */
void rf_dequant_tiles(int fmt, const uint8_t *w, void *out, int out_bf16, int64_t n0, int64_t n1,
                      int64_t K, int64_t t0, int64_t t1);

#endif
