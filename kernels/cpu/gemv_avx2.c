/* Weight-only matrix products for a few rows (CPU decode), AVX2 + FMA + F16C.
 *
 * The same products, entry points and tiled weight layouts as gemv_avx512.c (read its header
 * comment for the layouts byte by byte), for CPUs without AVX-512: only AVX2, FMA, F16C and SSE
 * instructions (no VNNI, which most AVX2 CPUs lack). A 16-row tile is two 256-bit halves, rows
 * 0-7 and 8-15 (bytes 0-31 and 32-63 of each 64-byte chunk), each 32-bit lane holding one output
 * row's partial sum; x values are broadcast and nothing is summed across lanes.
 *
 * The quantized formats multiply bytes with vpmaddubsw (unsigned x signed bytes, adjacent
 * products summed into int16) after rf_split_x quantizes x per group of 32 to int8, as
 * llama.cpp does on AVX2: x ~= s X with s = max|x| / 127 and X in -127..127 rounded to nearest,
 * so |error| <= s / 2 = max|x| / 254 per value (rounding x to bf16 loses up to |x| / 256 of
 * each value: as much on the group's largest, less on the rest). Every format then multiplies
 * that same x' = s X: y = w x' up to fp32 sums' rounding.
 *
 * - q4_1: w = m + d q with q in 0..15. The nibbles are the unsigned operand and X the signed
 *   one; each vpmaddubsw pair sum is at most 2 * 15 * 127 = 3810 in magnitude, so the 8 of a
 *   group (4 chunks x 2 nibble halves) add up in int16 (<= 30480) before one vpmaddwd widens
 *   them to int32. sum w x' = d s sum q X + m s sum X, as llama.cpp's Q8_1 keeps s sum X.
 *   (The exact sum x in the m term, as the AVX-512 build takes it, would leave the error
 *   sum (w - m) (x - x'), and Q4_1's m sits near -max|w|: the default model's logits, int4
 *   decode step against fp32, came out with rms error 0.72 that way, 0.33 this way.)
 * - q4_0: as q4_1 with m = -8 d (no minimums stored); q5_1, q5_0 (m = -16 d) as q4_1, q4_0
 *   with q5_k's fifth bits.
 * - q4_k, q5_k: as q4_1 per group of 32, scale d sc and low -(dmin mn); q5_k's values (0..31)
 *   take their fifth bit from the 64 bytes after the group's nibbles. Its pair sums reach
 *   2 * 31 * 127 = 7874, so a chunk's two are widened to int32 at once (8 would overflow).
 * - q3_k, q2_k: unsigned values (q3_k's q + 4, q2_k's q) summed in int16 as q4_1's nibbles
 *   are, per half group (one scale): y += d sc s sum q X - (offset or dmin m) s sum X, the half
 *   groups' sums of X from the split.
 * - iq4_nl, iq4_xs: a byte shuffle looks the nibbles up in IQ4_VALUES (signed, -127..113), and
 *   they multiply as q8_0's bytes do (the sign moved onto X: |X| unsigned), each pair sum
 *   widened at once; w = d v (iq4_xs: d sc v), no low.
 * - q8_0: w = d q with q signed, so the sign moves onto q: |X| is the unsigned operand and
 *   sign(q, X) the signed one (the products are unchanged). A pair sum reaches 2 * 127 * 127,
 *   too much to add two in int16: each is widened by vpmaddwd at once.
 * - q6: each quad unpacked into q8_0's (int8 q in -32..31) and multiplied as q8_0's, one
 *   half group (4 quads, one fp16 scale per row) at a time; q6_k and q3_k (-4..3) likewise.
 * - bf16: each dword (w[2p], w[2p + 1]) of a row becomes two fp32 values (a bf16 is the top
 *   half of an fp32), multiplied by x's fp32-widened bf16 values with FMA: exact products,
 *   fp32 sums.
 *
 * Tiles are split over OpenMP threads (one thread pool with torch's libgomp). For one or two
 * rows of x each thread reads its tiles as several streams at once, which keeps more of
 * memory's latency in flight; AVX2's 16 registers allow fewer streams than AVX-512's 32 (the
 * default model's products for one row, 2 threads of an AMD EPYC: ~6% faster with 2 or 3
 * streams than with 1, slower again with 4 or 6:
 * bench/results/kernel-choices.md#2026-12-01-avx2-streams).
 */
#include "gemv.h"


#define ROW_BLOCK 4 /* rows of x per pass over a tile */
#ifndef STREAMS
#define STREAMS 3 /* weight streams per thread for one row of x */
#endif
#ifndef STREAMS_2ROWS
#define STREAMS_2ROWS 2 /* ... and for two */
#endif
#ifndef PREFETCH
#define PREFETCH 2048 /* bytes ahead of each stream */
#endif

static inline void prefetch(const uint8_t *p, int64_t bytes) {
    for (int64_t line = 0; line < bytes; line += 64)
        _mm_prefetch((const char *)p + PREFETCH + line, _MM_HINT_T0);
}

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* v's 8 values rounded to bf16 (nearest even; NaN stays NaN, as f32_to_bf16), one per dword. */
static inline __m256i bf16_bits(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

/* One tile's 16 outputs of one row of y: lo holds rows n0..n0+7, hi n0+8..n0+15; a last partial
 * tile writes only those below N. */
static inline void store_tile(void *y, int y_bf16, int64_t row_stride, int64_t n0, int64_t N,
                              __m256 lo, __m256 hi) {
    const int64_t count = N - n0 < TILE ? N - n0 : TILE;
    if (y_bf16) {
        /* packus interleaves the 128-bit lanes: lo0-3 hi0-3 lo4-7 hi4-7, put back in order */
        __m256i b = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(lo), bf16_bits(hi)), 0xD8);
        uint16_t *dst = (uint16_t *)y + row_stride + n0;
        if (count == TILE) {
            _mm256_storeu_si256((__m256i *)dst, b);
        } else {
            uint16_t tmp[TILE];
            _mm256_storeu_si256((__m256i *)tmp, b);
            memcpy(dst, tmp, count * sizeof(uint16_t));
        }
    } else {
        float *dst = (float *)y + row_stride + n0;
        if (count == TILE) {
            _mm256_storeu_ps(dst, lo);
            _mm256_storeu_ps(dst + 8, hi);
        } else {
            float tmp[TILE];
            _mm256_storeu_ps(tmp, lo);
            _mm256_storeu_ps(tmp + 8, hi);
            memcpy(dst, tmp, count * sizeof(float));
        }
    }
}

/* ---- quantizing x to int8 ---- */

void rf_split_x(const float *x, int64_t K, int mode, split_x *xs) {
    (void)mode; /* every format takes signed int8 X */
    const split_x out = *xs;
    xs->int8 = 1;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xg + 8 * i);
        __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                    _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        const float a = hmax8(amax);
        out.scale[g] = a / 127.0f;
        const __m256 inv = _mm256_set1_ps(a > 0 ? 127.0f / a : 0.0f);
        __m256i X[4];
        for (int i = 0; i < 4; i++) X[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)); /* nearest even */
        /* the sum of x' = s X, not of x (see the header comment): |sum X| <= 4064, exact; lo
         * holds each half group's sum of X as int16 (q3_k's products) */
        const __m256i first = _mm256_add_epi32(X[0], X[1]), second = _mm256_add_epi32(X[2], X[3]);
        const float h0 = hsum8(_mm256_cvtepi32_ps(first)), h1 = hsum8(_mm256_cvtepi32_ps(second));
        out.sum[g] = out.scale[g] * (h0 + h1);
        ((int16_t *)out.lo)[2 * g] = (int16_t)h0, ((int16_t *)out.lo)[2 * g + 1] = (int16_t)h1;
        /* the packs work per 128-bit lane: dwords come out as X0[0:4] X1[0:4] X2[0:4] X3[0:4]
         * X0[4:8] X1[4:8] X2[4:8] X3[4:8] */
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(X[0], X[1]), _mm256_packs_epi32(X[2], X[3]));
        _mm256_storeu_si256((__m256i *)(out.hi + g * GROUP), _mm256_permutevar8x32_epi32(b, order));
    }
}

/* ---- q4_1 ---- */

/* M rows of x times S tiles from S places in the weights at once (M <= 4). y[2 (u M + m) + h]:
 * stream u, row m, half h. */
/* Chunk c's fifth bits (q5_k: gemv.h) of rows 8h .. 8h + 7 as 16 in the bytes of its low
 * (half 0) or high nibbles. */
static inline __attribute__((always_inline)) __m256i fifth_bits(__m256i bits, int c, int half) {
    const int at = 2 * c + half; /* the bit to move to bit 4 (the mask drops what crosses a byte) */
    const __m256i b = at <= 4 ? _mm256_slli_epi16(bits, 4 - at) : _mm256_srli_epi16(bits, at - 4);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

/* Whether a format's group sums are int32 (wide_sums) rather than int16: the 5-bit formats'
 * and the looked-up values'. */
static inline int wide_sums(int fmt) { return has_fifth(fmt) || has_lut(fmt); }

/* The sums of one group's products for M rows of x (group g) and S streams' nibbles (nib[u]:
 * the group's 4 chunks of 64 bytes, as q4_1 holds them; q5_*: their fifth bits the 64 bytes
 * after them; iq4_*: indices into IQ4_VALUES): acc[u][m][half], int16, or int32 (wide_sums). */
static inline __attribute__((always_inline)) void nibble_sums(
    const uint8_t *const *nib, const int fmt, int64_t g, const split_x *xs,
    __m256i acc[8][ROW_BLOCK][2], const int S, const int M) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int five = has_fifth(fmt), lut = has_lut(fmt);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_VALUES));
    for (int u = 0; u < S; u++)
        for (int m = 0; m < M; m++) acc[u][m][0] = acc[u][m][1] = _mm256_setzero_si256();
    /* a loop, not unrolled: unrolled, GCC regroups the group's int16 sums into a tree
     * of all its products and spills them (M = 4 ran at 0.8 of the speed) */
#pragma GCC unroll 1
    for (int c = 0; c < 4; c++) {
        __m256i x0[ROW_BLOCK], x1[ROW_BLOCK]; /* X[8c .. 8c+3], X[8c+4 .. 8c+7] */
        __m256i a0[ROW_BLOCK], a1[ROW_BLOCK]; /* (lut: their magnitudes) */
        for (int m = 0; m < M; m++) {
            const int32_t *xq = (const int32_t *)(xs[m].hi + g * GROUP + 8 * c);
            x0[m] = _mm256_set1_epi32(xq[0]), x1[m] = _mm256_set1_epi32(xq[1]);
            if (lut) a0[m] = _mm256_abs_epi8(x0[m]), a1[m] = _mm256_abs_epi8(x1[m]);
        }
        for (int u = 0; u < S; u++)
            for (int h = 0; h < 2; h++) {
                __m256i w = _mm256_loadu_si256((const __m256i *)(nib[u] + 64 * c + 32 * h));
                __m256i w_lo = _mm256_and_si256(w, low4);
                __m256i w_hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                if (five) {
                    const __m256i bits = _mm256_loadu_si256((const __m256i *)(nib[u] + 256 + 32 * h));
                    w_lo = _mm256_or_si256(w_lo, fifth_bits(bits, c, 0));
                    w_hi = _mm256_or_si256(w_hi, fifth_bits(bits, c, 1));
                }
                if (lut) {
                    w_lo = _mm256_shuffle_epi8(table, w_lo), w_hi = _mm256_shuffle_epi8(table, w_hi);
                    for (int m = 0; m < M; m++) {
                        const __m256i p0 = _mm256_maddubs_epi16(a0[m], _mm256_sign_epi8(w_lo, x0[m]));
                        const __m256i p1 = _mm256_maddubs_epi16(a1[m], _mm256_sign_epi8(w_hi, x1[m]));
                        acc[u][m][h] = _mm256_add_epi32(acc[u][m][h], _mm256_add_epi32(
                            _mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
                    }
                    continue;
                }
                for (int m = 0; m < M; m++) {
                    const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w_lo, x0[m]),
                                                           _mm256_maddubs_epi16(w_hi, x1[m]));
                    acc[u][m][h] = five ? _mm256_add_epi32(acc[u][m][h], _mm256_madd_epi16(pairs, ones))
                                        : _mm256_add_epi16(acc[u][m][h], pairs);
                }
            }
    }
}

/* y += d s qx + mn sum for a group's sums (one stream u, half h of its rows; int16, or int32
 * where wide_sums; the looked-up values have no mn). */
static inline __attribute__((always_inline)) void scale_group(
    __m256i acc[8][ROW_BLOCK][2], const int fmt, int u, int h, __m256 d, __m256 mn,
    const split_x *xs, int64_t g, __m256 *y, const int M) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int m = 0; m < M; m++) {
        __m256 *out = y + 2 * (u * M + m) + h;
        __m256 qx = _mm256_cvtepi32_ps(wide_sums(fmt) ? acc[u][m][h] : _mm256_madd_epi16(acc[u][m][h], ones));
        *out = _mm256_fmadd_ps(d, _mm256_mul_ps(qx, _mm256_set1_ps(xs[m].scale[g])), *out);
        if (!has_lut(fmt)) *out = _mm256_fmadd_ps(mn, _mm256_set1_ps(xs[m].sum[g]), *out);
    }
}

/* A q4_1, q4_0, q5_*, iq4_nl group's d and m for rows 8h .. 8h + 7 (blk: the group's block). */
static inline __attribute__((always_inline)) void group_d_m(const int fmt, const uint8_t *blk,
                                                            int h, __m256 *d, __m256 *mn) {
    *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
    if (fmt == FORMAT_IQ4_NL)
        *mn = _mm256_setzero_ps();
    else if (fmt == FORMAT_Q4_0 || fmt == FORMAT_Q5_0)
        *mn = _mm256_mul_ps(*d, _mm256_set1_ps(fmt == FORMAT_Q4_0 ? -8.0f : -16.0f));
    else
        *mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)));
}

/* q4_1, q4_0, q5_1, q5_0. */
static inline __attribute__((always_inline)) void q4_1_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m256 *y,
    const int S, const int M) {
    const int64_t block = group_bytes_of(fmt);
    for (int u = 0; u < 2 * S * M; u++) y[u] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t off = g * block;
        const uint8_t *nib[8];
        for (int u = 0; u < S; u++)
            prefetch(blks[u] + off, block), nib[u] = blks[u] + off + group_header(fmt);
        __m256i acc[8][ROW_BLOCK][2]; /* [stream][row][half]: int16 sums of the group */
        nibble_sums(nib, fmt, g, xs, acc, S, M);
        for (int u = 0; u < S; u++)
            for (int h = 0; h < 2; h++) {
                __m256 d, mn;
                group_d_m(fmt, blks[u] + off, h, &d, &mn);
                scale_group(acc, fmt, u, h, d, mn, xs, g, y, M);
            }
    }
}

/* ---- q4_k ---- */

/* Sub-block j's six-bit fields of rows 8h .. 8h + 7 (low nibbles at `low`, high bit pairs at
 * `high`: the scales' or the mins') as fp32. */
static inline __attribute__((always_inline)) __m256 six_bit8(const uint8_t *low,
                                                             const uint8_t *high, int j, int h) {
    __m256i l = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(low + 16 * (j >> 1) + 8 * h)));
    __m256i t = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(high + 16 * (j >> 2) + 8 * h)));
    l = _mm256_and_si256(_mm256_srli_epi32(l, 4 * (j & 1)), _mm256_set1_epi32(15));
    t = _mm256_and_si256(_mm256_srli_epi32(t, 2 * (j & 3)), _mm256_set1_epi32(3));
    return _mm256_cvtepi32_ps(_mm256_or_si256(l, _mm256_slli_epi32(t, 4)));
}

/* Group j's scale and low for rows 8h .. 8h + 7 of a super-block (its header hd): q4_k, q5_k:
 * d sc and -(dmin mn); iq4_xs: d sc and none. All exact in fp32. */
static inline __attribute__((always_inline)) void k_scales(const int fmt, const uint8_t *hd, int j,
                                                           int h, __m256 *d, __m256 *mn) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 d16 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 16 * h)));
    if (fmt == FORMAT_IQ4_XS) {
        const __m128i sc = _mm_loadl_epi64((const __m128i *)(hd + 32 + 16 * j + 8 * h));
        *d = _mm256_mul_ps(d16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        *mn = _mm256_setzero_ps();
        return;
    }
    *d = _mm256_mul_ps(d16, six_bit8(hd + 64, hd + 192, j, h));
    *mn = _mm256_xor_ps(sign, _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 32 + 16 * h))),
        six_bit8(hd + 128, hd + 224, j, h)));
}

/* q4_k, q5_k and iq4_xs: as q4_1's, a super-block's 8 groups under one header (k_scales). */
static inline __attribute__((always_inline)) void k_affine_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m256 *y,
    const int S, const int M) {
    const int64_t group_bytes = k_group_bytes(fmt), header = k_header_bytes(fmt);
    for (int u = 0; u < 2 * S * M; u++) y[u] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < G / 8; sb++) {
        const int64_t base = sb * k_block_bytes(fmt);
        for (int j = 0; j < 8; j++) {
            const int64_t g = 8 * sb + j, off = base + header + group_bytes * j;
            const uint8_t *nib[8];
            for (int u = 0; u < S; u++) { /* (the header with the first sub-block: every byte once) */
                prefetch(blks[u] + (j ? off : base), j ? group_bytes : header + group_bytes);
                nib[u] = blks[u] + off;
            }
            __m256i acc[8][ROW_BLOCK][2];
            nibble_sums(nib, fmt, g, xs, acc, S, M);
            for (int u = 0; u < S; u++)
                for (int h = 0; h < 2; h++) {
                    __m256 d, mn;
                    k_scales(fmt, blks[u] + base, j, h, &d, &mn);
                    scale_group(acc, fmt, u, h, d, mn, xs, g, y, M);
                }
        }
    }
}

/* ---- q8_0 ---- */

static inline __attribute__((always_inline)) void q8_0_tiles_streams(
    const uint8_t *const *blks, int64_t G, const split_x *xs, __m256 *y, const int S, const int M) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int u = 0; u < 2 * S * M; u++) y[u] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int64_t off = g * Q8_0_BLOCK;
        for (int u = 0; u < S; u++) prefetch(blks[u] + off, Q8_0_BLOCK);
        __m256i acc[8][ROW_BLOCK][2]; /* [stream][row][half]: int32 sums of the group */
        for (int u = 0; u < S; u++)
            for (int m = 0; m < M; m++) acc[u][m][0] = acc[u][m][1] = _mm256_setzero_si256();
#pragma GCC unroll 1 /* as q4_1's chunks */
        for (int p = 0; p < 8; p++) {
            __m256i xq[ROW_BLOCK], xabs[ROW_BLOCK]; /* X[4p .. 4p+3] and their magnitudes */
            for (int m = 0; m < M; m++) {
                xq[m] = _mm256_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]);
                xabs[m] = _mm256_sign_epi8(xq[m], xq[m]);
            }
            for (int u = 0; u < S; u++)
                for (int h = 0; h < 2; h++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)(blks[u] + off + 64 + 64 * p + 32 * h));
                    for (int m = 0; m < M; m++) {
                        __m256i pairs = _mm256_maddubs_epi16(xabs[m], _mm256_sign_epi8(w, xq[m]));
                        acc[u][m][h] = _mm256_add_epi32(acc[u][m][h], _mm256_madd_epi16(pairs, ones));
                    }
                }
        }
        for (int u = 0; u < S; u++)
            for (int h = 0; h < 2; h++) {
                __m256 d = _mm256_loadu_ps((const float *)(blks[u] + off) + 8 * h);
                for (int m = 0; m < M; m++) {
                    __m256 *out = y + 2 * (u * M + m) + h;
                    __m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(xs[m].scale[g]));
                    *out = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(acc[u][m][h]), *out);
                }
            }
    }
}

/* ---- q6 ---- */

/* Quad p (0..7) of a q6 or q6_k group (bits: q6_bits), rows 8h .. 8h + 7, as q8_0 holds its
 * quads (int8 q). */
/* Quad p of rows 8h .. 8h + 7 of a q6-family group (bits: q6_bits) as signed bytes q (q6:
 * -32..31, q3_k: -4..3). */
static inline __attribute__((always_inline)) __m256i q6_quad(const int fmt, const uint8_t *bits,
                                                             int p, int h) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    if (fmt == FORMAT_Q3_K) { /* (epi16 shifts: the masks drop what crosses a byte) */
        const __m256i pairs = _mm256_loadu_si256((const __m256i *)(bits + 64 * (p >> 2) + 32 * h));
        const __m256i third = _mm256_loadu_si256((const __m256i *)(bits + 128 + 32 * h));
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(pairs, 2 * (p & 3)), two);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(third, p), _mm256_set1_epi8(1));
        return _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), _mm256_set1_epi8(4));
    }
    const __m256i l = _mm256_loadu_si256((const __m256i *)(bits + 64 * (p >> 1) + 32 * h));
    const __m256i t = _mm256_loadu_si256((const __m256i *)(bits + 256 + 64 * (p >> 2) + 32 * h));
    const __m256i nib = _mm256_and_si256(p & 1 ? _mm256_srli_epi16(l, 4) : l, low4);
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(t, 2 * (p & 3)), two);
    return _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_slli_epi16(top, 4)), _mm256_set1_epi8(32));
}

/* The scales of half `half` of group g for rows 8h .. 8h + 7 of a q6-family tile: q6's fp16,
 * q6_k's and q3_k's d sc (an fp16 times an int8: exact in fp32). */
static inline __attribute__((always_inline)) __m256 q6_scales(const int fmt, const uint8_t *tile,
                                                              int64_t g, int half, int h) {
    if (is_k6(fmt)) {
        const uint8_t *hd = tile + (g / 8) * k6_block_bytes(fmt);
        const __m128i sc = _mm_loadl_epi64(
            (const __m128i *)(hd + 32 + 16 * (2 * (g % 8) + half) + 8 * h));
        return _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 16 * h))),
                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    }
    return _mm256_cvtph_ps(
        _mm_loadu_si128((const __m128i *)(tile + g * Q6_BLOCK + 32 * half + 16 * h)));
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

/* As q8_0_tiles_streams, a half group (4 quads, one scale) at a time. q6_k folds each half
 * group's int8 scale into the integer sums (vpmaddwd by sc instead of by 1: |sc sum| < 2^21)
 * and converts once a group, under its fp16 d. */
static inline __attribute__((always_inline)) void q6_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m256 *y,
    const int S, const int M) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int u = 0; u < 2 * S * M; u++) y[u] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *bits[8];
        for (int u = 0; u < S; u++) q6_prefetch(fmt, blks[u], g), bits[u] = q6_bits(fmt, blks[u], g);
        __m256i acc[8][ROW_BLOCK][2]; /* [stream][row][rows half]: int32 sums */
        for (int half = 0; half < 2; half++) {
            __m256i by[8][2]; /* what vpmaddwd multiplies the pairs by: 1, or q6_k's sc */
            for (int u = 0; u < S; u++)
                for (int h = 0; h < 2; h++) {
                    if (!is_k6(fmt)) {
                        by[u][h] = ones;
                        continue;
                    }
                    const uint8_t *sc = blks[u] + (g / 8) * k6_block_bytes(fmt) + 32 + 16 * (2 * (g % 8) + half);
                    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * h)));
                    by[u][h] = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
                                               _mm256_slli_epi32(v, 16)); /* (sc, sc) a row */
                }
            if (!is_k6(fmt) || half == 0)
                for (int u = 0; u < S; u++)
                    for (int m = 0; m < M; m++) acc[u][m][0] = acc[u][m][1] = _mm256_setzero_si256();
#pragma GCC unroll 1 /* as q4_1's chunks */
            for (int p = 4 * half; p < 4 * half + 4; p++) {
                __m256i xq[ROW_BLOCK], xabs[ROW_BLOCK];
                for (int m = 0; m < M; m++) {
                    xq[m] = _mm256_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]);
                    xabs[m] = _mm256_sign_epi8(xq[m], xq[m]);
                }
                for (int u = 0; u < S; u++)
                    for (int h = 0; h < 2; h++) {
                        const __m256i w = q6_quad(fmt, bits[u], p, h);
                        for (int m = 0; m < M; m++) {
                            __m256i pairs = _mm256_maddubs_epi16(xabs[m], _mm256_sign_epi8(w, xq[m]));
                            acc[u][m][h] = _mm256_add_epi32(acc[u][m][h], _mm256_madd_epi16(pairs, by[u][h]));
                        }
                    }
            }
            if (is_k6(fmt) && half == 0) continue; /* the group's second half adds on */
            for (int u = 0; u < S; u++)
                for (int h = 0; h < 2; h++) {
                    const __m256 d = is_k6(fmt)
                        ? _mm256_cvtph_ps(_mm_loadu_si128(
                              (const __m128i *)(blks[u] + (g / 8) * k6_block_bytes(fmt) + 16 * h)))
                        : q6_scales(fmt, blks[u], g, half, h);
                    for (int m = 0; m < M; m++) {
                        __m256 *out = y + 2 * (u * M + m) + h;
                        __m256 ds = _mm256_mul_ps(d, _mm256_set1_ps(xs[m].scale[g]));
                        *out = _mm256_fmadd_ps(ds, _mm256_cvtepi32_ps(acc[u][m][h]), *out);
                    }
                }
        }
    }
}

/* q3_k and q2_k: their values unsigned (q3_k's q + 4 in 0..7, q2_k's q in 0..3) times X,
 * vpmaddubsw's pair sums (<= 2 * 7 * 127) added in int16 over a half group (4 quads: <= 7112),
 * as q4_1's nibbles are, then widened once: y += (d sc) s sum q X - low s sum X with low = 4 d sc
 * (q3_k's offset) or dmin m (q2_k's), sum X per half group from the split (lo). About half the
 * work a byte of the sign-moving products the other q6-family formats take. */
static inline __attribute__((always_inline)) void low_bit_tiles_streams(
    const int fmt, const uint8_t *const *blks, int64_t G, const split_x *xs, __m256 *y,
    const int S, const int M) {
    const __m256i ones = _mm256_set1_epi16(1), two = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m256i low4 = _mm256_set1_epi32(15);
    const int q3 = fmt == FORMAT_Q3_K;
    for (int u = 0; u < 2 * S * M; u++) y[u] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *bits[8];
        for (int u = 0; u < S; u++) {
            if (q3) {
                q6_prefetch(fmt, blks[u], g), bits[u] = q6_bits(fmt, blks[u], g);
                continue;
            }
            if (g % 8 == 0) prefetch(q2_k_header(blks[u], g), 320);
            bits[u] = q2_k_bits(blks[u], g);
            prefetch(bits[u], 128);
        }
        for (int half = 0; half < 2; half++) {
            __m256i acc[8][ROW_BLOCK][2]; /* [stream][row][rows half]: int16 sums */
            for (int u = 0; u < S; u++)
                for (int m = 0; m < M; m++) acc[u][m][0] = acc[u][m][1] = _mm256_setzero_si256();
#pragma GCC unroll 1 /* as q4_1's chunks */
            for (int p = 4 * half; p < 4 * half + 4; p++) {
                __m256i xq[ROW_BLOCK];
                for (int m = 0; m < M; m++)
                    xq[m] = _mm256_set1_epi32(((const int32_t *)(xs[m].hi + g * GROUP))[p]);
                for (int u = 0; u < S; u++)
                    for (int h = 0; h < 2; h++) { /* (epi16 shifts: the masks drop what crosses a byte) */
                        const __m256i pairs = _mm256_loadu_si256((const __m256i *)(bits[u] + 64 * (p >> 2) + 32 * h));
                        __m256i w = _mm256_and_si256(_mm256_srli_epi16(pairs, 2 * (p & 3)), two);
                        if (q3) {
                            const __m256i third = _mm256_loadu_si256((const __m256i *)(bits[u] + 128 + 32 * h));
                            w = _mm256_or_si256(w, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(third, p), one), 2));
                        }
                        for (int m = 0; m < M; m++)
                            acc[u][m][h] = _mm256_add_epi16(acc[u][m][h], _mm256_maddubs_epi16(w, xq[m]));
                    }
            }
            for (int u = 0; u < S; u++)
                for (int h = 0; h < 2; h++) {
                    __m256 dsc, low = _mm256_setzero_ps();
                    if (q3) {
                        dsc = q6_scales(fmt, blks[u], g, half, h);
                    } else {
                        const uint8_t *hd = q2_k_header(blks[u], g);
                        const __m256i sb = _mm256_cvtepu8_epi32(
                            _mm_loadl_epi64((const __m128i *)(hd + 64 + 16 * (2 * (g % 8) + half) + 8 * h)));
                        dsc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 16 * h))),
                                            _mm256_cvtepi32_ps(_mm256_and_si256(sb, low4)));
                        low = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 32 + 16 * h))),
                                            _mm256_cvtepi32_ps(_mm256_srli_epi32(sb, 4)));
                    }
                    for (int m = 0; m < M; m++) {
                        const float sx = ((const int16_t *)xs[m].lo)[2 * g + half];
                        __m256 qx = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc[u][m][h], ones));
                        if (q3) qx = _mm256_sub_ps(qx, _mm256_set1_ps(4.0f * sx)); /* (exact) */
                        __m256 *out = y + 2 * (u * M + m) + h;
                        *out = _mm256_fmadd_ps(dsc, _mm256_mul_ps(qx, _mm256_set1_ps(xs[m].scale[g])), *out);
                        if (!q3) *out = _mm256_fnmadd_ps(low, _mm256_set1_ps(xs[m].scale[g] * sx), *out);
                    }
                }
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
    for (int64_t i = 0; i < part; i++) { /* tiles t0 + i + u part, u < streams */
        const uint8_t *blks[8];
        __m256 out[16];
        for (int u = 0; u < streams; u++) blks[u] = w + (t0 + i + u * part) * G * group_bytes_of(fmt);
        if (is_group_affine(fmt))
            q4_1_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else if (is_k_affine(fmt))
            k_affine_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else if (fmt == FORMAT_Q3_K || fmt == FORMAT_Q2_K)
            low_bit_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else if (is_q6(fmt))
            q6_tiles_streams(fmt, blks, G, xs, out, streams, M);
        else
            q8_0_tiles_streams(blks, G, xs, out, streams, M);
        for (int u = 0; u < streams; u++)
            for (int m = 0; m < M; m++)
                store_tile(y, y_bf16, m * N, (t0 + i + u * part) * TILE, N,
                           out[2 * (u * M + m)], out[2 * (u * M + m) + 1]);
    }
    return t0 + streams * part;
}

/* Tiles [t0, t1) of y = w x for M rows of x (quantized by rf_split_x). */
static inline __attribute__((always_inline)) void quantized_tiles(
    const int fmt, const uint8_t *w, const split_x *xs, void *y, int y_bf16, int64_t M,
    int64_t N, int64_t K, int64_t t0, int64_t t1) {
    const int64_t G = K / GROUP;
    if (M == 1) /* then the rest of the tiles, fewer than the streams, one at a time */
        t0 = streamed_tiles(fmt, w, xs, y, y_bf16, N, G, t0, t1, STREAMS, 1);
    else if (M == 2)
        t0 = streamed_tiles(fmt, w, xs, y, y_bf16, N, G, t0, t1, STREAMS_2ROWS, 2);
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *blk = w + t * G * group_bytes_of(fmt);
        for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            __m256 out[2 * ROW_BLOCK];
            const int rows = M - m0 < ROW_BLOCK ? (int)(M - m0) : ROW_BLOCK;
#define TILE_ROWS(R) (is_group_affine(fmt) ? q4_1_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R) \
                      : is_k_affine(fmt) ? k_affine_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R) \
                      : fmt == FORMAT_Q3_K || fmt == FORMAT_Q2_K                            \
                          ? low_bit_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R)         \
                      : is_q6(fmt) ? q6_tiles_streams(fmt, &blk, G, xs + m0, out, 1, R)   \
                                         : q8_0_tiles_streams(&blk, G, xs + m0, out, 1, R))
            switch (rows) { /* a constant row count per call keeps the accumulators in registers */
            case 1: TILE_ROWS(1); break;
            case 2: TILE_ROWS(2); break;
            case 3: TILE_ROWS(3); break;
            default: TILE_ROWS(4); break;
            }
#undef TILE_ROWS
            for (int m = 0; m < rows; m++)
                store_tile(y, y_bf16, (m0 + m) * N, t * TILE, N, out[2 * m], out[2 * m + 1]);
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

/* One tile for M rows of x (bf16 pairs xp). Each FMA chain waits ~4 cycles per step, so one or
 * two rows keep even and odd k in separate accumulators to have enough chains in flight. */
static inline __attribute__((always_inline)) void bf16_tile(const uint8_t *blk, const uint32_t *xp,
                                                             int64_t K, const int M, __m256 *y) {
    const int split = M <= 2;
    const __m256i top = _mm256_set1_epi32((int)0xFFFF0000);
    __m256 even[ROW_BLOCK][2], odd[ROW_BLOCK][2];
    for (int m = 0; m < M; m++)
        for (int h = 0; h < 2; h++) even[m][h] = odd[m][h] = _mm256_setzero_ps();
    for (int64_t p = 0; p < K / 2; p++) {
        if ((p & 7) == 0) prefetch(blk + 64 * p, 512);
        __m256 we[2], wo[2];
        for (int h = 0; h < 2; h++) {
            __m256i wp = _mm256_loadu_si256((const __m256i *)(blk + 64 * p + 32 * h));
            we[h] = _mm256_castsi256_ps(_mm256_slli_epi32(wp, 16));
            wo[h] = _mm256_castsi256_ps(_mm256_and_si256(wp, top));
        }
        for (int m = 0; m < M; m++) {
            __m256i xj = _mm256_set1_epi32((int)xp[m * (K / 2) + p]);
            __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(xj, 16));
            __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(xj, top));
            for (int h = 0; h < 2; h++) {
                even[m][h] = _mm256_fmadd_ps(we[h], xe, even[m][h]);
                if (split)
                    odd[m][h] = _mm256_fmadd_ps(wo[h], xo, odd[m][h]);
                else
                    even[m][h] = _mm256_fmadd_ps(wo[h], xo, even[m][h]);
            }
        }
    }
    for (int m = 0; m < M; m++)
        for (int h = 0; h < 2; h++) y[2 * m + h] = split ? _mm256_add_ps(even[m][h], odd[m][h]) : even[m][h];
}

void rf_bf16_gemm_tiles(const uint8_t *w, const uint16_t *x, void *y, int y_bf16, int64_t M,
                        int64_t N, int64_t K, int64_t t0, int64_t t1) {
    const uint32_t *xp = (const uint32_t *)x;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *blk = w + t * (K / 2) * 64;
        for (int64_t m0 = 0; m0 < M; m0 += ROW_BLOCK) {
            __m256 out[2 * ROW_BLOCK];
            const uint32_t *xm = xp + m0 * (K / 2);
            int rows = M - m0 < ROW_BLOCK ? (int)(M - m0) : ROW_BLOCK;
            switch (rows) {
            case 1: bf16_tile(blk, xm, K, 1, out); break;
            case 2: bf16_tile(blk, xm, K, 2, out); break;
            case 3: bf16_tile(blk, xm, K, 3, out); break;
            default: bf16_tile(blk, xm, K, 4, out); break;
            }
            for (int m = 0; m < rows; m++)
                store_tile(y, y_bf16, (m0 + m) * N, t * TILE, N, out[2 * m], out[2 * m + 1]);
        }
    }
}

/* ---- dequantizing tiles into dense rows (many-row products: gemm.c's rf_dequant_rows) ----
 *
 * What gemv_avx512.c's rf_dequant_tiles writes (bit for bit `unpack`, rounded to bf16 as torch
 * rounds), with 256-bit vectors: per half of a 64-byte chunk (rows 0-7, 8-15) the dwords of
 * columns 8c..8c+3 and 8c+4..8c+7 interleave into one row's 8 bytes per 64-bit half, widened
 * to fp32 and scaled with the row's d (and m); bf16 tiles are transposed 8 x 8 dwords. */

/* One row's 8 values into columns [col, col + 8) of local row a (none at or past `rows`). */
static inline void put_row(void *out, int out_bf16, int64_t K, int64_t a, int64_t rows,
                           int64_t col, __m256 v) {
    if (a >= rows) return;
    if (out_bf16) {
        const __m256i b = bf16_bits(v);
        _mm_storeu_si128((__m128i *)((uint16_t *)out + a * K + col),
                         _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
    } else {
        _mm256_storeu_ps((float *)out + a * K + col, v);
    }
}

static inline __attribute__((always_inline)) void dequant_row(
    const int fmt, __m128i bytes, const float *ds, const float *ms, int r, void *out,
    int out_bf16, int64_t K, int64_t row0, int64_t rows, int64_t col) {
    const int nibbles = (is_group_affine(fmt) || is_k_affine(fmt)) && !has_lut(fmt);
    const __m256i q = nibbles ? _mm256_cvtepu8_epi32(bytes) : _mm256_cvtepi8_epi32(bytes);
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(ds[r]));
    if (nibbles) v = _mm256_add_ps(_mm256_set1_ps(ms[r]), v);
    put_row(out, out_bf16, K, row0 + r, rows, col, v);
}

/* One tile of an integer format into local rows row0.. below `rows`. A half tile's 4 chunks
 * are read first and each row's columns then written one after the other (see
 * gemv_avx512.c's dequant_int_tile: rows a power of two apart share an L1 set). */
static inline __attribute__((always_inline)) void dequant_int_tile(
    const int fmt, const uint8_t *tile, int64_t G, void *out, int out_bf16, int64_t K,
    int64_t row0, int64_t rows) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    float ds[TILE], ms[TILE];
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *blk = tile + g * group_bytes_of(fmt), *nib = blk + group_header(fmt);
        if (is_k_affine(fmt)) {
            const uint8_t *hd = k_header(fmt, tile, g);
            nib = k_nibbles(fmt, tile, g);
            for (int h = 0; h < 2; h++) {
                __m256 d, mn;
                k_scales(fmt, hd, (int)(g % 8), h, &d, &mn);
                _mm256_storeu_ps(ds + 8 * h, d), _mm256_storeu_ps(ms + 8 * h, mn);
            }
        } else if (is_q6(fmt)) { /* ms holds the second half's scales */
            for (int h = 0; h < 2; h++) {
                _mm256_storeu_ps(ds + 8 * h, q6_scales(fmt, tile, g, 0, h));
                _mm256_storeu_ps(ms + 8 * h, q6_scales(fmt, tile, g, 1, h));
            }
        } else if (is_group_affine(fmt)) {
            for (int h = 0; h < 2; h++) {
                __m256 d, mn;
                group_d_m(fmt, blk, h, &d, &mn);
                _mm256_storeu_ps(ds + 8 * h, d), _mm256_storeu_ps(ms + 8 * h, mn);
            }
        } else {
            memcpy(ds, blk, sizeof ds);
        }
        const int64_t col = g * GROUP;
        for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
            /* per chunk c (columns 8c .. 8c + 7): lane l of lo: rows 8h + 4l, + 1 (8 bytes
             * each); of hi: rows 8h + 4l + 2, + 3 */
            __m128i l0[4], l1[4], h0[4], h1[4];
            for (int c = 0; c < 4; c++) {
                __m256i a, b;
                if (is_group_affine(fmt) || is_k_affine(fmt)) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(nib + 64 * c + 32 * h));
                    a = _mm256_and_si256(w, low4);
                    b = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                    if (has_fifth(fmt)) {
                        const __m256i bits = _mm256_loadu_si256((const __m256i *)(nib + 256 + 32 * h));
                        a = _mm256_or_si256(a, fifth_bits(bits, c, 0));
                        b = _mm256_or_si256(b, fifth_bits(bits, c, 1));
                    } else if (has_lut(fmt)) {
                        const __m256i table = _mm256_broadcastsi128_si256(
                            _mm_loadu_si128((const __m128i *)IQ4_VALUES));
                        a = _mm256_shuffle_epi8(table, a), b = _mm256_shuffle_epi8(table, b);
                    }
                } else if (is_q6(fmt)) {
                    a = q6_quad(fmt, q6_bits(fmt, tile, g), 2 * c, h);
                    b = q6_quad(fmt, q6_bits(fmt, tile, g), 2 * c + 1, h);
                } else {
                    a = _mm256_loadu_si256((const __m256i *)(blk + 64 + 128 * c + 32 * h));
                    b = _mm256_loadu_si256((const __m256i *)(blk + 128 + 128 * c + 32 * h));
                }
                const __m256i lo = _mm256_unpacklo_epi32(a, b), hi = _mm256_unpackhi_epi32(a, b);
                l0[c] = _mm256_castsi256_si128(lo), l1[c] = _mm256_extracti128_si256(lo, 1);
                h0[c] = _mm256_castsi256_si128(hi), h1[c] = _mm256_extracti128_si256(hi, 1);
            }
            const int r = 8 * h;
#define ROW(V, R)                                                                               \
    for (int c = 0; c < 4; c++)                                                                 \
        dequant_row(fmt, V, is_q6(fmt) && c >= 2 ? ms : ds, ms, r + (R), out, out_bf16,       \
                    K, row0, rows, col + 8 * c)
            ROW(l0[c], 0); ROW(_mm_unpackhi_epi64(l0[c], l0[c]), 1);
            ROW(h0[c], 2); ROW(_mm_unpackhi_epi64(h0[c], h0[c]), 3);
            ROW(l1[c], 4); ROW(_mm_unpackhi_epi64(l1[c], l1[c]), 5);
            ROW(h1[c], 6); ROW(_mm_unpackhi_epi64(h1[c], h1[c]), 7);
#undef ROW
        }
    }
}

static void dequant_bf16_tile(const uint8_t *tile, void *out, int out_bf16, int64_t K,
                              int64_t row0, int64_t rows) {
    const uint32_t *pairs = (const uint32_t *)tile; /* [K / 2][16] */
    const int64_t P = K / 2, live = rows - row0 < TILE ? rows - row0 : TILE;
    int64_t p0 = 0;
    for (; p0 + 8 <= P; p0 += 8) {
        for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
            __m256 r[8], t[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_castsi256_ps(
                    _mm256_loadu_si256((const __m256i *)(pairs + (p0 + i) * TILE + 8 * h)));
            for (int k = 0; k < 4; k++) {
                t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
                t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
            }
            for (int k = 0; k < 2; k++) { /* r[4k + c], lane L: pairs 4k..4k+3 of row 4L + c */
                r[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], _MM_SHUFFLE(1, 0, 1, 0));
                r[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], _MM_SHUFFLE(3, 2, 3, 2));
                r[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], _MM_SHUFFLE(1, 0, 1, 0));
                r[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int c = 0; c < 4; c++) {
                t[c] = _mm256_permute2f128_ps(r[c], r[4 + c], 0x20);     /* row 8h + c */
                t[4 + c] = _mm256_permute2f128_ps(r[c], r[4 + c], 0x31); /* row 8h + 4 + c */
            }
            for (int64_t i = 0; i < 8 && 8 * h + i < live; i++) {
                const int64_t row = row0 + 8 * h + i;
                const __m256i v = _mm256_castps_si256(t[i]); /* columns 2 p0 .. 2 p0 + 16 */
                if (out_bf16) {
                    _mm256_storeu_si256((__m256i *)((uint16_t *)out + row * K + 2 * p0), v);
                } else {
                    float *o = (float *)out + row * K + 2 * p0;
                    const __m256i lo16 = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(v));
                    const __m256i hi16 = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1));
                    _mm256_storeu_si256((__m256i *)o, _mm256_slli_epi32(lo16, 16));
                    _mm256_storeu_si256((__m256i *)(o + 8), _mm256_slli_epi32(hi16, 16));
                }
            }
        }
    }
    store_pairs_tail(pairs, live, p0, P, out, out_bf16, K, row0); /* the last K / 2 % 8 */
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
