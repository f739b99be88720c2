/* The decode step's vector kernels for AVX2 + FMA + F16C (see decode.h): attention over the
 * bf16 KV pool in fp32 arithmetic, SiLU, argmax.
 *
 * K and V widen from bf16 to fp32 without shuffles: a 256-bit load of 16 values holds them as
 * 8 dwords, value 2i in the low half of dword i and value 2i + 1 in its high half, so (dword <<
 * 16) is the 8 even values and (dword & 0xffff0000) the 8 odd ones, exactly. The dot products
 * take the queries in that order (each 16 values permuted once per call into their 8 even then
 * their 8 odd ones, times the softmax scale), and the V sums stay in it until the end. */
#include <math.h>
#include <string.h>

#include "decode.h"

#define SCORE_HEADS 3 /* query heads whose dot products one pass over a K slice computes */
#define VALUE_HEADS 4 /* query heads whose V sums one pass over a V slice accumulates */
#define BLOCK 16      /* keys per block (K or V slices read by all of a group's heads in L1) */
#define PREFETCH 3    /* blocks ahead (DRAM latency: ~3 blocks' work at D = 64, G = 3) */

/* e^x: x = n ln2 + r, e^r by its Taylor polynomial, times 2^n made in the exponent bits. AVX2
 * has no scalef: 2^n is 2 * 2^(n - 1) (the 2 folded into the polynomial) so that n = 128
 * still has an exponent and overflows to inf; from x ~ -87 down the result is 0. NaN stays NaN
 * (max/min return their second operand when one is NaN). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-87.5f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(2.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}

/* ---- attention ---- */

/* r[i] = sum of v[i]'s 8 lanes, for 8 vectors at once (a transposing reduction). */
static inline __m256 sum8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    /* a: per 128-bit half, v[0..3]'s sums of that half's lanes; b: v[4..7]'s */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* Values c .. c + 15 of a K or V slice p (bf16, or with I8 an int8 cache's codes, exact) as
 * fp32: its 8 even values, its 8 odd ones. I8 is a constant at each call. */
static inline __attribute__((always_inline)) void widen16(const void *p, int64_t c, const int I8,
                                                          __m256 *e, __m256 *o) {
    if (I8) {
        const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((const int8_t *)p + c)));
        *e = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 16), 16));
        *o = _mm256_cvtepi32_ps(_mm256_srai_epi32(x, 16));
    } else {
        const __m256i kv = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + c));
        *e = _mm256_castsi256_ps(_mm256_slli_epi32(kv, 16));
        *o = _mm256_castsi256_ps(_mm256_and_si256(kv, _mm256_set1_epi32((int)0xffff0000)));
    }
}

/* The dot products of S query heads (permuted queries qp, D floats apart) with J keys (K
 * slices k[j0 .. j0 + J), D bf16 values), not yet summed: acc[g][j0 + j] gets 8 partial sums.
 * S and J are constants at each call, so the S * J accumulators stay in registers (the pragmas
 * unroll the small loops early enough for gcc to keep their arrays out of memory); each K
 * chunk is widened once for the S heads. */
static inline __attribute__((always_inline)) void dots(const float *qp, const void *const *k,
                                                       int64_t D, __m256 (*acc)[BLOCK], int j0,
                                                       const int S, const int J, const int I8) {
    __m256 a[SCORE_HEADS][8];
#pragma GCC unroll 8
    for (int g = 0; g < S; g++)
#pragma GCC unroll 8
        for (int j = 0; j < J; j++) a[g][j] = _mm256_setzero_ps();
    for (int64_t c = 0; c < D; c += 16) {
#pragma GCC unroll 8
        for (int j = 0; j < J; j++) {
            __m256 e, o;
            widen16(k[j0 + j], c, I8, &e, &o);
#pragma GCC unroll 8
            for (int g = 0; g < S; g++) {
                a[g][j] = _mm256_fmadd_ps(e, _mm256_load_ps(qp + g * D + c), a[g][j]);
                a[g][j] = _mm256_fmadd_ps(o, _mm256_load_ps(qp + g * D + c + 8), a[g][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int g = 0; g < S; g++)
#pragma GCC unroll 8
        for (int j = 0; j < J; j++) acc[g][j0 + j] = a[g][j];
}

/* S query heads' scores against one block's keys (K slices k[0 .. BLOCK), the ones past
 * `keys` repeating the last) into s[g][0 .. keys). Keys J at a time: 8 or 12 accumulators,
 * enough that the FMA chains (2 FMAs per accumulator per chunk) do not wait on each other. */
static inline __attribute__((always_inline)) void block_scores(const float *qp,
                                                               const void *const *k,
                                                               int64_t D, int64_t keys,
                                                               float *const *s, const int S,
                                                               const int I8) {
    const int J = S == 1 ? 8 : 4;
    __m256 acc[SCORE_HEADS][BLOCK];
    int j0 = 0;
    for (; j0 < keys; j0 += J) dots(qp, k, D, acc, j0, S, J, I8);
    for (; j0 < BLOCK; j0++) /* lanes summed below but not stored */
        for (int g = 0; g < S; g++) acc[g][j0] = _mm256_setzero_ps();
    for (int g = 0; g < S; g++)
        for (j0 = 0; j0 < keys; j0 += 8) {
            __m256 r = sum8(acc[g] + j0);
            if (keys - j0 >= 8) {
                _mm256_storeu_ps(s[g] + j0, r);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, r);
                memcpy(s[g] + j0, tmp, (keys - j0) * sizeof(float));
            }
        }
}

/* The exp-weighted V sum of S query heads (weights w[g][0 .. keys)) over one block's keys (V
 * slices v[0 .. keys)), for CC chunks of 16 values from d0, added into out[g] (the permuted
 * order: per chunk, its 8 even values' sums then its 8 odd ones'). S and CC are constants at
 * each call: 2 S CC accumulators in registers. */
static inline __attribute__((always_inline)) void weighted_values(
    const void *const *v, int64_t keys, int64_t d0, const float *const *w, float *const *out,
    const int S, const int CC, const int I8) {
    __m256 acc[12]; /* [g][c][even, odd] */
#pragma GCC unroll 12
    for (int i = 0; i < 2 * S * CC; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t t = 0; t < keys; t++) {
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++) {
            __m256 e, o;
            widen16(v[t], d0 + 16 * c, I8, &e, &o);
#pragma GCC unroll 4
            for (int g = 0; g < S; g++) {
                __m256 wt = _mm256_broadcast_ss(w[g] + t);
                acc[2 * (g * CC + c)] = _mm256_fmadd_ps(e, wt, acc[2 * (g * CC + c)]);
                acc[2 * (g * CC + c) + 1] = _mm256_fmadd_ps(o, wt, acc[2 * (g * CC + c) + 1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int g = 0; g < S; g++)
#pragma GCC unroll 4
        for (int c = 0; c < CC; c++) {
            float *o = out[g] + d0 + 16 * c;
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[2 * (g * CC + c)]));
            _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), acc[2 * (g * CC + c) + 1]));
        }
}

/* weighted_values over all D values of S heads, in chunks of 16 values a call (8 or more
 * accumulators). I8 is a constant at each call. */
static inline __attribute__((always_inline)) void value_sums(
    const void *const *v, int64_t keys, int64_t D, const float *const *w, float *const *out,
    int S, const int I8) {
    int64_t d0 = 0;
    switch (S) {
    case 1:
        for (; d0 + 64 <= D; d0 += 64) weighted_values(v, keys, d0, w, out, 1, 4, I8);
        for (; d0 < D; d0 += 16) weighted_values(v, keys, d0, w, out, 1, 1, I8);
        break;
    case 2:
        for (; d0 + 32 <= D; d0 += 32) weighted_values(v, keys, d0, w, out, 2, 2, I8);
        for (; d0 < D; d0 += 16) weighted_values(v, keys, d0, w, out, 2, 1, I8);
        break;
    case 3:
        for (; d0 + 32 <= D; d0 += 32) weighted_values(v, keys, d0, w, out, 3, 2, I8);
        for (; d0 < D; d0 += 16) weighted_values(v, keys, d0, w, out, 3, 1, I8);
        break;
    default:
        for (; d0 < D; d0 += 16) weighted_values(v, keys, d0, w, out, 4, 1, I8);
        break;
    }
}

/* Prefetches the K or V slices that the walk over KV heads and their blocks of keys reads
 * PREFETCH blocks after KV head kvh's block at b: on into the next KV head's blocks, and past
 * K's last block into V's first (`then`, or NULL). */
static inline void prefetch_ahead(const rf_model *m, const void *cache, const void *then,
                                  int64_t es, const int32_t *slots, int64_t n, int64_t kvh,
                                  int64_t b) { /* es: bytes a value (2 bf16, 1 an int8 code) */
    const int64_t D = m->head_dim, row = m->kv_heads * D, blocks = (n + BLOCK - 1) / BLOCK;
    int64_t i = kvh * blocks + b / BLOCK + PREFETCH;
    if (i >= m->kv_heads * blocks) {
        if (!then) return;
        cache = then;
        i -= m->kv_heads * blocks;
        if (i >= m->kv_heads * blocks) return;
    }
    const int64_t at = i % blocks * BLOCK, end = at + BLOCK < n ? at + BLOCK : n;
    for (int64_t t = at; t < end; t++) {
        const char *p = (const char *)cache + ((int64_t)slots[t] * row + i / blocks * D) * es;
        for (uintptr_t line = (uintptr_t)p & ~(uintptr_t)63; line < (uintptr_t)(p + es * D); line += 64)
            _mm_prefetch((const char *)line, _MM_HINT_T0);
    }
}

/* A group of G heads as subgroups of at most `most`, as even as they come: the size of the
 * one starting at g0. */
static inline int subgroup(int64_t G, int64_t g0, int most) {
    const int64_t parts = (G + most - 1) / most, small = G / parts;
    const int64_t big = G - small * parts; /* the first `big` parts have one more */
    return (int)(g0 < big * (small + 1) ? small + 1 : small);
}

/* ---- an int8 cache: codes widened as they are read (widen16, widen_codes) ---- */

/* 16 codes as 16 int16, dword i holding values 2i (low half) and 2i + 1: their even values
 * and their odd ones as fp32, times scale. */
static inline void codes16(const int8_t *src, __m256 scale, __m256 *even, __m256 *odd) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
    *even = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 16), 16)), scale);
    *odd = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(x, 16)), scale);
}

/* This thread's keys [t0, t1): per head, its max score, sum of exp and exp-weighted V sum.
 * Per KV head, keys go in blocks of 16 whose K (then V) slices all of its query heads read
 * while they sit in L1, the slices PREFETCH blocks on prefetched meanwhile (slots need not be
 * consecutive). Scores are laid out [head][key]. */
void rf_attend_part(const rf_model *m, const rf_layer *L, const float *q, const uint16_t *qb,
                    const int32_t *slots, int64_t t0, int64_t t1, float *scores, float *partial) {
    (void)qb; /* fp32 arithmetic: the fp32 queries */
    const int64_t D = m->head_dim, G = m->heads / m->kv_heads, n = t1 - t0;
    const int64_t row = m->kv_heads * D;
    for (int64_t h = 0; h < m->heads; h++) {
        float *ph = partial + h * (D + 2);
        ph[0] = -INFINITY;
        ph[1] = 0;
        memset(ph + 2, 0, D * sizeof(float));
    }
    if (n <= 0) return;
    slots += t0;
    float qp[MAX_GROUP * MAX_HEAD_DIM] __attribute__((aligned(32))); /* one group's queries */
    float ksc[BLOCK], wsc[VALUE_HEADS][BLOCK]; /* int8: a block's scales; weights times them */
    const int int8 = L->k_cache == NULL;
    const void *kcache = int8 ? (const void *)L->k_codes : L->k_cache;
    const void *vcache = int8 ? (const void *)L->v_codes : L->v_cache;
    const int64_t es = int8 ? 1 : 2;
    const __m256 scale = _mm256_set1_ps(m->scale);
    for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
        const uint16_t *kc = int8 ? NULL : L->k_cache + kvh * D;
        for (int64_t g = 0; g < G; g++) /* this group's queries, permuted and scaled */
            for (int64_t c = 0; c < D; c += 16) {
                const float *x = q + (kvh * G + g) * D + c;
                __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
                __m256 even = _mm256_shuffle_ps(a, b, 0x88), odd = _mm256_shuffle_ps(a, b, 0xDD);
                even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8));
                odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8));
                _mm256_store_ps(qp + g * D + c, _mm256_mul_ps(even, scale));
                _mm256_store_ps(qp + g * D + c + 8, _mm256_mul_ps(odd, scale));
            }
        for (int64_t b = 0; b < n; b += BLOCK) {
            const int64_t keys = n - b < BLOCK ? n - b : BLOCK;
            prefetch_ahead(m, kcache, vcache, es, slots, n, kvh, b);
            const void *k[BLOCK];
            if (int8) { /* the codes in place, their scales folded into the scores below */
                for (int j = 0; j < BLOCK; j++) {
                    const int64_t slot = slots[b + (j < keys ? j : keys - 1)];
                    k[j] = L->k_codes + slot * row + kvh * D;
                    ksc[j] = kv_scale(L->k_scales, slot, m->kv_heads, kvh);
                }
            } else {
                for (int j = 0; j < BLOCK; j++) k[j] = kc + (int64_t)slots[b + (j < keys ? j : keys - 1)] * row;
            }
            for (int64_t g0 = 0; g0 < G;) {
                const int S = subgroup(G, g0, SCORE_HEADS);
                float *s[SCORE_HEADS];
                for (int g = 0; g < S; g++) s[g] = scores + (kvh * G + g0 + g) * n + b;
                const float *qs = qp + g0 * D;
                switch (S) {
                case 1: int8 ? block_scores(qs, k, D, keys, s, 1, 1) : block_scores(qs, k, D, keys, s, 1, 0); break;
                case 2: int8 ? block_scores(qs, k, D, keys, s, 2, 1) : block_scores(qs, k, D, keys, s, 2, 0); break;
                default: int8 ? block_scores(qs, k, D, keys, s, 3, 1) : block_scores(qs, k, D, keys, s, 3, 0); break;
                }
                if (int8) /* q . (code scale) = (q . code) scale */
                    for (int g = 0; g < S; g++)
                        for (int64_t j = 0; j < keys; j++) s[g][j] *= ksc[j];
                g0 += S;
            }
        }
    }
    for (int64_t h = 0; h < m->heads; h++) { /* scores -> exp(score - max), in place */
        float *s = scores + h * n, *ph = partial + h * (D + 2);
        __m256 vmx = _mm256_set1_ps(-INFINITY);
        int64_t t = 0;
        for (; t + 8 <= n; t += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(s + t));
        float tail[8] __attribute__((aligned(32)));
        for (int i = 0; i < 8; i++) tail[i] = t + i < n ? s[t + i] : -INFINITY;
        vmx = _mm256_max_ps(vmx, _mm256_load_ps(tail));
        vmx = _mm256_max_ps(vmx, _mm256_permute2f128_ps(vmx, vmx, 1));
        vmx = _mm256_max_ps(vmx, _mm256_shuffle_ps(vmx, vmx, 0x4E));
        vmx = _mm256_max_ps(vmx, _mm256_shuffle_ps(vmx, vmx, 0xB1));
        __m256 sum = _mm256_setzero_ps();
        for (t = 0; t + 8 <= n; t += 8) {
            __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(s + t, e);
        }
        __m256 e = exp256(_mm256_sub_ps(_mm256_load_ps(tail), vmx)); /* -inf lanes: 0 */
        sum = _mm256_add_ps(sum, e);
        _mm256_store_ps(tail, e);
        for (int64_t i = t; i < n; i++) s[i] = tail[i - t];
        __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
        s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
        ph[0] = _mm256_cvtss_f32(vmx);
        ph[1] = _mm_cvtss_f32(s4);
    }
    for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
        const uint16_t *vc = int8 ? NULL : L->v_cache + kvh * D;
        for (int64_t b = 0; b < n; b += BLOCK) {
            const int64_t keys = n - b < BLOCK ? n - b : BLOCK;
            prefetch_ahead(m, vcache, NULL, es, slots, n, kvh, b);
            const void *v[BLOCK];
            if (int8) {
                for (int j = 0; j < keys; j++) {
                    v[j] = L->v_codes + (int64_t)slots[b + j] * row + kvh * D;
                    ksc[j] = kv_scale(L->v_scales, slots[b + j], m->kv_heads, kvh);
                }
            } else {
                for (int j = 0; j < keys; j++) v[j] = vc + (int64_t)slots[b + j] * row;
            }
            for (int64_t g0 = 0; g0 < G;) {
                const int S = subgroup(G, g0, VALUE_HEADS);
                const float *w[VALUE_HEADS];
                float *out[VALUE_HEADS];
                for (int g = 0; g < S; g++) {
                    w[g] = scores + (kvh * G + g0 + g) * n + b;
                    out[g] = partial + (kvh * G + g0 + g) * (D + 2) + 2;
                    if (int8) { /* p (code scale) = (p scale) code */
                        for (int64_t j = 0; j < keys; j++) wsc[g][j] = w[g][j] * ksc[j];
                        w[g] = wsc[g];
                    }
                }
                if (int8)
                    value_sums(v, keys, D, w, out, S, 1);
                else
                    value_sums(v, keys, D, w, out, S, 0);
                g0 += S;
            }
        }
    }
    for (int64_t h = 0; h < m->heads; h++) /* the V sums back from the permuted order */
        for (int64_t c = 0; c < D; c += 16) {
            float *o = partial + h * (D + 2) + 2 + c;
            __m256 e = _mm256_loadu_ps(o), od = _mm256_loadu_ps(o + 8);
            __m256 lo = _mm256_unpacklo_ps(e, od), hi = _mm256_unpackhi_ps(e, od);
            _mm256_storeu_ps(o, _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        }
}

/* ---- attention over a prefix that several requests share ---- */

#define TILE_A 4 /* x rows per tile (keys for the scores, dimensions for the values) */
#define TILE_B 3 /* 8-query registers per tile */

/* acc[a B + b] += the sum over k < K of x[a][k xs] (broadcast) times y[k ys + 8 b ..] (8
 * queries' values): an A x B tile of registers that each hold 8 queries' sums. A and B are
 * constants at each call (the tile stays in registers): one broadcast feeds B products, one
 * load of y feeds A. */
static inline __attribute__((always_inline)) void outer_products(
    const float *const *x, int64_t xs, const float *y, int64_t ys, int64_t K, __m256 *acc,
    const int A, const int B) {
    __m256 t[TILE_A * TILE_B]; /* a local copy: __m256 may alias the floats read */
    const float *xa[TILE_A];
#pragma GCC unroll 12
    for (int u = 0; u < A * B; u++) t[u] = acc[u];
#pragma GCC unroll 4
    for (int a = 0; a < A; a++) xa[a] = x[a];
    for (int64_t k = 0; k < K; k++) {
        __m256 yv[TILE_B];
#pragma GCC unroll 3
        for (int b = 0; b < B; b++) yv[b] = _mm256_loadu_ps(y + k * ys + 8 * b);
#pragma GCC unroll 4
        for (int a = 0; a < A; a++) {
            const __m256 xk = _mm256_broadcast_ss(xa[a] + k * xs);
#pragma GCC unroll 3
            for (int b = 0; b < B; b++) t[a * B + b] = _mm256_fmadd_ps(xk, yv[b], t[a * B + b]);
        }
    }
#pragma GCC unroll 12
    for (int u = 0; u < A * B; u++) acc[u] = t[u];
}

static void outer_tile(const float *const *x, int64_t xs, const float *y, int64_t ys, int64_t K,
                       __m256 *acc, int B) {
    if (B == 1)
        outer_products(x, xs, y, ys, K, acc, TILE_A, 1);
    else if (B == 2)
        outer_products(x, xs, y, ys, K, acc, TILE_A, 2);
    else
        outer_products(x, xs, y, ys, K, acc, TILE_A, 3);
}

/* One K or V row of bf16 widened to fp32, in the permuted order (per 16 values, the 8 even then
 * the 8 odd ones). */
static inline void widen_row(const uint16_t *src, int64_t D, float *dst) {
    const __m256i odd = _mm256_set1_epi32((int)0xffff0000);
    for (int64_t c = 0; c < D; c += 16) {
        __m256i kv = _mm256_loadu_si256((const __m256i *)(src + c));
        _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_slli_epi32(kv, 16)));
        _mm256_storeu_ps(dst + c + 8, _mm256_castsi256_ps(_mm256_and_si256(kv, odd)));
    }
}

/* One K or V slice of an int8 cache (D codes times scale) as widen_row writes a bf16 one. */
static inline void widen_codes(const int8_t *src, float scale, int64_t D, float *dst) {
    const __m256 s = _mm256_set1_ps(scale);
    for (int64_t c = 0; c < D; c += 16) {
        __m256 e, o;
        codes16(src + c, s, &e, &o);
        _mm256_storeu_ps(dst + c, e);
        _mm256_storeu_ps(dst + c + 8, o);
    }
}

/* Dimension d's place in the permuted order. */
static inline int64_t permuted(int64_t d) {
    const int64_t r = d % 16;
    return d - r + (r % 2 ? 8 + r / 2 : r / 2);
}

/* Reads the whole K and V rows (every KV head) of keys [c0, c1) once, in order: plain loads of
 * whole rows, which the hardware's stream prefetchers follow (per-head slices and prefetch
 * instructions they did not: see step_avx512.c), leaving the rows in cache for every KV head's
 * pass over them. */
static inline void stream_block(const rf_model *m, const rf_layer *L, const int32_t *slots,
                                int64_t c0, int64_t c1) {
    const int int8 = L->k_cache == NULL; /* (an int8 cache: its codes; the scales are small) */
    const int64_t bytes = m->kv_heads * m->head_dim * (int8 ? 1 : 2); /* a multiple of 16 */
    const char *kc = int8 ? (const char *)L->k_codes : (const char *)L->k_cache;
    const char *vc = int8 ? (const char *)L->v_codes : (const char *)L->v_cache;
    __m256i acc = _mm256_setzero_si256();
    for (int64_t t = c0; t < c1; t++) {
        const char *k = kc + (int64_t)slots[t] * bytes, *v = vc + (int64_t)slots[t] * bytes;
        for (int64_t i = 0; i < bytes; i += 16)
            acc = _mm256_or_si256(acc, _mm256_castsi128_si256(_mm_or_si128(
                _mm_loadu_si128((const __m128i *)(k + i)), _mm_loadu_si128((const __m128i *)(v + i)))));
    }
    __asm__ volatile("" : : "x"(acc)); /* the loads are what counts */
}

/* One block of keys against a tile of queries, the steps both the shared-prefix product and
 * prefill take. Queries sit in registers of 8 (Mb of them, Ms = 8 Mb floats apart per row). */

/* s[j][i] = q_i . k_j for the block's keys (kx: each key widened, permuted; past the last key
 * repeated), qt: the queries permuted and scaled ([D][Ms]). last_key: NULL, or per query the
 * last key position it sees (keys c0 + j past it score -inf). */
static void tile_scores(const float *const *kx, int64_t keys, const float *qt, int64_t D,
                         int64_t Mb, int64_t Ms, const int32_t *last_key, int64_t c0, float *s) {
    const __m256 hidden = _mm256_set1_ps(-INFINITY);
    for (int64_t b0 = 0; b0 < Mb; b0 += TILE_B) {
        const int B = Mb - b0 < TILE_B ? (int)(Mb - b0) : TILE_B;
        for (int64_t j0 = 0; j0 < keys; j0 += TILE_A) {
            __m256 acc[TILE_A * TILE_B];
            for (int u = 0; u < TILE_A * B; u++) acc[u] = _mm256_setzero_ps();
            outer_tile(kx + j0, 1, qt + 8 * b0, Ms, D, acc, B);
            for (int a = 0; a < TILE_A && j0 + a < keys; a++)
                for (int b = 0; b < B; b++) {
                    __m256 v = acc[a * B + b];
                    if (last_key) {
                        const __m256i last = _mm256_loadu_si256((const __m256i *)(last_key + 8 * (b0 + b)));
                        const __m256i later = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(c0 + j0 + a)), last);
                        v = _mm256_blendv_ps(v, hidden, _mm256_castsi256_ps(later));
                    }
                    _mm256_storeu_ps(s + (j0 + a) * Ms + 8 * (b0 + b), v);
                }
        }
    }
}

/* The online softmax's step: per query the running max mx and sum, alpha the rescale of what
 * came before; the block's scores become its weights in place. */
static void block_weights(float *s, int64_t keys, int64_t Mb, int64_t Ms, float *mx, float *sum,
                          float *alpha) {
    for (int64_t b = 0; b < Mb; b++) {
        __m256 top = _mm256_set1_ps(-INFINITY);
        for (int64_t j = 0; j < keys; j++) top = _mm256_max_ps(top, _mm256_loadu_ps(s + j * Ms + 8 * b));
        const __m256 old = _mm256_loadu_ps(mx + 8 * b), now = _mm256_max_ps(old, top);
        const __m256 rescale = exp256(_mm256_sub_ps(old, now)); /* old -inf: 0 */
        __m256 total = _mm256_setzero_ps();
        for (int64_t j = 0; j < keys; j++) {
            __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j * Ms + 8 * b), now));
            total = _mm256_add_ps(total, e);
            _mm256_storeu_ps(s + j * Ms + 8 * b, e);
        }
        _mm256_storeu_ps(mx + 8 * b, now);
        _mm256_storeu_ps(sum + 8 * b, _mm256_fmadd_ps(_mm256_loadu_ps(sum + 8 * b), rescale, total));
        _mm256_storeu_ps(alpha + 8 * b, rescale);
    }
}

/* o[d][i] = alpha_i o[d][i] + the block's weights of query i (w) times values d (vx[d]: the
 * widened values' dimension d, every D), permuted as the values are. */
static void add_weighted_values(float *o, const float *alpha, const float *const *vx,
                                const float *w, int64_t keys, int64_t D, int64_t Mb, int64_t Ms) {
    for (int64_t b0 = 0; b0 < Mb; b0 += TILE_B) {
        const int B = Mb - b0 < TILE_B ? (int)(Mb - b0) : TILE_B;
        for (int64_t d0 = 0; d0 < D; d0 += TILE_A) {
            __m256 acc[TILE_A * TILE_B];
            for (int a = 0; a < TILE_A; a++)
                for (int b = 0; b < B; b++)
                    acc[a * B + b] = _mm256_mul_ps(_mm256_loadu_ps(o + (d0 + a) * Ms + 8 * (b0 + b)),
                                                   _mm256_loadu_ps(alpha + 8 * (b0 + b)));
            outer_tile(vx + d0, D, w + 8 * b0, Ms, keys, acc, B);
            for (int a = 0; a < TILE_A; a++)
                for (int b = 0; b < B; b++) _mm256_storeu_ps(o + (d0 + a) * Ms + 8 * (b0 + b), acc[a * B + b]);
        }
    }
}

/* Work: qt (the queries, permuted and scaled, [D][Ms]), s (one block's scores, then weights,
 * [CHUNK][Ms]), o (the V sums, [D][Ms], permuted), kf and vf (the block's K and V rows widened,
 * [CHUNK][D], permuted), then max, sum and rescale per query. Ms: the queries padded to 8, at
 * most shared_queries(m). */
int64_t rf_shared_work_floats(const rf_model *m) {
    const int64_t D = m->head_dim, Mp = shared_queries(m), C = SHARED_CHUNK;
    return 2 * D * Mp + C * Mp + 2 * C * D + 3 * Mp;
}

void rf_attend_shared(const rf_model *m, const rf_layer *L, int64_t n, const float *const *q,
                      const uint16_t *const *qb, const int32_t *slots, int64_t t0, int64_t t1,
                      float *work, float *const *partial) {
    (void)qb; /* fp32 arithmetic: the fp32 queries */
    const int64_t D = m->head_dim, G = m->heads / m->kv_heads, row = m->kv_heads * D;
    const int64_t C = SHARED_CHUNK, Mp = shared_queries(m);
    const int64_t M = n * G, Mb = (M + 7) / 8, Ms = 8 * Mb; /* queries, registers, stride */
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < m->heads; h++) {
            float *ph = partial[i] + h * (D + 2);
            ph[0] = -INFINITY;
            ph[1] = 0;
            memset(ph + 2, 0, D * sizeof(float));
        }
    if (t1 <= t0) return;
    float *qt = work, *s = qt + D * Mp, *o = s + C * Mp, *kf = o + D * Mp, *vf = kf + C * D;
    float *mx = vf + C * D, *sum = mx + Mp, *alpha = sum + Mp;
    const float *vx[MAX_HEAD_DIM]; /* dimension d' of the values: vf + d', every D */
    for (int64_t d = 0; d < D; d++) vx[d] = vf + d;
    for (int64_t kvh = 0; kvh < m->kv_heads; kvh++) {
        /* query i = request i / G's head kvh G + i % G */
        for (int64_t i = 0; i < Ms; i++) {
            const float *src = i < M ? q[i / G] + (kvh * G + i % G) * D : NULL;
            for (int64_t d = 0; d < D; d++) qt[permuted(d) * Ms + i] = src ? src[d] * m->scale : 0;
            mx[i] = -INFINITY;
            sum[i] = 0;
        }
        for (int64_t d = 0; d < D; d++) memset(o + d * Ms, 0, Ms * sizeof(float));
        for (int64_t c0 = t0; c0 < t1; c0 += C) {
            const int64_t keys = t1 - c0 < C ? t1 - c0 : C;
            if (kvh == 0) stream_block(m, L, slots, c0, c0 + keys); /* whole rows, for every KV head */
            const float *kx[SHARED_CHUNK]; /* past the last key: repeat it (not stored) */
            for (int64_t j = 0; j < keys; j++) {
                const int64_t slot = slots[c0 + j], at = slot * row + kvh * D;
                if (L->k_cache) {
                    widen_row(L->k_cache + at, D, kf + j * D);
                    widen_row(L->v_cache + at, D, vf + j * D);
                } else {
                    widen_codes(L->k_codes + at, kv_scale(L->k_scales, slot, m->kv_heads, kvh), D, kf + j * D);
                    widen_codes(L->v_codes + at, kv_scale(L->v_scales, slot, m->kv_heads, kvh), D, vf + j * D);
                }
            }
            for (int64_t j = 0; j < C; j++) kx[j] = kf + (j < keys ? j : keys - 1) * D;
            tile_scores(kx, keys, qt, D, Mb, Ms, NULL, c0, s);
            block_weights(s, keys, Mb, Ms, mx, sum, alpha);
            add_weighted_values(o, alpha, vx, s, keys, D, Mb, Ms);
        }
        for (int64_t i = 0; i < M; i++) {
            float *ph = partial[i / G] + (kvh * G + i % G) * (D + 2);
            ph[0] = mx[i];
            ph[1] = sum[i];
            for (int64_t d = 0; d < D; d++) ph[2 + d] = o[permuted(d) * Ms + i];
        }
    }
}

void rf_silu(const float *x, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(out + i, _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f),
                                                  exp256(_mm256_sub_ps(_mm256_setzero_ps(), g)))));
    }
    for (; i < n; i++) out[i] = x[i] / (1.0f + expf(-x[i]));
}

/* out[r] = the first index of the largest value of row r of x [rows][n], or of its first NaN,
 * as torch.argmax answers: one pass for the max (and whether there is a NaN), one for where it
 * first is. */
void rf_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        __m256 best[4], nan = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) best[j] = _mm256_set1_ps(-INFINITY);
        int64_t i = 0;
        for (; i + 32 <= n; i += 32)
            for (int j = 0; j < 4; j++) {
                __m256 v = _mm256_loadu_ps(xr + i + 8 * j);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                best[j] = _mm256_max_ps(best[j], v);
            }
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            best[0] = _mm256_max_ps(best[0], v);
        }
        __m256 b = _mm256_max_ps(_mm256_max_ps(best[0], best[1]), _mm256_max_ps(best[2], best[3]));
        b = _mm256_max_ps(b, _mm256_permute2f128_ps(b, b, 1));
        b = _mm256_max_ps(b, _mm256_shuffle_ps(b, b, 0x4E));
        b = _mm256_max_ps(b, _mm256_shuffle_ps(b, b, 0xB1));
        float mx = _mm256_cvtss_f32(b);
        int any_nan = _mm256_movemask_ps(nan) != 0;
        for (; i < n; i++) {
            any_nan |= xr[i] != xr[i];
            mx = xr[i] > mx ? xr[i] : mx;
        }
        /* what to find: the first NaN, or the first value equal to the max */
        const __m256 target = _mm256_set1_ps(mx);
        int64_t at = -1;
        for (i = 0; i + 8 <= n && at < 0; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            int hit = _mm256_movemask_ps(any_nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q)
                                                 : _mm256_cmp_ps(v, target, _CMP_EQ_OQ));
            if (hit) at = i + __builtin_ctz((unsigned)hit);
        }
        for (; i < n && at < 0; i++)
            if (any_nan ? xr[i] != xr[i] : xr[i] == mx) at = i;
        out[r] = at < 0 ? 0 : at;
    }
}

/* ---- one request's causal attention over its prompt (prefill), fp32 ---- */

int64_t rf_prefill_tile_queries(void) { return 96; } /* 12 registers */
int64_t rf_prefill_dim_multiple(void) { return 16; } /* widen_row's chunks */

int64_t rf_prefill_work_floats(int64_t D) {
    const int64_t Ms = rf_prefill_tile_queries(), C = SHARED_CHUNK;
    return 2 * D * Ms + C * Ms + 2 * C * D + 4 * Ms;
}

/* Tokens [t0, t1) of the request, the query heads of KV head kvh: rf_attend_shared's block
 * steps over keys 0 .. prefix + t1 - 1; the blocks that reach past prefix + t0 hide each
 * query's later keys. */
void rf_prefill_tile(const rf_prefill *J, int64_t kvh, int64_t t0, int64_t t1, float *work) {
    const int64_t D = J->head_dim, G = J->heads / J->kv_heads, C = SHARED_CHUNK;
    const int64_t row = J->kv_heads * D, M = (t1 - t0) * G, Mb = (M + 7) / 8, Ms = 8 * Mb;
    const float *q = J->q;
    float *qt = work, *s = qt + D * Ms, *o = s + C * Ms, *kf = o + D * Ms, *vf = kf + C * D;
    float *mx = vf + C * D, *sum = mx + Ms, *alpha = sum + Ms;
    int32_t *last_key = (int32_t *)(alpha + Ms); /* the last key each query sees */
    const float *vx[MAX_HEAD_DIM];
    for (int64_t d = 0; d < D; d++) vx[d] = vf + d;
    for (int64_t i = 0; i < Ms; i++) { /* query i: token t0 + i / G, head kvh G + i % G */
        const float *src = i < M ? q + (t0 + i / G) * J->q_stride + (kvh * G + i % G) * D : NULL;
        for (int64_t d = 0; d < D; d++) qt[permuted(d) * Ms + i] = src ? src[d] * J->scale : 0;
        mx[i] = -INFINITY;
        sum[i] = 0;
        last_key[i] = (int32_t)(i < M ? J->prefix + t0 + i / G : J->prefix + t1);
    }
    memset(o, 0, D * Ms * sizeof(float));
    const int64_t end = J->prefix + t1;
    for (int64_t c0 = 0; c0 < end; c0 += C) { /* key 0 comes first: every query sees it */
        const int64_t keys = end - c0 < C ? end - c0 : C;
        const int masked = c0 + keys - 1 > J->prefix + t0;
        for (int64_t j = 0; j < keys; j++) {
            const int64_t slot = J->slots[c0 + j], at = slot * row + kvh * D;
            if (J->k) {
                widen_row(J->k + at, D, kf + j * D);
                widen_row(J->v + at, D, vf + j * D);
            } else {
                widen_codes(J->k_codes + at, kv_scale(J->k_scales, slot, J->kv_heads, kvh), D, kf + j * D);
                widen_codes(J->v_codes + at, kv_scale(J->v_scales, slot, J->kv_heads, kvh), D, vf + j * D);
            }
        }
        const float *kx[SHARED_CHUNK]; /* past the last key: repeat it (not stored) */
        for (int64_t j = 0; j < C; j++) kx[j] = kf + (j < keys ? j : keys - 1) * D;
        tile_scores(kx, keys, qt, D, Mb, Ms, masked ? last_key : NULL, c0, s);
        block_weights(s, keys, Mb, Ms, mx, sum, alpha);
        add_weighted_values(o, alpha, vx, s, keys, D, Mb, Ms);
    }
    float *out = J->out;
    for (int64_t i = 0; i < M; i++) {
        float *dst = out + (t0 + i / G) * J->out_stride + (kvh * G + i % G) * D;
        const float inv = 1.0f / sum[i];
        for (int64_t d = 0; d < D; d++) dst[d] = o[permuted(d) * Ms + i] * inv;
    }
}
