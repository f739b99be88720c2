/* Weight-only matrix products for a few rows (CPU decode), AVX-512 VNNI / BF16.
 *
 * y[m, n] = sum_k x[m, k] * w[n, k] for M <= 8 rows of x, with w in one of three "tiled"
 * layouts built by kernels/cpu/__init__.py. All three put 16 output rows side by side, so one
 * 512-bit register holds one partial sum for each of 16 outputs and nothing is ever summed
 * across lanes; x values are broadcast. The weights stream through once per call, whatever M.
 *
 * The quantized formats multiply integers with vpdpbusd (64 byte products per instruction).
 * x is first split, per group of 32, into a scale s and 16-bit integers X = 256 hi + lo
 * (x ~= s X, |error| <= max|x| / 65278 per group: some 128 times finer than the bf16 rounding
 * of the group's largest value), whose two bytes multiply the weight bytes separately. That
 * keeps the products exact in int32 while reading each weight as 4 or 8 bits.
 *
 * - q4_1 (GGUF's Q4_1, the default model's layers): per 16-row tile and 32-wide group, 16
 *   fp16 scales d, 16 fp16 minimums m, then 4 chunks of 64 bytes; byte 4r + i of chunk c holds
 *   q[r][8c + i] in its low nibble and q[r][8c + 4 + i] in its high one. w = m + d q, so
 *   sum w x = m sum x + d s sum q X, with sum x kept exact in fp32.
 * - q4_0 (GGUF's Q4_0 as stored, 4.5 bits a weight): q4_1's without the minimums (fp16 d[16],
 *   then the nibbles): w = d (q - 8), so m = -8 d.
 * - q5_0, q5_1 (GGUF's Q5_0 and Q5_1 as stored, 5.5 and 6 bits a weight): q4_0's and q4_1's,
 *   each group's nibbles followed by their fifth bits as q5_k's; q5_0's m is -16 d.
 * - iq4_nl (GGUF's IQ4_NL as stored, 4.5 bits a weight): q4_0's layout, the nibbles indices
 *   into IQ4_VALUES (gemv.h). A byte shuffle turns them into value + 128 (1..241, unsigned),
 *   multiplied as q4_0's nibbles with m = -128 d.
 * - iq4_xs (GGUF's IQ4_XS as stored, 4.31 bits a weight): per tile and super-block of 256,
 *   fp16 d[16] and the int8 scales of its 8 groups (ls - 32), then each group's nibbles as
 *   q4_k's: a group's d is d sc (exact in fp32), its values iq4_nl's.
 * - q8_0 (GGUF's Q8_0, the default model's tied embedding / head): per tile and group, 16
 *   fp32 scales d, then 8 quads of 64 bytes: byte 4r + i of quad p is q[r][4p + i] (int8).
 *   w = d q. Here x's bytes are the unsigned operand: X + 32768 = 256 hi + lo.
 * - q6 (GGUF's Q6_K, Q3_K and Q5_0 as stored): per tile and group, fp16 d[2][16] (one scale
 *   per row and half group of 16), then q + 32's low nibbles as q4_1 holds its nibbles (4
 *   chunks of 64 bytes), then its high two bits in 2 chunks of 64 bytes (byte 4r + i of chunk
 *   h: q[r][16h + 4j + i]'s in bits 2j, 2j + 1). Each quad is unpacked in registers into
 *   q8_0's quad (int8 q in -32..31) and multiplied as q8_0's, one half group at a time.
 * - q5_k (GGUF's Q5_K as stored, 5.5 bits a weight): q4_k's, each group's nibbles followed by
 *   the values' fifth bits (gemv.h: k_nibbles); q = nibble | 16 fifth bit, in 0..31.
 * - q6_k (GGUF's Q6_K as stored, 6.56 bits a weight): per tile and super-block of 256, fp16
 *   d[16] and the int8 scales of its 16 half groups (byte 16 s + r: row r's s-th), then each
 *   group's nibbles and high bit pairs as q6's; a half group's scale is d sc, exact in fp32.
 * - q3_k (GGUF's Q3_K as stored, 3.56 bits a weight): q6_k's header, then each group's q + 4
 *   (0..7) as low bit pairs (q6's high bit pairs' layout) and third bits (gemv.h: q6_bits);
 *   its quads unpack into q6's signed bytes (-4..3).
 * - q2_k (GGUF's Q2_K as stored, 2.625 bits a weight, as the file): per tile and super-block,
 *   fp16 d[16], dmin[16], the half groups' scale bytes (sc | m << 4), then each group's 2-bit
 *   values as q3_k's low bit pairs; w = (d sc) q - (dmin m). Always int8 x (split_mode).
 * - bf16: per tile and k pair, 16 dwords (w[r][2p], w[r][2p + 1]), multiplied with vdpbf16ps
 *   by bf16 x pairs: exact products, fp32 sums.
 *
 * Callers split the tiles over OpenMP threads (gemm.c, decode.c). For one row of x (a decode
 * step) each thread reads its tiles as several streams at once, which keeps more of memory's
 * latency in flight.
 */
#include "gemv.h"


#define ROW_BLOCK 4 /* rows of x per pass over a tile */
#ifndef STREAMS
#define STREAMS 6 /* weight streams per thread for one row of x (see q4_1_tiles_streams) */
#endif
#ifndef PREFETCH
#define PREFETCH 2048 /* bytes ahead of each stream: with one stream per thread, the hardware
                         prefetcher alone left the cores waiting (decode step 10.4 -> 7.5 ms,
                         bench/results/kernel-choices.md#2026-11-29-prefetch) */
#endif


static inline void prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t line = 0; line < bytes; line += 64)
        _mm_prefetch((const char *)p + PREFETCH + line, _MM_HINT_T0);
}


static inline void store_tile(void *y, int y_bf16, int64_t row_stride, int64_t n0, int64_t N,
                              __m512 v) {
    __mmask16 mask = N - n0 >= TILE ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n0)) - 1);
    if (y_bf16)
        _mm256_mask_storeu_epi16((uint16_t *)y + row_stride + n0, mask,
                                 (__m256i)_mm512_cvtneps_pbh(v));
    else
        _mm512_mask_storeu_ps((float *)y + row_stride + n0, mask, v);
}

/* ---- splitting x into 16-bit integers ---- */

/* x as int8 per group (X_INT8), as the AVX2 build splits it: scale = max|x| / 127, X in
 * -127..127 to nearest, sum = scale * sum X (the sum of the values the products see); lo, unused
 * by int8 X, holds each half group's sum of X as int16 (q6's products: half_sums). */
static void split_x_int8(const float *x, int64_t K, split_x out) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        out.scale[g] = amax / 127.0f;
        const __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        const __m512i A = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv)); /* nearest even */
        const __m512i B = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
        const int32_t sa = _mm512_reduce_add_epi32(A), sb = _mm512_reduce_add_epi32(B);
        out.sum[g] = out.scale[g] * (float)(sa + sb);
        ((int16_t *)out.lo)[2 * g] = (int16_t)sa, ((int16_t *)out.lo)[2 * g + 1] = (int16_t)sb;
        _mm_storeu_si128((__m128i *)(out.hi + g * GROUP), _mm512_cvtepi32_epi8(A));
        _mm_storeu_si128((__m128i *)(out.hi + g * GROUP + 16), _mm512_cvtepi32_epi8(B));
    }
}

void rf_split_x(const float *x, int64_t K, int mode, split_x *xs) {
    xs->int8 = mode == X_INT8;
    if (mode == X_INT8) {
        split_x_int8(x, K, *xs);
        return;
    }
    const split_x out = *xs;
    const int is_unsigned = mode == X_UNSIGNED16;
    const float limit = is_unsigned ? 32767.0f : 32639.0f; /* keeps hi within a byte */
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        __m512 a = _mm512_loadu_ps(xg), b = _mm512_loadu_ps(xg + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        out.sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
        out.scale[g] = amax / limit;
        __m512 inv = _mm512_set1_ps(amax > 0 ? limit / amax : 0.0f);
        for (int half = 0; half < 2; half++) {
            __m512i X = _mm512_cvtps_epi32(_mm512_mul_ps(half ? b : a, inv)); /* nearest even */
            __m512i hi, lo;
            if (is_unsigned) {
                __m512i U = _mm512_add_epi32(X, _mm512_set1_epi32(32768));
                hi = _mm512_srli_epi32(U, 8);
                lo = _mm512_and_si512(U, _mm512_set1_epi32(255));
            } else {
                hi = _mm512_srai_epi32(_mm512_add_epi32(X, _mm512_set1_epi32(128)), 8);
                lo = _mm512_sub_epi32(X, _mm512_slli_epi32(hi, 8));
            }
            _mm_storeu_si128((__m128i *)(out.hi + g * GROUP + 16 * half), _mm512_cvtepi32_epi8(hi));
            _mm_storeu_si128((__m128i *)(out.lo + g * GROUP + 16 * half), _mm512_cvtepi32_epi8(lo));
        }
    }
}

/* ---- q4_1 ---- */

/* M rows of x times S tiles from S places in the weights at once (S x M <= 8, M <= 4): the
 * cores wait on memory less with S independent streams in flight than with one (default
 * model's decode step, interleaved A/B: 7.9 ms with one stream, 6.3 with 2, 5.3 with 4, 4.4
 * with 6, 4.8 with 8, where registers run out: bench/results/single-stream.md). y[u * M + m]:
 * stream u, row m. */
/* q: chunk c's values (low nibbles: half 0, high: half 1) with their fifth bits (q5_k:
 * gemv.h) added as 16. */
static inline __attribute__((always_inline)) __m512i add_fifth_bits(__m512i q, __m512i bits,
                                                                     int c, int half) {
    const int at = 2 * c + half; /* the bit to move to bit 4 (epi16 shifts: the mask drops what
                                    crosses a byte) */
    const __m512i b = at <= 4 ? _mm512_slli_epi16(bits, 4 - at) : _mm512_srli_epi16(bits, at - 4);
    return _mm512_ternarylogic_epi32(q, b, _mm512_set1_epi8(0x10), 0xF8); /* q | (b & 16) */
}

/* iq4_nl's and iq4_xs's values + 128 in each 128-bit lane: a byte shuffle's table. */
static inline __m512i iq4_table(void) {
    const __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)IQ4_VALUES), _mm_set1_epi8((char)0x80));
    return _mm512_broadcast_i32x4(v);
}

/* A chunk's 64 weight bytes as the products' unsigned operand: nibbles (fmt's fifth bits
 * added as 16, or looked up in iq4_table); half 0: the low nibbles, 1: the high ones. */
static inline __attribute__((always_inline)) void nibble_values(
    const int fmt, const uint8_t *nib, int c, __m512i *w_lo, __m512i *w_hi) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), w = _mm512_loadu_si512(nib + 64 * c);
    *w_lo = _mm512_and_si512(w, low4);
    *w_hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low4);
    if (has_fifth(fmt)) {
        const __m512i bits = _mm512_loadu_si512(nib + 256);
        *w_lo = add_fifth_bits(*w_lo, bits, c, 0);
        *w_hi = add_fifth_bits(*w_hi, bits, c, 1);
    } else if (has_lut(fmt)) {
        *w_lo = _mm512_shuffle_epi8(iq4_table(), *w_lo);
        *w_hi = _mm512_shuffle_epi8(iq4_table(), *w_hi);
    }
}

/* The integer sums q X of one group of 32 for M rows of x (rows of group g) and S streams'
 * nibbles (nib[u]: the group's 4 chunks of 64 bytes, as q4_1 holds them; q5_*: their fifth
 * bits the 64 bytes after them): qx[u * M + m]. */
static inline __attribute__((always_inline)) void nibble_sums(
    const uint8_t *const *nib, const int fmt, int64_t g, const split_x *xs, __m512i *qx,
    const int S, const int M) {
    __m512i hi[8][ROW_BLOCK][2], lo[8][ROW_BLOCK][2]; /* [stream][row][nibble half] */
    for (int u = 0; u < S; u++)
        for (int m = 0; m < M; m++)
            hi[u][m][0] = hi[u][m][1] = lo[u][m][0] = lo[u][m][1] = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        __m512i h0[ROW_BLOCK], h1[ROW_BLOCK], l0[ROW_BLOCK], l1[ROW_BLOCK];
        for (int m = 0; m < M; m++) {
            const int32_t *h = (const int32_t *)(xs[m].hi + g * GROUP + 8 * c);
            const int32_t *l = (const int32_t *)(xs[m].lo + g * GROUP + 8 * c);
            h0[m] = _mm512_set1_epi32(h[0]), h1[m] = _mm512_set1_epi32(h[1]);
            l0[m] = _mm512_set1_epi32(l[0]), l1[m] = _mm512_set1_epi32(l[1]);
        }
        for (int u = 0; u < S; u++) {
            __m512i w_lo, w_hi;
            nibble_values(fmt, nib[u], c, &w_lo, &w_hi);
            for (int m = 0; m < M; m++) {
                hi[u][m][0] = _mm512_dpbusd_epi32(hi[u][m][0], w_lo, h0[m]);
                lo[u][m][0] = _mm512_dpbusd_epi32(lo[u][m][0], w_lo, l0[m]);
                hi[u][m][1] = _mm512_dpbusd_epi32(hi[u][m][1], w_hi, h1[m]);
                lo[u][m][1] = _mm512_dpbusd_epi32(lo[u][m][1], w_hi, l1[m]);
            }
        }
    }
    for (int u = 0; u < S; u++)
        for (int m = 0; m < M; m++)
            qx[u * M + m] = _mm512_add_epi32(
                _mm512_slli_epi32(_mm512_add_epi32(hi[u][m][0], hi[u][m][1]), 8),
                _mm512_add_epi32(lo[u][m][0], lo[u][m][1]));
}

/* A q4_1, q4_0, q5_*, iq4_nl group's d and m (blk: the group's block). */
static inline __attribute__((always_inline)) void group_d_m(const int fmt, const uint8_t *blk,
                                                            __m512 *d, __m512 *mn) {
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    if (group_header(fmt) == 32) /* q4_0, q5_0, iq4_nl */
        *mn = _mm512_mul_ps(*d, _mm512_set1_ps(fmt == FORMAT_Q4_0 ? -8.0f : fmt == FORMAT_Q5_0 ? -16.0f : -128.0f));
    else
        *mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
}

/* q4_1, q4_0, q5_1, q5_0. */
static inline __attribute__((always_inline)) void q4_1_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m512 *y,
    const int S, const int M) {
    const int64_t block = group_bytes_of(fmt);
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t off = g * block;
        const uint8_t *nib[8];
        for (int u = 0; u < S; u++)
            prefetch(blks[u] + off, block), nib[u] = blks[u] + off + group_header(fmt);
        __m512i qx[8 * ROW_BLOCK];
        nibble_sums(nib, fmt, g, xs, qx, S, M);
        for (int u = 0; u < S; u++) {
            __m512 d, mn;
            group_d_m(fmt, blks[u] + off, &d, &mn);
            for (int m = 0; m < M; m++) {
                __m512 dqx = _mm512_mul_ps(_mm512_cvtepi32_ps(qx[u * M + m]), _mm512_set1_ps(xs[m].scale[g]));
                y[u * M + m] = _mm512_fmadd_ps(d, dqx, y[u * M + m]);
                y[u * M + m] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xs[m].sum[g]), y[u * M + m]);
            }
        }
    }
}

/* ---- q4_k ---- */

/* Sub-block j's six-bit fields of a tile's 16 rows (low nibbles at `low`, high bit pairs at
 * `high`: the scales' or the mins') as fp32. */
static inline __attribute__((always_inline)) __m512 six_bit16(const uint8_t *low,
                                                              const uint8_t *high, int j) {
    __m512i l = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(low + 16 * (j >> 1))));
    __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(high + 16 * (j >> 2))));
    l = _mm512_and_si512(_mm512_srli_epi32(l, 4 * (j & 1)), _mm512_set1_epi32(15));
    h = _mm512_and_si512(_mm512_srli_epi32(h, 2 * (j & 3)), _mm512_set1_epi32(3));
    return _mm512_cvtepi32_ps(_mm512_or_si512(l, _mm512_slli_epi32(h, 4)));
}

/* Group j's scale and low in a super-block (its header h): q4_k, q5_k: d sc and -(dmin mn);
 * iq4_xs: d sc and -128 d sc. All exact in fp32 (fp16 times a six-bit integer, times 128). */
static inline __attribute__((always_inline)) void k_scales(const int fmt, const uint8_t *h, int j,
                                                           __m512 *d, __m512 *low) {
    const __m512 d16 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    if (fmt == FORMAT_IQ4_XS) {
        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(h + 32 + 16 * j)));
        *d = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(sc));
        *low = _mm512_mul_ps(*d, _mm512_set1_ps(-128.0f));
        return;
    }
    *d = _mm512_mul_ps(d16, six_bit16(h + 64, h + 192, j));
    *low = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32))),
                         six_bit16(h + 128, h + 224, j));
    *low = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(*low),
                                                _mm512_set1_epi32((int)0x80000000)));
}

/* q4_k, q5_k and iq4_xs: as q4_1's, a super-block's 8 groups under one header (k_scales). */
static inline __attribute__((always_inline)) void k_affine_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m512 *y,
    const int S, const int M) {
    const int64_t group_bytes = k_group_bytes(fmt);
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < G / 8; sb++) {
        const int64_t base = sb * k_block_bytes(fmt);
        for (int j = 0; j < 8; j++) {
            const int64_t header = k_header_bytes(fmt), g = 8 * sb + j;
            const int64_t off = base + header + group_bytes * j;
            const uint8_t *nib[8];
            for (int u = 0; u < S; u++) { /* (the header with the first sub-block: every byte once) */
                prefetch(blks[u] + (j ? off : base), j ? group_bytes : header + group_bytes);
                nib[u] = blks[u] + off;
            }
            __m512i qx[8 * ROW_BLOCK];
            nibble_sums(nib, fmt, g, xs, qx, S, M);
            for (int u = 0; u < S; u++) {
                __m512 d, low;
                k_scales(fmt, blks[u] + base, j, &d, &low);
                for (int m = 0; m < M; m++) {
                    __m512 dqx = _mm512_mul_ps(_mm512_cvtepi32_ps(qx[u * M + m]), _mm512_set1_ps(xs[m].scale[g]));
                    y[u * M + m] = _mm512_fmadd_ps(d, dqx, y[u * M + m]);
                    y[u * M + m] = _mm512_fmadd_ps(low, _mm512_set1_ps(xs[m].sum[g]), y[u * M + m]);
                }
            }
        }
    }
}

/* ---- q8_0 ---- */

static inline __attribute__((always_inline)) void q8_0_tiles_streams(
    const uint8_t *const *blks, int64_t G, const split_x *xs, __m512 *y, const int S, const int M) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t off = g * Q8_0_BLOCK;
        for (int u = 0; u < S; u++) prefetch(blks[u] + off, Q8_0_BLOCK);
        __m512i qsum[8], hi[8][ROW_BLOCK], lo[8][ROW_BLOCK];
        for (int u = 0; u < S; u++) {
            qsum[u] = _mm512_setzero_si512();
            for (int m = 0; m < M; m++) hi[u][m] = lo[u][m] = _mm512_setzero_si512();
        }
        for (int p = 0; p < 8; p++) {
            __m512i h[ROW_BLOCK], l[ROW_BLOCK];
            for (int m = 0; m < M; m++) {
                h[m] = _mm512_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]);
                l[m] = _mm512_set1_epi32(((const int32_t *)(xs[m].lo + g * GROUP))[p]);
            }
            for (int u = 0; u < S; u++) {
                __m512i w = _mm512_loadu_si512(blks[u] + off + 64 + 64 * p);
                qsum[u] = _mm512_dpbusd_epi32(qsum[u], ones, w);
                for (int m = 0; m < M; m++) {
                    hi[u][m] = _mm512_dpbusd_epi32(hi[u][m], h[m], w);
                    lo[u][m] = _mm512_dpbusd_epi32(lo[u][m], l[m], w);
                }
            }
        }
        for (int u = 0; u < S; u++) {
            __m512 d = _mm512_loadu_ps((const float *)(blks[u] + off));
            __m512i offset = _mm512_slli_epi32(qsum[u], 15); /* 32768 sum q */
            for (int m = 0; m < M; m++) {
                __m512i qx = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi[u][m], 8), lo[u][m]), offset);
                __m512 dqx = _mm512_mul_ps(_mm512_cvtepi32_ps(qx), _mm512_set1_ps(xs[m].scale[g]));
                y[u * M + m] = _mm512_fmadd_ps(d, dqx, y[u * M + m]);
            }
        }
    }
}

/* ---- q6 ---- */

/* Quad p (0..7) of a q6 or q6_k group (bits: q6_bits) as q8_0 holds its quads: byte 4r + i is
 * q[r][4p + i]. */
/* Quad p (columns 4p .. 4p + 3, byte 4 r + i: row r's column 4p + i) of a q6-family group
 * (bits: q6_bits) as q + q6_offset: unsigned, 0..63 (q3_k: 0..7). */
static inline __attribute__((always_inline)) __m512i q6_unsigned(const int fmt, const uint8_t *bits,
                                                                 int p) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
    if (fmt == FORMAT_Q3_K) { /* (epi16 shifts: the masks drop what crosses a byte) */
        const __m512i pairs = _mm512_loadu_si512(bits + 64 * (p >> 2));
        const __m512i third = _mm512_loadu_si512(bits + 128);
        const __m512i low = _mm512_and_si512(_mm512_srli_epi16(pairs, 2 * (p & 3)), two);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(third, p), _mm512_set1_epi8(1));
        return _mm512_or_si512(low, _mm512_slli_epi16(high, 2));
    }
    const __m512i l = _mm512_loadu_si512(bits + 64 * (p >> 1));
    const __m512i h = _mm512_loadu_si512(bits + 256 + 64 * (p >> 2));
    const __m512i nib = _mm512_and_si512(p & 1 ? _mm512_srli_epi16(l, 4) : l, low4);
    const __m512i top = _mm512_and_si512(_mm512_srli_epi16(h, 2 * (p & 3)), two);
    return _mm512_or_si512(nib, _mm512_slli_epi16(top, 4));
}

/* ... as signed bytes q (q6: -32..31, q3_k: -4..3). */
static inline __attribute__((always_inline)) __m512i q6_quad(const int fmt, const uint8_t *bits,
                                                             int p) {
    return _mm512_sub_epi8(q6_unsigned(fmt, bits, p), _mm512_set1_epi8((char)q6_offset(fmt)));
}

/* The scales of half `half` of group g for a q6-family tile's 16 rows: q6's fp16, q6_k's and
 * q3_k's d sc (an fp16 times an int8: exact in fp32). */
static inline __attribute__((always_inline)) __m512 q6_scales(const int fmt, const uint8_t *tile,
                                                              int64_t g, int half) {
    if (is_k6(fmt)) {
        const uint8_t *h = tile + (g / 8) * k6_block_bytes(fmt);
        const __m128i sc = _mm_loadu_si128((const __m128i *)(h + 32 + 16 * (2 * (g % 8) + half)));
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + g * Q6_BLOCK + 32 * half)));
}

/* A q6-family tile's bytes for group g ahead of use (q6_k's, q3_k's header with its first
 * group). */
static inline __attribute__((always_inline)) void q6_prefetch(const int fmt, const uint8_t *tile,
                                                              int64_t g) {
    if (fmt == FORMAT_Q6) {
        prefetch(tile + g * Q6_BLOCK, Q6_BLOCK);
        return;
    }
    if (g % 8 == 0) prefetch(tile + (g / 8) * k6_block_bytes(fmt), 288);
    prefetch(q6_bits(fmt, tile, g), q6_group_bits(fmt));
}

/* As q8_0_tiles_streams, a half group (4 quads, one scale) at a time. */
static inline __attribute__((always_inline)) void q6_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m512 *y,
    const int S, const int M) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        for (int u = 0; u < S; u++) q6_prefetch(fmt, blks[u], g);
        for (int half = 0; half < 2; half++) {
            __m512i qsum[8], hi[8][ROW_BLOCK], lo[8][ROW_BLOCK];
            for (int u = 0; u < S; u++) {
                qsum[u] = _mm512_setzero_si512();
                for (int m = 0; m < M; m++) hi[u][m] = lo[u][m] = _mm512_setzero_si512();
            }
            for (int p = 4 * half; p < 4 * half + 4; p++) {
                __m512i h[ROW_BLOCK], l[ROW_BLOCK];
                for (int m = 0; m < M; m++) {
                    h[m] = _mm512_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]);
                    l[m] = _mm512_set1_epi32(((const int32_t *)(xs[m].lo + g * GROUP))[p]);
                }
                for (int u = 0; u < S; u++) {
                    const __m512i w = q6_quad(fmt, q6_bits(fmt, blks[u], g), p);
                    qsum[u] = _mm512_dpbusd_epi32(qsum[u], ones, w);
                    for (int m = 0; m < M; m++) {
                        hi[u][m] = _mm512_dpbusd_epi32(hi[u][m], h[m], w);
                        lo[u][m] = _mm512_dpbusd_epi32(lo[u][m], l[m], w);
                    }
                }
            }
            for (int u = 0; u < S; u++) {
                const __m512 d = q6_scales(fmt, blks[u], g, half);
                __m512i offset = _mm512_slli_epi32(qsum[u], 15); /* 32768 sum q */
                for (int m = 0; m < M; m++) {
                    __m512i qx = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(hi[u][m], 8), lo[u][m]), offset);
                    __m512 dqx = _mm512_mul_ps(_mm512_cvtepi32_ps(qx), _mm512_set1_ps(xs[m].scale[g]));
                    y[u * M + m] = _mm512_fmadd_ps(d, dqx, y[u * M + m]);
                }
            }
        }
    }
}

/* ---- q4_1, q4_k, q5_k and q6 for x split as int8 (a batch: split_mode) ---- */

#define INT8_ROWS 4 /* rows of x a pass (two streams of 4: 16 accumulators and 8 sums) */


/* M rows of x (X_INT8) times S tiles of the 4- and 5-bit formats read side by side (S x M <= 8): per
 * group, one vpdpbusd a row per 4 weights (nibbles unsigned, X signed), then y += d s sum qX
 * + m sum x' as the 16-bit path's (q4_k's d sc and -(dmin mn) likewise). y[u * M + m]. */
static inline __attribute__((always_inline)) void nibble_int8_streams(
    const int fmt, const uint8_t *const *tiles, int64_t G, const split_x *xs, __m512 *y,
    const int S, const int M) {
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *nib[8];
        __m512 d[8], mn[8];
        for (int u = 0; u < S; u++) {
            if (is_k_affine(fmt)) {
                const uint8_t *h = k_header(fmt, tiles[u], g);
                const int j = (int)(g % 8);
                const int64_t group_bytes = k_group_bytes(fmt);
                nib[u] = k_nibbles(fmt, tiles[u], g);
                prefetch(j ? nib[u] : h, j ? group_bytes : k_header_bytes(fmt) + group_bytes);
                k_scales(fmt, h, j, &d[u], &mn[u]);
            } else {
                const uint8_t *blk = tiles[u] + g * group_bytes_of(fmt);
                prefetch(blk, group_bytes_of(fmt));
                nib[u] = blk + group_header(fmt);
                group_d_m(fmt, blk, &d[u], &mn[u]);
            }
        }
        __m512i acc[8];
        for (int u = 0; u < S * M; u++) acc[u] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++)
            for (int u = 0; u < S; u++) {
                __m512i w_lo, w_hi;
                nibble_values(fmt, nib[u], c, &w_lo, &w_hi);
                for (int m = 0; m < M; m++) {
                    const int32_t *xq = (const int32_t *)(xs[m].hi + g * GROUP + 8 * c);
                    acc[u * M + m] = _mm512_dpbusd_epi32(acc[u * M + m], w_lo, _mm512_set1_epi32(xq[0]));
                    acc[u * M + m] = _mm512_dpbusd_epi32(acc[u * M + m], w_hi, _mm512_set1_epi32(xq[1]));
                }
            }
        for (int u = 0; u < S; u++)
            for (int m = 0; m < M; m++) {
                const __m512 qx = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[u * M + m]),
                                                _mm512_set1_ps(xs[m].scale[g]));
                y[u * M + m] = _mm512_fmadd_ps(d[u], qx, y[u * M + m]);
                y[u * M + m] = _mm512_fmadd_ps(mn[u], _mm512_set1_ps(xs[m].sum[g]), y[u * M + m]);
            }
    }
}

/* q6 (q6_k, q3_k) for x split as int8: each quad unpacked as q + 32 (q3_k: q + 4), the
 * unsigned operand, one vpdpbusd a row per 4 weights; per half group (one scale) y += d s
 * (sum (q + 32) X - 32 sum X), sum X from the split (half_sums). As nibble_int8_streams
 * otherwise. */
static inline __attribute__((always_inline)) void q6_int8_streams(
    const int fmt, const uint8_t *const *tiles, int64_t G, const split_x *xs, __m512 *y,
    const int S, const int M) {
    const int offset = q6_offset(fmt);
    float sb_scales[2][256] __attribute__((aligned(64))); /* q6_k: [stream][half group][row] */
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        /* q6_k for one or two rows: the group's sc-weighted integer sums, both halves, and one
         * conversion (a mullo a row a half: for more rows the scales' conversion, shared by
         * the rows, costs less) */
        const int integer_sc = is_k6(fmt) && M <= 2;
        const uint8_t *bits[2];
        __m512i qxg[8];
        if (is_k6(fmt) && !integer_sc && g % 8 == 0) /* the super-block's d sc, once */
            for (int u = 0; u < S; u++)
                for (int i = 0; i < 16; i++)
                    _mm512_store_ps(sb_scales[u] + 16 * i, q6_scales(fmt, tiles[u], g + i / 2, i % 2));
        for (int u = 0; u < S; u++) q6_prefetch(fmt, tiles[u], g), bits[u] = q6_bits(fmt, tiles[u], g);
        for (int u = 0; u < S * M; u++) qxg[u] = _mm512_setzero_si512();
        for (int half = 0; half < 2; half++) {
            __m512i acc[8];
            for (int u = 0; u < S * M; u++) acc[u] = _mm512_setzero_si512();
            for (int p = 4 * half; p < 4 * half + 4; p++)
                for (int u = 0; u < S; u++) {
                    const __m512i q = q6_unsigned(fmt, bits[u], p);
                    for (int m = 0; m < M; m++)
                        acc[u * M + m] = _mm512_dpbusd_epi32(
                            acc[u * M + m], q, _mm512_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]));
                }
            for (int u = 0; u < S; u++) {
                if (integer_sc) { /* sc (q X) in int32: |.| < 2^25 a group */
                    const uint8_t *sc = tiles[u] + (g / 8) * k6_block_bytes(fmt) + 32 + 16 * (2 * (g % 8) + half);
                    const __m512i s = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc));
                    for (int m = 0; m < M; m++) {
                        const int32_t sx = ((const int16_t *)xs[m].lo)[2 * g + half];
                        const __m512i qx = _mm512_sub_epi32(acc[u * M + m], _mm512_set1_epi32(offset * sx));
                        qxg[u * M + m] = _mm512_add_epi32(qxg[u * M + m], _mm512_mullo_epi32(qx, s));
                    }
                    continue;
                }
                const __m512 d = is_k6(fmt)
                    ? _mm512_load_ps(sb_scales[u] + 16 * (2 * (g % 8) + half))
                    : q6_scales(fmt, tiles[u], g, half);
                for (int m = 0; m < M; m++) {
                    const int32_t sx = ((const int16_t *)xs[m].lo)[2 * g + half];
                    const __m512i qx = _mm512_sub_epi32(acc[u * M + m], _mm512_set1_epi32(offset * sx));
                    const __m512 dqx = _mm512_mul_ps(_mm512_cvtepi32_ps(qx), _mm512_set1_ps(xs[m].scale[g]));
                    y[u * M + m] = _mm512_fmadd_ps(d, dqx, y[u * M + m]);
                }
            }
        }
        if (integer_sc) /* y += d s sum_half sc q X: one conversion a group */
            for (int u = 0; u < S; u++) {
                const __m512 d = _mm512_cvtph_ps(
                    _mm256_loadu_si256((const __m256i *)(tiles[u] + (g / 8) * k6_block_bytes(fmt))));
                for (int m = 0; m < M; m++) {
                    const __m512 dqx = _mm512_mul_ps(_mm512_cvtepi32_ps(qxg[u * M + m]), _mm512_set1_ps(xs[m].scale[g]));
                    y[u * M + m] = _mm512_fmadd_ps(d, dqx, y[u * M + m]);
                }
            }
    }
}

/* q2_k (x always split as int8): per half group one vpdpbusd a row per 4 weights (q 0..3
 * unsigned, X signed), then y += (d sc) s sum q X - (dmin m) s sum X, sum X per half group
 * from the split (half_sums). y[u * M + m]. */
static inline __attribute__((always_inline)) void q2_k_int8_streams(
    const uint8_t *const *tiles, int64_t G, const split_x *xs, __m512 *y, const int S,
    const int M) {
    const __m512i two = _mm512_set1_epi8(3), low4 = _mm512_set1_epi32(15);
    for (int u = 0; u < S * M; u++) y[u] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *bits[2];
        for (int u = 0; u < S; u++) {
            if (g % 8 == 0) prefetch(q2_k_header(tiles[u], g), 320);
            bits[u] = q2_k_bits(tiles[u], g);
            prefetch(bits[u], 128);
        }
        for (int half = 0; half < 2; half++) {
            __m512i acc[8];
            for (int u = 0; u < S * M; u++) acc[u] = _mm512_setzero_si512();
            for (int p = 4 * half; p < 4 * half + 4; p++)
                for (int u = 0; u < S; u++) {
                    const __m512i w = _mm512_and_si512(
                        _mm512_srli_epi16(_mm512_loadu_si512(bits[u] + 64 * (p >> 2)), 2 * (p & 3)), two);
                    for (int m = 0; m < M; m++)
                        acc[u * M + m] = _mm512_dpbusd_epi32(
                            acc[u * M + m], w, _mm512_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]));
                }
            for (int u = 0; u < S; u++) {
                const uint8_t *hd = q2_k_header(tiles[u], g);
                const __m512i sb = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(hd + 64 + 16 * (2 * (g % 8) + half))));
                const __m512 dsc = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hd)),
                                                 _mm512_cvtepi32_ps(_mm512_and_si512(sb, low4)));
                const __m512 dmm = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(hd + 32))),
                                                 _mm512_cvtepi32_ps(_mm512_srli_epi32(sb, 4)));
                for (int m = 0; m < M; m++) {
                    const float sx = ((const int16_t *)xs[m].lo)[2 * g + half];
                    const __m512 qx = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[u * M + m]), _mm512_set1_ps(xs[m].scale[g]));
                    y[u * M + m] = _mm512_fmadd_ps(dsc, qx, y[u * M + m]);
                    y[u * M + m] = _mm512_fnmadd_ps(dmm, _mm512_set1_ps(xs[m].scale[g] * sx), y[u * M + m]);
                }
            }
        }
    }
}

/* Tiles [t0, t1) for M rows of x split as int8: pairs of tiles read side by side (two streams
 * of the weights in flight a thread, as the one-row path keeps six: read one tile at a time,
 * a batch's compute-heavy products drew memory at ~17 GB/s), INT8_ROWS rows a pass over a
 * pair (a later pass finds the pair in L1/L2). */
static inline __attribute__((always_inline)) void nibble_int8_tiles(
    const int fmt, const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
    int64_t N, int64_t G, int64_t t0, int64_t t1) {
    const int64_t tile_bytes = G * group_bytes_of(fmt), part = (t1 - t0) / 2;
    for (int64_t i = 0; i < part + (t1 - t0) % 2; i++) {
        const int S = i < part ? 2 : 1;
        const int64_t at[2] = {i < part ? t0 + i : t1 - 1, t0 + part + i};
        const uint8_t *tiles[2] = {w + at[0] * tile_bytes, w + at[1] * tile_bytes};
        for (int64_t m0 = 0; m0 < M; m0 += INT8_ROWS) {
            __m512 out[8];
            const int rows = M - m0 < INT8_ROWS ? (int)(M - m0) : INT8_ROWS;
#define ROWS(R)                                                                      \
    case R:                                                                          \
        if (fmt == FORMAT_Q2_K && S == 2) q2_k_int8_streams(tiles, G, xs + m0, out, 2, R); \
        else if (fmt == FORMAT_Q2_K) q2_k_int8_streams(tiles, G, xs + m0, out, 1, R); \
        else if (is_q6(fmt) && S == 2) q6_int8_streams(fmt, tiles, G, xs + m0, out, 2, R); \
        else if (is_q6(fmt)) q6_int8_streams(fmt, tiles, G, xs + m0, out, 1, R);     \
        else if (S == 2) nibble_int8_streams(fmt, tiles, G, xs + m0, out, 2, R);     \
        else nibble_int8_streams(fmt, tiles, G, xs + m0, out, 1, R);                \
        break;
            switch (rows) { /* a constant row count per call keeps the accumulators in registers */
            ROWS(1) ROWS(2) ROWS(3) default: ROWS(4)
            }
#undef ROWS
            for (int u = 0; u < S; u++)
                for (int m = 0; m < rows; m++)
                    store_tile(y, y_bf16, (m0 + m) * N, at[u] * TILE, N, out[u * rows + m]);
        }
    }
}

/* ---- the tile loop of the integer formats ---- */

/* Tiles [t0, t1) for one or two rows of x as `streams` streams at once; returns the first
 * tile left (fewer than `streams` of them). */
static inline __attribute__((always_inline)) int64_t streamed_tiles(
    const int fmt, const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t N,
    int64_t G, int64_t t0, int64_t t1, const int streams, const int M) {
    const int64_t part = (t1 - t0) / streams;
    for (int64_t i = 0; i < part; i++) {  /* tiles t0 + i + u part, u < streams */
        const uint8_t *blks[8];
        __m512 out[8];
        for (int u = 0; u < streams; u++) blks[u] = w + (t0 + i + u * part) * G * group_bytes_of(fmt);
        if (is_group_affine(fmt))
            q4_1_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else if (is_k_affine(fmt))
            k_affine_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else if (is_q6(fmt))
            q6_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else
            q8_0_tiles_streams(blks, G, xs, out, streams, M);
        for (int u = 0; u < streams; u++)
            for (int m = 0; m < M; m++)
                store_tile(y, y_bf16, m * N, (t0 + i + u * part) * TILE, N, out[u * M + m]);
    }
    return t0 + streams * part;
}

/* Tiles [t0, t1) of y = w x for M rows of x (split by rf_split_x). */
static inline __attribute__((always_inline)) void quantized_tiles(
    const int fmt, const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
    int64_t N, int64_t K, int64_t t0, int64_t t1) {
    const int64_t G = K / GROUP;
    if (xs[0].int8 && fmt != FORMAT_Q8_0) {
        nibble_int8_tiles(fmt, w, xs, y, y_bf16, M, N, G, t0, t1);
        return;
    }
    if (M == 1) /* then the rest of the tiles, fewer than the streams, one at a time */
        t0 = streamed_tiles(fmt, w, xs, y, y_bf16, N, G, t0, t1, STREAMS, 1);
    else if (M == 2)
        t0 = streamed_tiles(fmt, w, xs, y, y_bf16, N, G, t0, t1, STREAMS / 2, 2);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *blk = w + t * G * group_bytes_of(fmt);
        for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            __m512 out[ROW_BLOCK];
            const int rows = M - m0 < ROW_BLOCK ? (int)(M - m0) : ROW_BLOCK;
#define TILE_ROWS(R) (is_group_affine(fmt) ? q4_1_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R) \
                      : is_k_affine(fmt) ? k_affine_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R) \
                      : is_q6(fmt) ? q6_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R)   \
                                         : q8_0_tiles_streams(&blk, G, xs + m0, out, 1, R))
            switch (rows) { /* a constant row count per call keeps the accumulators in registers */
            case 1: TILE_ROWS(1); break;
            case 2: TILE_ROWS(2); break;
            case 3: TILE_ROWS(3); break;
            default: TILE_ROWS(4); break;
            }
#undef TILE_ROWS
            for (int m = 0; m < rows; m++) store_tile(y, y_bf16, (m0 + m) * N, t * TILE, N, out[m]);
        }
    }
}

void rf_q4_1_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q4_1, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q4_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q4_0, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q5_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q5_0, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q5_1_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q5_1, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q4_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q4_K, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q5_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q5_K, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q2_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q2_K, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q3_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q3_K, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_iq4_nl_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                          int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_IQ4_NL, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_iq4_xs_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                          int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_IQ4_XS, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q8_0_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q8_0, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q6_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                      int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q6, w, xs, y, y_bf16, M, N, K, t0, t1);
}

void rf_q6_k_gemm_tiles(const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    quantized_tiles(FORMAT_Q6_K, w, xs, y, y_bf16, M, N, K, t0, t1);
}

/* ---- bf16 ---- */

static inline __attribute__((always_inline)) void bf16_tile(const uint8_t *blk, const uint32_t *xp,
                                                             int64_t K, const int M, __m512 *y) {
    __m512 acc[ROW_BLOCK][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < K / 2; p++) {
        if ((p & 7) == 0) prefetch(blk + 64 * p, 512);
        __m512i wp = _mm512_loadu_si512(blk + 64 * p);
        for (int m = 0; m < M; m++) {
            __m512i xj = _mm512_set1_epi32((int)xp[m * (K / 2) + p]);
            acc[m][p & 3] = _mm512_dpbf16_ps(acc[m][p & 3], (__m512bh)wp, (__m512bh)xj);
        }
    }
    for (int m = 0; m < M; m++)
        y[m] = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
}

void rf_bf16_gemm_tiles(const uint8_t *w, const uint16_t *x, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    const uint32_t *xp = (const uint32_t *)x;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *blk = w + t * (K / 2) * 64;
        for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            __m512 out[ROW_BLOCK];
            const uint32_t *xm = xp + m0 * (K / 2);
            int rows = M - m0 < ROW_BLOCK ? (int)(M - m0) : ROW_BLOCK;
            switch (rows) {
            case 1: bf16_tile(blk, xm, K, 1, out); break;
            case 2: bf16_tile(blk, xm, K, 2, out); break;
            case 3: bf16_tile(blk, xm, K, 3, out); break;
            default: bf16_tile(blk, xm, K, 4, out); break;
            }
            for (int m = 0; m < rows; m++) store_tile(y, y_bf16, (m0 + m) * N, t * TILE, N, out[m]);
        }
    }
}

/* ---- dequantizing tiles into dense rows (many-row products: gemm.c's rf_dequant_rows) ----
 *
 * Output rows [n0, n1) of w, written as dense rows [n1 - n0, K] of bf16 (out_bf16) or fp32,
 * bit for bit what kernels/cpu/__init__.py's `unpack` computes in fp32, then rounded to bf16
 * as torch rounds (to nearest even): q4_1's d q is exact in fp32 (4-bit q, fp16 d), so m + d q
 * is one rounding whether or not it is fused; q8_0's d q is one product. A 64-byte chunk of a
 * q4_1 block (or two quads of a q8_0 one) holds 8 consecutive columns of all 16 rows: its
 * dwords interleaved (unpack lo/hi) give two rows' 8 bytes per 128-bit lane, widened to fp32,
 * scaled and written as 8 columns of those two rows. bf16 tiles are transposed 16 pairs at a
 * time (a 16 x 16 dword transpose). */

/* 16 values to bf16, to nearest even (vcvtneps2bf16: as torch rounds, except that it flushes
 * fp32 denormals, which fp16 scales and minimums never make: q4_1's values are multiples of
 * fp16 numbers, q8_0's of an fp32 scale that is max|w| / 127). */
static inline __m256i bf16_rne16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* Two rows' 8 values (lanes 0-7: row a, 8-15: row a + 1) into columns [col, col + 8) of rows a
 * and a + 1 (local indices), a row at or past `rows` skipped. */
static inline void put_pair(void *out, int out_bf16, int64_t K, int64_t a, int64_t rows,
                            int64_t col, __m512 v) {
    if (out_bf16) {
        const __m256i b = bf16_rne16(v);
        uint16_t *o = (uint16_t *)out + a * K + col;
        if (a < rows) _mm_storeu_si128((__m128i *)o, _mm256_castsi256_si128(b));
        if (a + 1 < rows) _mm_storeu_si128((__m128i *)(o + K), _mm256_extracti128_si256(b, 1));
    } else {
        float *o = (float *)out + a * K + col;
        if (a < rows) _mm256_storeu_ps(o, _mm512_castps512_ps256(v));
        if (a + 1 < rows)
            _mm256_storeu_ps(o + K, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    }
}

static inline __attribute__((always_inline)) void dequant_pair(
    const int fmt, __m128i bytes, const __m512 *dp, const __m512 *mp, int j, void *out,
    int out_bf16, int64_t K, int64_t row0, int64_t rows, int64_t col) {
    const int nibbles = (is_group_affine(fmt) || is_k_affine(fmt)) && !has_lut(fmt);
    __m512i q = nibbles ? _mm512_cvtepu8_epi32(bytes) : _mm512_cvtepi8_epi32(bytes);
    /* q4_1: d q is exact in fp32 (4-bit q, fp16 d), so the fused m + d q rounds once, as
     * unpack's sum of the product does (q4_k: (d sc) q with a six-bit sc, exact too); iq4_*
     * (signed values here) and q8_0: one product */
    const __m512 v = nibbles ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), dp[j], mp[j])
                                        : _mm512_mul_ps(_mm512_cvtepi32_ps(q), dp[j]);
    put_pair(out, out_bf16, K, row0 + 2 * j, rows, col, v);
}

/* One tile of an integer format (its G blocks) into local rows row0.. (fewer than 16 of them
 * below `rows`: a last partial tile, or the end of the range). A group's 4 chunks are read
 * first and each row's 64 bytes then written one after the other: written chunk by chunk, the
 * 16 rows' lines were open at once, and with K a power of two those share one L1 set, more
 * than its ways (3.5x slower at K = 2048 than at 2080). */
static inline __attribute__((always_inline)) void dequant_int_tile(
    const int fmt, const uint8_t *tile, int64_t G, void *out, int out_bf16, int64_t K,
    int64_t row0, int64_t rows) {
    const __m512i pair_idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *blk = tile + g * group_bytes_of(fmt), *nib = blk + group_header(fmt);
        __m512 d, m = _mm512_setzero_ps(), dp[8], mp[8];
        if (is_k_affine(fmt)) { /* exact products, as unpack's */
            nib = k_nibbles(fmt, tile, g);
            k_scales(fmt, k_header(fmt, tile, g), (int)(g % 8), &d, &m);
        } else if (is_q6(fmt)) { /* m holds the second half's scales */
            d = q6_scales(fmt, tile, g, 0);
            m = q6_scales(fmt, tile, g, 1);
        } else if (is_group_affine(fmt)) {
            group_d_m(fmt, blk, &d, &m);
        } else {
            d = _mm512_loadu_ps((const float *)blk);
        }
        for (int j = 0; j < 8; j++) { /* rows 2j, 2j + 1: lanes 0-7, 8-15 */
            const __m512i idx = _mm512_add_epi32(pair_idx, _mm512_set1_epi32(2 * j));
            dp[j] = _mm512_permutexvar_ps(idx, d);
            mp[j] = _mm512_permutexvar_ps(idx, m);
        }
        /* chunk c: columns 32 g + 8 c .. + 8; lane l of lo[c]: rows 4l, 4l + 1 (8 bytes each),
         * of hi[c]: rows 4l + 2, 4l + 3 */
        __m512i lo[4], hi[4];
        for (int c = 0; c < 4; c++) {
            __m512i a, b; /* dword r: row r's columns 8c..8c+3 (a) and 8c+4..8c+7 (b) */
            if (is_group_affine(fmt) || is_k_affine(fmt)) {
                nibble_values(fmt, nib, c, &a, &b);
                if (has_lut(fmt)) { /* v + 128 -> v (int8), so d v's zeros keep their signs */
                    a = _mm512_xor_si512(a, _mm512_set1_epi8((char)0x80));
                    b = _mm512_xor_si512(b, _mm512_set1_epi8((char)0x80));
                }
            } else if (is_q6(fmt)) {
                a = q6_quad(fmt, q6_bits(fmt, tile, g), 2 * c);
                b = q6_quad(fmt, q6_bits(fmt, tile, g), 2 * c + 1);
            } else {
                a = _mm512_loadu_si512(blk + 64 + 128 * c);
                b = _mm512_loadu_si512(blk + 128 + 128 * c);
            }
            lo[c] = _mm512_unpacklo_epi32(a, b);
            hi[c] = _mm512_unpackhi_epi32(a, b);
        }
        const int64_t col = g * GROUP;
#define PAIR(V, L, J)                                                                         \
    for (int c = 0; c < 4; c++)                                                               \
        dequant_pair(fmt, _mm512_extracti32x4_epi32(V[c], L),                                 \
                     is_q6(fmt) && c >= 2 ? mp : dp, mp, J, out, out_bf16, K, row0,           \
                     rows, col + 8 * c);
        PAIR(lo, 0, 0) PAIR(hi, 0, 1) PAIR(lo, 1, 2) PAIR(hi, 1, 3)
        PAIR(lo, 2, 4) PAIR(hi, 2, 5) PAIR(lo, 3, 6) PAIR(hi, 3, 7)
#undef PAIR
    }
}

static void dequant_bf16_tile(const uint8_t *tile, void *out, int out_bf16, int64_t K,
                              int64_t row0, int64_t rows) {
    const uint32_t *pairs = (const uint32_t *)tile; /* [K / 2][16] */
    const int64_t P = K / 2, live = rows - row0 < TILE ? rows - row0 : TILE;
    int64_t p0 = 0;
    for (; p0 + 16 <= P; p0 += 16) {
        __m512i r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(pairs + (p0 + i) * TILE);
        for (int k = 0; k < 8; k++) {
            t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
        }
        for (int k = 0; k < 4; k++) { /* r[4k + c], lane L: pairs 4k..4k+3 of row 4L + c */
            r[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
            r[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
            r[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
            r[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
        }
        for (int c = 0; c < 4; c++) { /* a 4 x 4 transpose of 128-bit lanes */
            const __m512i u0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
            const __m512i u1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xEE);
            const __m512i u2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
            const __m512i u3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xEE);
            t[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);      /* row c */
            t[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);  /* row 4 + c */
            t[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);  /* row 8 + c */
            t[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD); /* row 12 + c */
        }
        for (int64_t i = 0; i < live; i++) { /* t[i]: row i's columns 2 p0 .. 2 p0 + 32 */
            if (out_bf16) {
                _mm512_storeu_si512((uint16_t *)out + (row0 + i) * K + 2 * p0, t[i]);
            } else {
                float *o = (float *)out + (row0 + i) * K + 2 * p0;
                const __m512i lo16 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(t[i]));
                const __m512i hi16 = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(t[i], 1));
                _mm512_storeu_si512(o, _mm512_slli_epi32(lo16, 16));
                _mm512_storeu_si512(o + 16, _mm512_slli_epi32(hi16, 16));
            }
        }
    }
    store_pairs_tail(pairs, live, p0, P, out, out_bf16, K, row0); /* the last K / 2 % 16 */
}

void rf_dequant_tiles(int fmt, const uint8_t *w, void *out, int out_bf16, int64_t n0, int64_t n1,
                      int64_t K, int64_t t0, int64_t t1) {
    const int64_t G = K / GROUP, rows = n1 - n0;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t row0 = t * TILE - n0; /* n0 is a multiple of TILE */
        if (fmt == FORMAT_BF16)
            dequant_bf16_tile(w + t * (K / 2) * 64, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q4_1)
            dequant_int_tile(FORMAT_Q4_1, w + t * G * Q4_1_BLOCK, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q4_0)
            dequant_int_tile(FORMAT_Q4_0, w + t * G * Q4_0_BLOCK, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q5_0)
            dequant_int_tile(FORMAT_Q5_0, w + t * G * Q5_0_BLOCK, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q5_1)
            dequant_int_tile(FORMAT_Q5_1, w + t * G * Q5_1_BLOCK, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q6)
            dequant_int_tile(FORMAT_Q6, w + t * G * Q6_BLOCK, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q4_K)
            dequant_int_tile(FORMAT_Q4_K, w + t * G * Q4_K_GROUP, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q6_K)
            dequant_int_tile(FORMAT_Q6_K, w + t * G * Q6_K_GROUP, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q3_K)
            dequant_int_tile(FORMAT_Q3_K, w + t * G * Q3_K_GROUP, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q2_K)
            dequant_q2_k_tile(w + t * G * Q2_K_GROUP, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_Q5_K)
            dequant_int_tile(FORMAT_Q5_K, w + t * G * Q5_K_GROUP, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_IQ4_NL)
            dequant_int_tile(FORMAT_IQ4_NL, w + t * G * Q4_0_BLOCK, G, out, out_bf16, K, row0, rows);
        else if (fmt == FORMAT_IQ4_XS)
            dequant_int_tile(FORMAT_IQ4_XS, w + t * G * IQ4_XS_GROUP, G, out, out_bf16, K, row0, rows);
        else
            dequant_int_tile(FORMAT_Q8_0, w + t * G * Q8_0_BLOCK, G, out, out_bf16, K, row0, rows);
    }
}
