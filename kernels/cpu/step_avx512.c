/* The decode step's vector kernels for AVX-512 BF16 (see decode.h): attention over the KV pool
 * with vdpbf16ps, SiLU, argmax. */
#include <math.h>
#include <string.h>

#include "decode.h"

static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* ---- attention ---- */

/* r[i] = sum of v[i]'s 16 lanes, for 16 vectors at once (a transposing reduction: ~3
 * instructions per sum instead of ~8 for each one alone). */
static inline __m512 sum16(const __m512 *v) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++) /* per 128-bit block: halves of v[2i], v[2i+1] interleaved */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; j++) { /* per 128-bit block: its sums of v[4j .. 4j + 3] */
        __m512d c = _mm512_castps_pd(t[2 * j]), d = _mm512_castps_pd(t[2 * j + 1]);
        u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    __m512 p = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    __m512 q = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(p, q, 0x88), _mm512_shuffle_f32x4(p, q, 0xDD));
}

/* Scores of one query head (bf16 qb, head_dim values) against keys
 * [t0, t0 + n) of one KV head, times scale, into s[0 .. n). CH is a constant at each call,
 * so the 16 keys' accumulators stay in registers. */
static inline __attribute__((always_inline)) void head_scores(
    const rf_model *m, const uint16_t *k_cache, int64_t kvh, int64_t row, const int32_t *slots,
    int64_t t0, int64_t n, const uint16_t *qb, float *s, const int CH) {
    const int64_t D = m->head_dim;
    __m512i q[16];
    __mmask32 km[16]; /* which of chunk c's 32 values are in the row */
    for (int c = 0; c < CH; c++) {
        const int64_t rest = D - 32 * c;
        km[c] = rest >= 32 ? (__mmask32)0xFFFFFFFF : rest > 0 ? (__mmask32)((1u << rest) - 1) : 0;
        q[c] = _mm512_maskz_loadu_epi16(km[c], qb + 32 * c);
    }
    for (int64_t b = 0; b < n; b += 16) {
        const int64_t keys = n - b < 16 ? n - b : 16;
        __m512 v[16];
        for (int j = 0; j < 16; j++) { /* past the last key: repeat it, the lane is dropped */
            const uint16_t *k = k_cache + (int64_t)slots[t0 + b + (j < keys ? j : keys - 1)] * row + kvh * D;
            v[j] = _mm512_setzero_ps();
            for (int c = 0; c < CH; c++) {
                __m512i kc = _mm512_maskz_loadu_epi16(km[c], k + 32 * c);
                v[j] = _mm512_dpbf16_ps(v[j], (__m512bh)kc, (__m512bh)q[c]);
            }
        }
        __m512 r = _mm512_mul_ps(sum16(v), _mm512_set1_ps(m->scale));
        _mm512_mask_storeu_ps(s + b, (__mmask16)((1u << keys) - 1), r);
    }
}

/* The exp-weighted V sum of G query heads (their bf16 weights w[g], pairs of keys per dword)
 * over keys [t0, t0 + n) of one KV head, for 32 values of d from d0, added into out[g]. Two
 * keys at a time: their V rows interleaved into bf16 pairs times the pair of weights
 * (vdpbf16ps). Lanes come out in unpacklo/hi's order (d = 8 block + i, and + 4), put back at
 * the end. G is a constant at each call (registers again). */
static inline __attribute__((always_inline)) void weighted_values(
    const rf_model *m, const uint16_t *v_cache, int64_t kvh, int64_t row, const int32_t *slots,
    int64_t t0, int64_t n, int64_t d0, const uint32_t *const *w, float *const *out, const int G) {
    const int64_t D = m->head_dim;
    const __mmask32 dm = D - d0 >= 32 ? (__mmask32)0xFFFFFFFF : (__mmask32)((1u << (D - d0)) - 1);
    const uint16_t *base = v_cache + kvh * D + d0;
    __m512 lo[8], hi[8];
    for (int g = 0; g < G; g++) lo[g] = hi[g] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; t += 2) {
        __m512i a = _mm512_maskz_loadu_epi16(dm, base + (int64_t)slots[t0 + t] * row);
        __m512i b = t + 1 < n ? _mm512_maskz_loadu_epi16(dm, base + (int64_t)slots[t0 + t + 1] * row)
                              : _mm512_setzero_si512(); /* its weight is 0 too */
        __m512bh ab_lo = (__m512bh)_mm512_unpacklo_epi16(a, b), ab_hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
        for (int g = 0; g < G; g++) {
            __m512bh wt = (__m512bh)_mm512_set1_epi32((int)w[g][t / 2]);
            lo[g] = _mm512_dpbf16_ps(lo[g], ab_lo, wt);
            hi[g] = _mm512_dpbf16_ps(hi[g], ab_hi, wt);
        }
    }
    const __m512i order_lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i order_hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int g = 0; g < G; g++) {
        float *o = out[g] + d0;
        __m512 first = _mm512_permutex2var_ps(lo[g], order_lo, hi[g]);
        _mm512_mask_storeu_ps(o, (__mmask16)dm, _mm512_add_ps(_mm512_maskz_loadu_ps((__mmask16)dm, o), first));
        if (D - d0 > 16) {
            __m512 second = _mm512_permutex2var_ps(lo[g], order_hi, hi[g]);
            __mmask16 k = (__mmask16)(dm >> 16);
            _mm512_mask_storeu_ps(o + 16, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, o + 16), second));
        }
    }
}

/* Whole rows (row_bytes each: every KV head's K or V of a slot) of slots[from .. to). */
static inline void prefetch_rows(const void *cache, const int32_t *slots, int64_t from,
                                 int64_t to, int64_t row_bytes) {
    for (int64_t t = from; t < to; t++)
        for (int64_t byte = 0; byte < row_bytes; byte += 64)
            _mm_prefetch((const char *)cache + (int64_t)slots[t] * row_bytes + byte, _MM_HINT_T1);
}

/* ---- an int8 cache: blocks of keys dequantized into bf16 scratch as they are read ---- */

static const int32_t IDENTITY[SHARED_CHUNK] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
    22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
    44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};

/* D codes times scale, as bf16 (round to nearest even), into dst. */
static inline void kv_slice(const int8_t *src, float scale, int64_t D, uint16_t *dst) {
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 k = D - d >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (D - d)) - 1);
        const __m512i c = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, src + d));
        _mm256_mask_storeu_epi16(dst + d, k, (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_cvtepi32_ps(c), s)));
    }
}

/* KV head kvh's slices of the keys at slots[t0 .. t0 + n) (int32 or int64 slots: `at` reads
 * them), dequantized into dst, D values apart. */
#define KV_SLICES(codes, scales, kv_heads, D, kvh, n, at, dst)                                   \
    do {                                                                                        \
        for (int64_t j_ = 0; j_ < (n); j_++) {                                                  \
            const int64_t slot_ = (int64_t)(at);                                                \
            kv_slice((codes) + (slot_ * (kv_heads) + (kvh)) * (D),                              \
                     kv_scale((scales), slot_, (kv_heads), (kvh)), (D), (dst) + j_ * (D));      \
        }                                                                                       \
    } while (0)

/* Rows are prefetched into L2 AHEAD keys before their block is read: far enough for DRAM's
 * latency to pass while the blocks between are computed (the KV of a long batch is not in
 * cache). One block ahead into L1, as before, was ~12% slower at 1,600-token contexts
 * (bench/results/kernel-choices.md#2026-12-02-kv-prefetch). */
#define AHEAD 64

/* The rows of the block AHEAD keys after block b of keys [t0, t0 + n). */
static inline void prefetch_ahead(const void *cache, const int32_t *slots, int64_t t0,
                                  int64_t b, int64_t n, int64_t row_bytes) {
    const int64_t from = b + AHEAD, to = b + AHEAD + 16 < n ? b + AHEAD + 16 : n;
    if (from < to) prefetch_rows(cache, slots, t0 + from, t0 + to, row_bytes);
}

/* This thread's keys [t0, t1): per head, its max score, sum of exp and exp-weighted V sum.
 * Keys go in blocks of 16 whose K (then V) rows every head reads while they sit in L1, the
 * rows AHEAD keys on prefetched meanwhile (slots need not be consecutive). */
void rf_attend_part(const rf_model *m, const rf_layer *L, const float *q, const uint16_t *qb,
                    const int32_t *slots, int64_t t0, int64_t t1, float *scores, float *partial) {
    (void)q; /* the bf16 queries are what vdpbf16ps multiplies */
    const int64_t D = m->head_dim, group = m->heads / m->kv_heads, n = t1 - t0;
    const int64_t row = m->kv_heads * D, qs = q_stride(m);
    const int int8 = L->k_cache == NULL;
    const void *kc = int8 ? (const void *)L->k_codes : L->k_cache;
    const void *vc = int8 ? (const void *)L->v_codes : L->v_cache;
    const int64_t row_bytes = int8 ? row : 2 * row;
    uint16_t kq[16 * MAX_HEAD_DIM] __attribute__((aligned(64))); /* an int8 block's slices */
    for (int64_t h = 0; h < m->heads; h++) {
        float *ph = partial + h * (D + 2);
        ph[0] = -INFINITY;
        ph[1] = 0;
        memset(ph + 2, 0, D * sizeof(float));
    }
    if (n <= 0) return;
    prefetch_rows(kc, slots, t0, t0 + (AHEAD < n ? AHEAD : n), row_bytes);
    for (int64_t b = 0; b < n; b += 16) {
        const int64_t keys = n - b < 16 ? n - b : 16;
        prefetch_ahead(kc, slots, t0, b, n, row_bytes);
        for (int64_t h = 0; h < m->heads; h++) {
            const int64_t kvh = h / group;
            const uint16_t *qh = qb + h * qs, *base = L->k_cache;
            const int32_t *sl = slots;
            int64_t r = row, at = t0 + b, hk = kvh;
            if (int8) { /* the block's slices of this KV head, once for its group */
                if (h % group == 0)
                    KV_SLICES(L->k_codes, L->k_scales, m->kv_heads, D, kvh, keys, slots[t0 + b + j_], kq);
                base = kq, sl = IDENTITY, r = D, at = 0, hk = 0;
            }
            float *s = scores + h * n + b;
            switch (qs / 32) {
            case 1: head_scores(m, base, hk, r, sl, at, keys, qh, s, 1); break;
            case 2: head_scores(m, base, hk, r, sl, at, keys, qh, s, 2); break;
            case 3: head_scores(m, base, hk, r, sl, at, keys, qh, s, 3); break;
            case 4: head_scores(m, base, hk, r, sl, at, keys, qh, s, 4); break;
            default: head_scores(m, base, hk, r, sl, at, keys, qh, s, 16); break;
            }
        }
    }
    for (int64_t h = 0; h < m->heads; h++) {
        float *s = scores + h * n, *ph = partial + h * (D + 2);
        __m512 vmx = _mm512_set1_ps(-INFINITY);
        for (int64_t t = 0; t < n; t += 16) {
            __mmask16 k = n - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - t)) - 1);
            vmx = _mm512_mask_max_ps(vmx, k, vmx, _mm512_maskz_loadu_ps(k, s + t));
        }
        const float mx = _mm512_reduce_max_ps(vmx);
        __m512 sum = _mm512_setzero_ps();
        vmx = _mm512_set1_ps(mx);
        uint16_t *pb = (uint16_t *)s; /* the weights become bf16, in place (written behind the reads) */
        for (int64_t t = 0; t < n; t += 16) {
            __mmask16 k = n - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - t)) - 1);
            __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), vmx)));
            sum = _mm512_add_ps(sum, e);
            _mm256_mask_storeu_epi16(pb + t, k, (__m256i)_mm512_cvtneps_pbh(e));
        }
        if (n % 2) pb[n] = 0; /* pairs of keys below: the odd one out pairs with a zero weight */
        ph[0] = mx;
        ph[1] = _mm512_reduce_add_ps(sum);
    }
    prefetch_rows(vc, slots, t0, t0 + (AHEAD < n ? AHEAD : n), row_bytes);
    for (int64_t b = 0; b < n; b += 16) {
        const int64_t keys = n - b < 16 ? n - b : 16;
        prefetch_ahead(vc, slots, t0, b, n, row_bytes);
        for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
            const uint16_t *base = L->v_cache;
            const int32_t *sl = slots;
            int64_t r = row, tb = t0 + b, hk = kvh;
            if (int8) {
                KV_SLICES(L->v_codes, L->v_scales, m->kv_heads, D, kvh, keys, slots[t0 + b + j_], kq);
                base = kq, sl = IDENTITY, r = D, tb = 0, hk = 0;
            }
            for (int64_t g0 = 0; g0 < group; g0 += 8) { /* up to 8 heads' accumulators at once */
                const uint32_t *w[8];
                float *out[8];
                const int count = group - g0 < 8 ? (int)(group - g0) : 8;
                for (int g = 0; g < count; g++) {
                    w[g] = (const uint32_t *)(scores + (kvh * group + g0 + g) * n) + b / 2;
                    out[g] = partial + (kvh * group + g0 + g) * (D + 2) + 2;
                }
                for (int64_t d0 = 0; d0 < D; d0 += 32) {
                    switch (count) {
                    case 1: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 1); break;
                    case 2: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 2); break;
                    case 3: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 3); break;
                    case 4: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 4); break;
                    case 5: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 5); break;
                    case 6: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 6); break;
                    case 7: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 7); break;
                    default: weighted_values(m, base, hk, r, sl, tb, keys, d0, w, out, 8); break;
                    }
                }
            }
        }
    }
}

/* ---- attention over a prefix that several requests share ---- */

#define TILE_A 4 /* x rows per tile (keys for the scores, dimensions for the values) */
#define TILE_B 4 /* 16-query registers per tile */

/* acc[a B + b] += the sum over k < K of the bf16 pair x[a][k xs] (one dword, broadcast) times
 * the 16 dwords y[k ys + 16 b ..] (the matching pairs of 16 queries): an A x B tile of
 * registers that each hold 16 queries' sums. A and B are constants at each call (the tile
 * stays in registers): one broadcast feeds B products, one load of y feeds A. */
static inline __attribute__((always_inline)) void pair_products(
    const uint32_t *const *x, int64_t xs, const uint32_t *y, int64_t ys, int64_t K, __m512 *acc,
    const int A, const int B) {
    __m512 t[TILE_A * TILE_B]; /* a local copy: __m512 may alias the dwords read */
    const uint32_t *xa[TILE_A];
    for (int u = 0; u < A * B; u++) t[u] = acc[u];
    for (int a = 0; a < A; a++) xa[a] = x[a];
    for (int64_t k = 0; k < K; k++) {
        __m512i yv[TILE_B];
        for (int b = 0; b < B; b++) yv[b] = _mm512_loadu_si512(y + k * ys + 16 * b);
        for (int a = 0; a < A; a++) {
            const __m512bh xk = (__m512bh)_mm512_set1_epi32((int)xa[a][k * xs]);
            for (int b = 0; b < B; b++) t[a * B + b] = _mm512_dpbf16_ps(t[a * B + b], (__m512bh)yv[b], xk);
        }
    }
    for (int u = 0; u < A * B; u++) acc[u] = t[u];
}

/* pair_products for B = 1 .. TILE_B registers (a constant in each case). */
static void pair_tile(const uint32_t *const *x, int64_t xs, const uint32_t *y, int64_t ys,
                      int64_t K, __m512 *acc, int B) {
    switch (B) {
    case 1: pair_products(x, xs, y, ys, K, acc, TILE_A, 1); break;
    case 2: pair_products(x, xs, y, ys, K, acc, TILE_A, 2); break;
    case 3: pair_products(x, xs, y, ys, K, acc, TILE_A, 3); break;
    default: pair_products(x, xs, y, ys, K, acc, TILE_A, 4); break;
    }
}

/* Reads the whole K and V rows (every KV head) of keys [c0, c1) once, in order, before the
 * products use them: plain loads of whole rows, which the hardware's stream prefetchers follow
 * (the products' per-head slices and prefetch instructions did not: the default model's shared
 * prefix, 30 layers from DRAM, 7.3 ms a step without this, 4.6 with it, 3.7 from cache:
 * bench/results/cascade-attention.md). */
static inline void stream_block(const rf_model *m, const rf_layer *L, const int32_t *slots,
                                int64_t c0, int64_t c1) {
    const int int8 = L->k_cache == NULL; /* (an int8 cache: its codes; the scales are small) */
    const int64_t bytes = m->kv_heads * m->head_dim * (int8 ? 1 : 2); /* a row's */
    const char *kc = int8 ? (const char *)L->k_codes : (const char *)L->k_cache;
    const char *vc = int8 ? (const char *)L->v_codes : (const char *)L->v_cache;
    __m512i acc = _mm512_setzero_si512();
    for (int64_t t = c0; t < c1; t++) {
        const char *k = kc + (int64_t)slots[t] * bytes, *v = vc + (int64_t)slots[t] * bytes;
        for (int64_t i = 0; i < bytes; i += 64) {
            const __mmask64 mask = bytes - i >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (bytes - i)) - 1;
            acc = _mm512_or_si512(acc, _mm512_or_si512(_mm512_maskz_loadu_epi8(mask, k + i),
                                                       _mm512_maskz_loadu_epi8(mask, v + i)));
        }
    }
    __asm__ volatile("" : : "v"(acc)); /* the loads are what counts */
}

/* One block of keys against a tile of queries, the steps both the shared-prefix product and
 * prefill take. Queries sit in registers of 16 (Mb of them, Ms = 16 Mb floats apart per row). */

/* s[j][i] = scale q_i . k_j for the block's keys (kx: each key's dimension pairs, past the last
 * key repeated), qt: the queries as bf16 pairs of dimensions ([P][Ms] dwords). last_key: NULL,
 * or per query the last key position it sees (keys c0 + j past it score -inf). */
static void tile_scores(const uint32_t *const *kx, int64_t keys, const uint32_t *qt, int64_t P,
                         int64_t Mb, int64_t Ms, float scale, const int32_t *last_key, int64_t c0,
                         float *s) {
    const __m512 scaled = _mm512_set1_ps(scale), hidden = _mm512_set1_ps(-INFINITY);
    for (int64_t b0 = 0; b0 < Mb; b0 += TILE_B) {
        const int B = Mb - b0 < TILE_B ? (int)(Mb - b0) : TILE_B;
        for (int64_t j0 = 0; j0 < keys; j0 += TILE_A) {
            __m512 acc[TILE_A * TILE_B];
            for (int u = 0; u < TILE_A * B; u++) acc[u] = _mm512_setzero_ps();
            pair_tile(kx + j0, 1, qt + 16 * b0, Ms, P, acc, B);
            for (int a = 0; a < TILE_A && j0 + a < keys; a++)
                for (int b = 0; b < B; b++) {
                    __m512 v = _mm512_mul_ps(acc[a * B + b], scaled);
                    if (last_key) {
                        const __m512i last = _mm512_loadu_si512(last_key + 16 * (b0 + b));
                        const __mmask16 later = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32((int)(c0 + j0 + a)), last);
                        v = _mm512_mask_mov_ps(v, later, hidden);
                    }
                    _mm512_storeu_ps(s + (j0 + a) * Ms + 16 * (b0 + b), v);
                }
        }
    }
}

/* The online softmax's step: per query the running max mx and sum, alpha the rescale of what
 * came before; the block's weights into pp as bf16 pairs of keys ([pairs][Ms] dwords). */
static void block_weights(const float *s, int64_t keys, int64_t Mb, int64_t Ms, float *mx,
                          float *sum, float *alpha, uint32_t *pp) {
    static const uint16_t pair_order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i interleave = _mm512_loadu_si512(pair_order);
    const int64_t pairs = (keys + 1) / 2;
    for (int64_t b = 0; b < Mb; b++) {
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < keys; j++) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j * Ms + 16 * b));
        const __m512 old = _mm512_loadu_ps(mx + 16 * b), now = _mm512_max_ps(old, top);
        const __m512 rescale = exp512(_mm512_sub_ps(old, now)); /* old -inf: ~0 */
        __m512 total = _mm512_setzero_ps();
        for (int64_t jp = 0; jp < pairs; jp++) {
            __m512 e0 = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + 2 * jp * Ms + 16 * b), now));
            __m512 e1 = 2 * jp + 1 < keys
                            ? exp512(_mm512_sub_ps(_mm512_loadu_ps(s + (2 * jp + 1) * Ms + 16 * b), now))
                            : _mm512_setzero_ps();
            total = _mm512_add_ps(total, _mm512_add_ps(e0, e1));
            __m512i w = (__m512i)_mm512_cvtne2ps_pbh(e1, e0); /* e0's 16, then e1's */
            _mm512_storeu_si512(pp + jp * Ms + 16 * b, _mm512_permutexvar_epi16(interleave, w));
        }
        _mm512_storeu_ps(mx + 16 * b, now);
        _mm512_storeu_ps(sum + 16 * b, _mm512_fmadd_ps(_mm512_loadu_ps(sum + 16 * b), rescale, total));
        _mm512_storeu_ps(alpha + 16 * b, rescale);
    }
}

/* The block's V slices (v[j]: key j's D values) into vp, two keys interleaved into bf16 pairs
 * per dimension ([pairs][D] dwords; an odd last key pairs with zeros). */
static void pair_values(const uint16_t *const *v, int64_t keys, int64_t D, uint32_t *vp) {
    const __m512i order_lo = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i order_hi = _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
    for (int64_t jp = 0; jp < (keys + 1) / 2; jp++) {
        const uint16_t *va = v[2 * jp], *vb = 2 * jp + 1 < keys ? v[2 * jp + 1] : NULL;
        for (int64_t d0 = 0; d0 < D; d0 += 32) {
            const __mmask32 dm = D - d0 >= 32 ? (__mmask32)0xFFFFFFFF : (__mmask32)((1u << (D - d0)) - 1);
            __m512i a = _mm512_maskz_loadu_epi16(dm, va + d0);
            __m512i b = vb ? _mm512_maskz_loadu_epi16(dm, vb + d0) : _mm512_setzero_si512();
            __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
            _mm512_mask_storeu_epi32(vp + jp * D + d0, (__mmask16)dm, _mm512_permutex2var_epi32(lo, order_lo, hi));
            if (D - d0 > 16)
                _mm512_mask_storeu_epi32(vp + jp * D + d0 + 16, (__mmask16)(dm >> 16),
                                         _mm512_permutex2var_epi32(lo, order_hi, hi));
        }
    }
}

/* o[d][i] = alpha_i o[d][i] + the block's weights of query i (pp) times values d (vx[d]: vp + d,
 * every D). */
static void add_weighted_values(float *o, const float *alpha, const uint32_t *const *vx,
                                const uint32_t *pp, int64_t pairs, int64_t D, int64_t Mb,
                                int64_t Ms) {
    for (int64_t b0 = 0; b0 < Mb; b0 += TILE_B) {
        const int B = Mb - b0 < TILE_B ? (int)(Mb - b0) : TILE_B;
        for (int64_t d0 = 0; d0 < D; d0 += TILE_A) {
            __m512 acc[TILE_A * TILE_B];
            for (int a = 0; a < TILE_A; a++)
                for (int b = 0; b < B; b++)
                    acc[a * B + b] = _mm512_mul_ps(_mm512_loadu_ps(o + (d0 + a) * Ms + 16 * (b0 + b)),
                                                   _mm512_loadu_ps(alpha + 16 * (b0 + b)));
            pair_tile(vx + d0, D, pp + 16 * b0, Ms, pairs, acc, B);
            for (int a = 0; a < TILE_A; a++)
                for (int b = 0; b < B; b++)
                    _mm512_storeu_ps(o + (d0 + a) * Ms + 16 * (b0 + b), acc[a * B + b]);
        }
    }
}

/* Work: per KV head, qt (its queries as bf16 pairs, [D/2][Ms] dwords), o (their V sums,
 * [D][Ms]), then max, sum and rescale per query ([3][Ms]); then, for the block at hand, s (its
 * scores, [CHUNK][Ms]), pp (its weights as bf16 pairs of keys, [CHUNK/2][Ms] dwords) and vp (its
 * V slices interleaved in pairs, [CHUNK/2][D] dwords). Ms: the queries padded to 16, at most
 * shared_queries(m). */
int64_t rf_shared_work_floats(const rf_model *m) {
    const int64_t D = m->head_dim, Mp = shared_queries(m), C = SHARED_CHUNK;
    return m->kv_heads * (D / 2 * Mp + D * Mp + 3 * Mp) + C * Mp + C / 2 * Mp + C / 2 * D
           + C * D; /* an int8 cache's block of K and V slices as bf16 ([2][CHUNK][D]) */
}

void rf_attend_shared(const rf_model *m, const rf_layer *L, int64_t n, const float *const *q,
                      const uint16_t *const *qb, const int32_t *slots, int64_t t0, int64_t t1,
                      float *work, float *const *partial) {
    (void)q; /* vdpbf16ps multiplies the bf16 queries */
    const int64_t D = m->head_dim, G = m->heads / m->kv_heads, row = m->kv_heads * D;
    const int64_t qs = q_stride(m), P = D / 2, C = SHARED_CHUNK, Mp = shared_queries(m);
    const int64_t M = n * G, Mb = (M + 15) / 16, Ms = 16 * Mb; /* queries, registers, stride */
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < m->heads; h++) {
            float *ph = partial[i] + h * (D + 2);
            ph[0] = -INFINITY;
            ph[1] = 0;
            memset(ph + 2, 0, D * sizeof(float));
        }
    if (t1 <= t0) return;
    const int64_t per_head = P * Mp + D * Mp + 3 * Mp; /* one KV head's state */
    float *s = work + m->kv_heads * per_head;
    uint32_t *pp = (uint32_t *)(s + C * Mp);
    uint32_t *vp = pp + C / 2 * Mp;
    uint16_t *kq = (uint16_t *)(vp + C / 2 * D), *vq = kq + C * D; /* an int8 block's slices */
    const uint32_t *vx[MAX_HEAD_DIM]; /* dimension d's pairs of values: vp + d, every D */
    for (int64_t d = 0; d < D; d++) vx[d] = vp + d;
    for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
        uint32_t *qt = (uint32_t *)(work + kvh * per_head);
        float *o = (float *)(qt + P * Mp), *mx = o + D * Mp, *sum = mx + Mp;
        /* query i = request i / G's head kvh G + i % G, as pairs of dimensions */
        for (int64_t i = 0; i < Ms; i++) {
            const uint32_t *src = i < M ? (const uint32_t *)(qb[i / G] + (kvh * G + i % G) * qs) : NULL;
            for (int64_t p = 0; p < P; p++) qt[p * Ms + i] = src ? src[p] : 0;
            mx[i] = -INFINITY;
            sum[i] = 0;
        }
        for (int64_t d = 0; d < D; d++) memset(o + d * Ms, 0, Ms * sizeof(float));
    }
    /* blocks of keys, each key's whole K and V rows used while in cache by every KV head */
    for (int64_t c0 = t0; c0 < t1; c0 += C) {
        const int64_t keys = t1 - c0 < C ? t1 - c0 : C;
        stream_block(m, L, slots, c0, c0 + keys);
        for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
            const uint32_t *qt = (const uint32_t *)(work + kvh * per_head);
            float *o = (float *)(qt + P * Mp), *mx = o + D * Mp, *sum = mx + Mp, *alpha = sum + Mp;
            const uint32_t *kx[SHARED_CHUNK]; /* past the last key: repeat it (not stored) */
            const uint16_t *v[SHARED_CHUNK];
            if (L->k_cache == NULL) {
                KV_SLICES(L->k_codes, L->k_scales, m->kv_heads, D, kvh, keys, slots[c0 + j_], kq);
                KV_SLICES(L->v_codes, L->v_scales, m->kv_heads, D, kvh, keys, slots[c0 + j_], vq);
            }
            for (int64_t j = 0; j < C; j++) {
                const int64_t key = j < keys ? j : keys - 1;
                const int64_t at = (int64_t)slots[c0 + key] * row + kvh * D;
                kx[j] = (const uint32_t *)(L->k_cache ? L->k_cache + at : kq + key * D);
                v[j] = L->v_cache ? L->v_cache + at : vq + key * D;
            }
            tile_scores(kx, keys, qt, P, Mb, Ms, m->scale, NULL, c0, s);
            block_weights(s, keys, Mb, Ms, mx, sum, alpha, pp);
            pair_values(v, keys, D, vp);
            add_weighted_values(o, alpha, vx, pp, (keys + 1) / 2, D, Mb, Ms);
        }
    }
    for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
        const float *o = work + kvh * per_head + P * Mp, *mx = o + D * Mp, *sum = mx + Mp;
        for (int64_t i = 0; i < M; i++) {
            float *ph = partial[i / G] + (kvh * G + i % G) * (D + 2);
            ph[0] = mx[i];
            ph[1] = sum[i];
            for (int64_t d = 0; d < D; d++) ph[2 + d] = o[d * Ms + i];
        }
    }
}

void rf_silu(const float *x, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(out + i, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f),
                                                  exp512(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
    }
    for (; i < n; i++) out[i] = x[i] / (1.0f + expf(-x[i]));
}

/* out[r] = the first index of the largest value of row r of x [rows][n], or of its first NaN,
 * as torch.argmax answers (greedy sampling: torch's argmax takes ~0.1-0.2 ms over a 49k
 * vocabulary, this ~10 us: bench/results/kernel-choices.md#2026-11-29-argmax). */
void rf_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        __m512 best = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m512 v = _mm512_loadu_ps(xr + i);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            best = _mm512_max_ps(best, v);
        }
        float mx = _mm512_reduce_max_ps(best);
        for (; i < n; i++) {
            nan |= xr[i] != xr[i];
            mx = xr[i] > mx ? xr[i] : mx;
        }
        int64_t at = 0;
        for (i = 0; i < n; i++)
            if (nan ? xr[i] != xr[i] : xr[i] == mx) { at = i; break; }
        out[r] = at;
    }
}

/* ---- one request's causal attention over its prompt (prefill) ---- */

int64_t rf_prefill_tile_queries(void) { return 128; } /* 8 registers */
int64_t rf_prefill_dim_multiple(void) { return 4; }   /* add_weighted_values' TILE_A */

int64_t rf_prefill_work_floats(int64_t D) {
    const int64_t Ms = rf_prefill_tile_queries(), C = SHARED_CHUNK;
    return D / 2 * Ms + D * Ms + 4 * Ms + C * Ms + C / 2 * Ms + C / 2 * D
           + C * D; /* an int8 cache's block of K and V slices as bf16 ([2][CHUNK][D]) */
}

static inline uint16_t to_bf16(float x) { /* round to nearest even (x is never NaN here) */
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

/* Tokens [t0, t1) of the request, the query heads of KV head kvh: rf_attend_shared's block
 * steps over keys 0 .. prefix + t1 - 1; the blocks that reach past prefix + t0 hide each
 * query's later keys. */
void rf_prefill_tile(const rf_prefill *J, int64_t kvh, int64_t t0, int64_t t1, float *work) {
    const int64_t D = J->head_dim, G = J->heads / J->kv_heads, P = D / 2, C = SHARED_CHUNK;
    const int64_t row = J->kv_heads * D, M = (t1 - t0) * G, Mb = (M + 15) / 16, Ms = 16 * Mb;
    const uint16_t *q = J->q;
    uint32_t *qt = (uint32_t *)work;
    float *o = (float *)(qt + P * Ms), *mx = o + D * Ms, *sum = mx + Ms, *alpha = sum + Ms;
    int32_t *last_key = (int32_t *)(alpha + Ms); /* the last key each query sees */
    float *s = (float *)(last_key + Ms);
    uint32_t *pp = (uint32_t *)(s + C * Ms), *vp = pp + C / 2 * Ms;
    uint16_t *kq = (uint16_t *)(vp + C / 2 * D), *vq = kq + C * D; /* an int8 block's slices */
    const uint32_t *vx[MAX_HEAD_DIM];
    for (int64_t d = 0; d < D; d++) vx[d] = vp + d;
    for (int64_t i = 0; i < Ms; i++) { /* query i: token t0 + i / G, head kvh G + i % G */
        const uint32_t *src = i < M ? (const uint32_t *)(q + (t0 + i / G) * J->q_stride + (kvh * G + i % G) * D) : NULL;
        for (int64_t p = 0; p < P; p++) qt[p * Ms + i] = src ? src[p] : 0;
        mx[i] = -INFINITY;
        sum[i] = 0;
        last_key[i] = (int32_t)(i < M ? J->prefix + t0 + i / G : J->prefix + t1);
    }
    memset(o, 0, D * Ms * sizeof(float));
    const int64_t end = J->prefix + t1;
    for (int64_t c0 = 0; c0 < end; c0 += C) { /* key 0 comes first: every query sees it */
        const int64_t keys = end - c0 < C ? end - c0 : C;
        const int masked = c0 + keys - 1 > J->prefix + t0;
        const uint32_t *kx[SHARED_CHUNK];
        const uint16_t *v[SHARED_CHUNK];
        if (J->k == NULL) {
            KV_SLICES(J->k_codes, J->k_scales, J->kv_heads, D, kvh, keys, J->slots[c0 + j_], kq);
            KV_SLICES(J->v_codes, J->v_scales, J->kv_heads, D, kvh, keys, J->slots[c0 + j_], vq);
        }
        for (int64_t j = 0; j < C; j++) {
            const int64_t key = j < keys ? j : keys - 1;
            const int64_t at = J->slots[c0 + key] * row + kvh * D;
            kx[j] = (const uint32_t *)(J->k ? J->k + at : kq + key * D);
            v[j] = J->v ? J->v + at : vq + key * D;
        }
        tile_scores(kx, keys, qt, P, Mb, Ms, J->scale, masked ? last_key : NULL, c0, s);
        block_weights(s, keys, Mb, Ms, mx, sum, alpha, pp);
        pair_values(v, keys, D, vp);
        add_weighted_values(o, alpha, vx, pp, (keys + 1) / 2, D, Mb, Ms);
    }
    uint16_t *out = J->out;
    for (int64_t i = 0; i < M; i++) {
        uint16_t *dst = out + (t0 + i / G) * J->out_stride + (kvh * G + i % G) * D;
        const float inv = 1.0f / sum[i];
        for (int64_t d = 0; d < D; d++) dst[d] = to_bf16(o[d * Ms + i] * inv);
    }
}
