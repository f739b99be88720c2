/* One decode step of a Llama-family model for up to MAX_BATCH requests, one token each, in one
 * call (CPU, AVX-512 BF16/VNNI).
 *
 * A token's forward is ~30 layers x a dozen small operations; run as torch ops each costs
 * microseconds of dispatch, and a step pays it ~400 times. Here the step runs in one OpenMP
 * parallel region: the matrix products are split over the threads by tiles (gemv.c), reading
 * the weights once for all rows; attention by each request's key ranges (each thread keeps a
 * partial softmax per request that the threads then merge), K and V read in place from the KV
 * pool through the request's slot list; the per-row vector work (norms, rope, SiLU, residuals)
 * by rows, between barriers of our own (spin_wait).
 *
 * Numerics: the residual stream stays fp32; the inputs of the matrix products are rounded to
 * bf16 as the bf16 model rounds them (then split into 16-bit integers for the integer weight
 * formats, gemv.c); K/V are stored as bf16 (the pool's dtype). tests/runtime/
 * test_native_decode.py holds the step to at least the eager bf16 model's closeness to fp32.
 */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "gemv.h"

#define MAX_GROUP 16    /* query heads per KV head */
#define MAX_BATCH 16    /* requests per step */
#define MAX_HEAD_DIM 512

typedef struct {
    int64_t format, n, k;
    const uint8_t *data;
} rf_weight;

typedef struct {
    const float *attn_norm, *ffn_norm; /* [hidden] */
    const float *q_norm, *k_norm;      /* [head_dim], or NULL (Qwen3 has them) */
    const float *qkv_bias;             /* [q + 2 kv], or NULL (Qwen2 has it) */
    rf_weight qkv, o, gate_up, down;
    uint16_t *k_cache, *v_cache; /* bf16 [slots][kv_heads][head_dim] */
} rf_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_context, nthreads,
        max_batch;
    float eps, scale;
    const rf_layer *layers;
    const float *final_norm;
    rf_weight head;
    float *scratch; /* rf_decode_scratch_floats(model) floats */
    double *profile; /* NULL, or PROFILE_PHASES seconds that each step adds to (thread 0) */
} rf_model;

/* What thread 0 spent where, barrier waits included: the profile's slots. */
enum { PH_NORM, PH_QKV, PH_ROPE_KV, PH_ATTN, PH_O, PH_MLP_UP, PH_ACT, PH_DOWN, PH_HEAD,
       PROFILE_PHASES };

/* ---- scratch ---- */

/* Per-row buffers hold max_batch rows. xb/xf (a product's input, bf16 and its fp32 values)
 * have rows of the product's in_features; the outputs have rows of its out_features. */
typedef struct {
    float *x, *xf, *qkv, *o, *gate_up, *scores, *partial;
    uint16_t *xb, *attn, *act, *qb;
    split_x xs[MAX_BATCH]; /* each row of the input split for the integer kernels */
} buffers;

static int64_t pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* bf16 values per query head in buffers.qb: head_dim padded to whole 32-value chunks. */
static int64_t q_stride(const rf_model *m) { return (m->head_dim + 31) / 32 * 32; }

static int64_t widest_input(const rf_model *m) {
    int64_t w = m->hidden > m->inter ? m->hidden : m->inter;
    return w > m->heads * m->head_dim ? w : m->heads * m->head_dim;
}

/* Carves the scratch into buffers; returns how many floats it takes. */
static int64_t layout(const rf_model *m, float *base, buffers *b) {
    const int64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim, w = widest_input(m);
    const int64_t B = m->max_batch, part = m->heads * (m->head_dim + 2);
    int64_t at = 0;
#define TAKE(field, type, count) \
    do { if (b) b->field = (type *)(base + at); at += pad16(count); } while (0)
    TAKE(x, float, B * m->hidden);
    TAKE(xf, float, B * w);
    for (int64_t r = 0; r < B; r++) {
        TAKE(xs[r].scale, float, w / GROUP + 1);
        TAKE(xs[r].sum, float, w / GROUP + 1);
        TAKE(xs[r].hi, int8_t, w / 4 + 1);
        TAKE(xs[r].lo, int8_t, w / 4 + 1);
    }
    TAKE(qkv, float, B * (q + 2 * kv));
    TAKE(o, float, B * m->hidden);
    TAKE(gate_up, float, B * 2 * m->inter);
    TAKE(scores, float, m->nthreads * m->heads * m->max_context);
    TAKE(partial, float, B * m->nthreads * part);
    TAKE(xb, uint16_t, B * w / 2 + 1);
    TAKE(attn, uint16_t, B * q / 2 + 1);
    TAKE(act, uint16_t, B * m->inter / 2 + 1);
    TAKE(qb, uint16_t, B * m->heads * q_stride(m) / 2);
#undef TAKE
    return at;
}

int64_t rf_decode_scratch_floats(const rf_model *m) { return layout(m, NULL, NULL); }

/* ---- vector helpers ---- */

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_to_f32_1(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

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

/* out = x / rms(x) * weight, rounded to bf16 (out_b) and kept as fp32 of that (out_f). */
static void rms_norm(const float *x, const float *weight, int64_t n, float eps, uint16_t *out_b,
                     float *out_f) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int64_t i = 0; i < n; i++) {
        out_b[i] = f32_to_bf16(x[i] * inv * weight[i]);
        out_f[i] = bf16_to_f32_1(out_b[i]);
    }
}

static void rms_norm_inplace(float *x, const float *weight, int64_t n, float eps) {
    float ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * inv * weight[i];
}

/* HF's rotate-half rope: x[i] cos[i] - x[i + d/2] sin[i] for the first half, and so on. */
static void rope(float *x, const float *cos, const float *sin, int64_t d) {
    const int64_t h = d / 2;
    for (int64_t i = 0; i < h; i++) {
        float a = x[i], b = x[i + h];
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}

/* Readies row r's input of a product with w from its xf row (xb's values as fp32). */
static void prepare_input(const rf_weight *w, buffers *b, int64_t r) {
    if (w->format != FORMAT_BF16) rf_split_x(b->xf + r * w->k, w->k, w->format == FORMAT_Q8_0, b->xs[r]);
}

/* Sets row r's input of a product with w to src (bf16, w->k values). */
static void set_input_bf16(const rf_weight *w, const uint16_t *src, buffers *b, int64_t r) {
    uint16_t *xb = b->xb + r * w->k;
    float *xf = b->xf + r * w->k;
    memcpy(xb, src, w->k * sizeof(uint16_t));
    for (int64_t i = 0; i < w->k; i++) xf[i] = bf16_to_f32_1(xb[i]);
    prepare_input(w, b, r);
}

/* Row r's residual stream through an RMSNorm into the input of a product with w. */
static void norm_input(const rf_model *m, const float *weight, const rf_weight *w, buffers *b,
                       int64_t r) {
    const int64_t H = m->hidden;
    rms_norm(b->x + r * H, weight, H, m->eps, b->xb + r * H, b->xf + r * H);
    prepare_input(w, b, r);
}

/* This thread's tiles of y = w x for B rows (y: B rows of w->n), input readied before. */
static void gemv_part(const rf_weight *w, const buffers *b, int64_t B, float *y) {
    const int64_t tiles = (w->n + TILE - 1) / TILE;
    int64_t t0, t1;
    thread_range(tiles, &t0, &t1);
    if (w->format == FORMAT_Q4_1)
        rf_q4_1_gemm_tiles(w->data, b->xs, y, 0, B, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q8_0)
        rf_q8_0_gemm_tiles(w->data, b->xs, y, 0, B, w->n, w->k, t0, t1);
    else
        rf_bf16_gemm_tiles(w->data, b->xb, y, 0, B, w->n, w->k, t0, t1);
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
    const rf_model *m, const uint16_t *k_cache, int64_t kvh, const int32_t *slots, int64_t t0,
    int64_t n, const uint16_t *qb, float *s, const int CH) {
    const int64_t D = m->head_dim, row = m->kv_heads * D;
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
    const rf_model *m, const uint16_t *v_cache, int64_t kvh, const int32_t *slots, int64_t t0,
    int64_t n, int64_t d0, const uint32_t *const *w, float *const *out, const int G) {
    const int64_t D = m->head_dim, row = m->kv_heads * D;
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

static inline void prefetch_rows(const uint16_t *cache, const int32_t *slots, int64_t from,
                                 int64_t to, int64_t row) {
    for (int64_t t = from; t < to; t++)
        for (int64_t byte = 0; byte < row * 2; byte += 64)
            _mm_prefetch((const char *)(cache + (int64_t)slots[t] * row) + byte, _MM_HINT_T0);
}

/* This thread's keys [t0, t1): per head, its max score, sum of exp and exp-weighted V sum.
 * Keys go in blocks of 16 whose K (then V) rows every head reads while they sit in L1, the
 * next block's rows prefetched meanwhile (slots need not be consecutive). */
static void attend_part(const rf_model *m, const rf_layer *L, const uint16_t *qb,
                        const int32_t *slots, int64_t t0, int64_t t1, float *scores, float *partial) {
    const int64_t D = m->head_dim, group = m->heads / m->kv_heads, n = t1 - t0;
    const int64_t row = m->kv_heads * D, qs = q_stride(m);
    for (int64_t h = 0; h < m->heads; h++) {
        float *ph = partial + h * (D + 2);
        ph[0] = -INFINITY;
        ph[1] = 0;
        memset(ph + 2, 0, D * sizeof(float));
    }
    if (n <= 0) return;
    for (int64_t b = 0; b < n; b += 16) {
        const int64_t keys = n - b < 16 ? n - b : 16;
        prefetch_rows(L->k_cache, slots, t0 + b + 16, t0 + (b + 32 < n ? b + 32 : n), row);
        for (int64_t h = 0; h < m->heads; h++) {
            const int64_t kvh = h / group;
            const uint16_t *qh = qb + h * qs;
            float *s = scores + h * n + b;
            switch (qs / 32) {
            case 1: head_scores(m, L->k_cache, kvh, slots, t0 + b, keys, qh, s, 1); break;
            case 2: head_scores(m, L->k_cache, kvh, slots, t0 + b, keys, qh, s, 2); break;
            case 3: head_scores(m, L->k_cache, kvh, slots, t0 + b, keys, qh, s, 3); break;
            case 4: head_scores(m, L->k_cache, kvh, slots, t0 + b, keys, qh, s, 4); break;
            default: head_scores(m, L->k_cache, kvh, slots, t0 + b, keys, qh, s, 16); break;
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
    for (int64_t b = 0; b < n; b += 16) {
        const int64_t keys = n - b < 16 ? n - b : 16;
        prefetch_rows(L->v_cache, slots, t0 + b + 16, t0 + (b + 32 < n ? b + 32 : n), row);
        for (int64_t kvh = 0; kvh < m->kv_heads; kvh++)
            for (int64_t g0 = 0; g0 < group; g0 += 8) { /* up to 8 heads' accumulators at once */
                const uint32_t *w[8];
                float *out[8];
                const int count = group - g0 < 8 ? (int)(group - g0) : 8;
                for (int g = 0; g < count; g++) {
                    w[g] = (const uint32_t *)(scores + (kvh * group + g0 + g) * n) + b / 2;
                    out[g] = partial + (kvh * group + g0 + g) * (D + 2) + 2;
                }
                for (int64_t d0 = 0; d0 < D; d0 += 32) {
                    const uint16_t *vc = L->v_cache;
                    const int64_t tb = t0 + b;
                    switch (count) {
                    case 1: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 1); break;
                    case 2: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 2); break;
                    case 3: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 3); break;
                    case 4: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 4); break;
                    case 5: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 5); break;
                    case 6: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 6); break;
                    case 7: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 7); break;
                    default: weighted_values(m, vc, kvh, slots, tb, keys, d0, w, out, 8); break;
                    }
                }
            }
    }
}

/* Merges the threads' partial softmaxes of every head into out (bf16 [heads][D]). */
static void attend_merge(const rf_model *m, const float *partials, int64_t threads,
                         uint16_t *out) {
    const int64_t D = m->head_dim, stride = m->heads * (D + 2);
    for (int64_t h = 0; h < m->heads; h++) {
        float mx = -INFINITY, denom = 0, acc[MAX_HEAD_DIM];
        for (int64_t i = 0; i < threads; i++) {
            float v = partials[i * stride + h * (D + 2)];
            mx = v > mx ? v : mx;
        }
        memset(acc, 0, D * sizeof(float));
        for (int64_t i = 0; i < threads; i++) {
            const float *p = partials + i * stride + h * (D + 2);
            if (p[1] == 0) continue;
            float w = expf(p[0] - mx);
            denom += w * p[1];
            for (int64_t d = 0; d < D; d++) acc[d] += w * p[2 + d];
        }
        for (int64_t d = 0; d < D; d++) out[h * D + d] = f32_to_bf16(acc[d] / denom);
    }
}

/* ---- the step ---- */

static void silu_mul(const float *gate_up, int64_t n, uint16_t *out) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate_up + i), u = _mm512_loadu_ps(gate_up + n + i);
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g))));
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(s, u)));
    }
    for (; i < n; i++) {
        float g = gate_up[i];
        out[i] = f32_to_bf16(g / (1.0f + expf(-g)) * gate_up[n + i]);
    }
}

/* ---- synchronisation ---- */

/* A spinning barrier for the step's threads. libgomp's own barriers spin only ~100 times
 * before sleeping in the kernel once it manages more threads than there are CPUs (which it
 * does as soon as a second Python thread has run torch ops, e.g. the engine's scheduler
 * thread): then each of the step's ~300 barriers costs a futex wake-up, milliseconds a step.
 * This one spins, yielding the CPU now and then in case the other thread was preempted. */
typedef struct {
    atomic_int arrived, phase;
} spin_barrier;

static void spin_wait(spin_barrier *bar, int threads) {
    const int phase = atomic_load_explicit(&bar->phase, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&bar->arrived, 1, memory_order_acq_rel) == threads - 1) {
        atomic_store_explicit(&bar->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&bar->phase, phase + 1, memory_order_release);
        return;
    }
    for (int spins = 1; atomic_load_explicit(&bar->phase, memory_order_acquire) == phase; spins++) {
        _mm_pause();
        if (spins % 4096 == 0) sched_yield();
    }
}

/* ---- the step ---- */

/* Logits [B][vocab] (fp32) of B requests' next tokens, one token each: x_in [B][hidden] their
 * embeddings, cos/sin [B][head_dim] their rope rows, out_slots[r] where row r's K/V go, and
 * table + rows[r] * table_stride row r's KV slots, lens[r] of them (the last is out_slots[r];
 * lens[r] <= max_context). B <= max_batch. */
void rf_decode_batch(const rf_model *m, int64_t B, const float *x_in, const float *cos,
                     const float *sin, const int64_t *out_slots, const int32_t *table,
                     int64_t table_stride, const int64_t *rows, const int64_t *lens, float *logits) {
    buffers b;
    layout(m, m->scratch, &b);
    const int64_t H = m->hidden, D = m->head_dim, q_size = m->heads * D, kv_size = m->kv_heads * D;
    const int64_t qkv_size = q_size + 2 * kv_size, qs = q_stride(m), part = m->heads * (D + 2);
    spin_barrier bar = {0, 0};
    memcpy(b.x, x_in, B * H * sizeof(float));
    for (int64_t r = 0; r < B; r++) norm_input(m, m->layers[0].attn_norm, &m->layers[0].qkv, &b, r);
#pragma omp parallel num_threads(m->nthreads)
    {
        const int id = omp_get_thread_num(), threads = omp_get_num_threads();
        double *prof = id == 0 ? m->profile : NULL, last = prof ? omp_get_wtime() : 0;
        int64_t r0, r1; /* this thread's rows for the per-row work between products */
        thread_range(B, &r0, &r1);
#define PHASE(slot) \
    do { if (prof) { double now_ = omp_get_wtime(); prof[slot] += now_ - last; last = now_; } } while (0)
#define SYNC() spin_wait(&bar, threads)
#define MATMUL(w, y, slot) do { gemv_part(w, &b, B, y); SYNC(); PHASE(slot); } while (0)
        for (int64_t l = 0; l < m->num_layers; l++) {
            const rf_layer *L = m->layers + l;
            const int last_layer = l + 1 == m->num_layers;
            MATMUL(&L->qkv, b.qkv, PH_QKV);
            for (int64_t r = r0; r < r1; r++) {
                float *qkv = b.qkv + r * qkv_size;
                if (L->qkv_bias)
                    for (int64_t i = 0; i < qkv_size; i++) qkv[i] += L->qkv_bias[i];
                for (int64_t h = 0; h < m->heads + m->kv_heads; h++) {
                    float *v = qkv + h * D;
                    const float *norm = h < m->heads ? L->q_norm : L->k_norm;
                    if (norm) rms_norm_inplace(v, norm, D, m->eps);
                    rope(v, cos + r * D, sin + r * D, D);
                }
                uint16_t *qb = b.qb + r * m->heads * qs;
                for (int64_t h = 0; h < m->heads; h++)
                    for (int64_t d = 0; d < qs; d++)
                        qb[h * qs + d] = d < D ? f32_to_bf16(qkv[h * D + d]) : 0;
                const float *k = qkv + q_size, *v = qkv + q_size + kv_size;
                for (int64_t i = 0; i < kv_size; i++) {
                    L->k_cache[out_slots[r] * kv_size + i] = f32_to_bf16(k[i]);
                    L->v_cache[out_slots[r] * kv_size + i] = f32_to_bf16(v[i]);
                }
            }
            SYNC();
            PHASE(PH_ROPE_KV);
            for (int64_t r = 0; r < B; r++) { /* each row's keys split over the threads */
                int64_t t0, t1;
                thread_range(lens[r], &t0, &t1);
                attend_part(m, L, b.qb + r * m->heads * qs, table + rows[r] * table_stride, t0, t1,
                            b.scores + id * m->heads * m->max_context,
                            b.partial + (r * threads + id) * part);
            }
            SYNC();
            for (int64_t r = r0; r < r1; r++) {
                attend_merge(m, b.partial + r * threads * part, threads, b.attn + r * q_size);
                set_input_bf16(&L->o, b.attn + r * q_size, &b, r);
            }
            SYNC();
            PHASE(PH_ATTN);
            MATMUL(&L->o, b.o, PH_O);
            for (int64_t r = r0; r < r1; r++) {
                for (int64_t i = r * H; i < (r + 1) * H; i++) b.x[i] += b.o[i];
                norm_input(m, L->ffn_norm, &L->gate_up, &b, r);
            }
            SYNC();
            PHASE(PH_NORM);
            MATMUL(&L->gate_up, b.gate_up, PH_MLP_UP);
            for (int64_t r = r0; r < r1; r++) {
                silu_mul(b.gate_up + r * 2 * m->inter, m->inter, b.act + r * m->inter);
                set_input_bf16(&L->down, b.act + r * m->inter, &b, r);
            }
            SYNC();
            PHASE(PH_ACT);
            MATMUL(&L->down, b.o, PH_DOWN);
            for (int64_t r = r0; r < r1; r++) { /* the residual, and the next product's input */
                for (int64_t i = r * H; i < (r + 1) * H; i++) b.x[i] += b.o[i];
                norm_input(m, last_layer ? m->final_norm : L[1].attn_norm,
                           last_layer ? &m->head : &L[1].qkv, &b, r);
            }
            SYNC();
            PHASE(PH_NORM);
        }
        MATMUL(&m->head, logits, PH_HEAD);
#undef MATMUL
#undef SYNC
#undef PHASE
    }
}

/* out[r] = the first index of the largest value of row r of x [rows][n], or of its first NaN,
 * as torch.argmax answers (greedy sampling: torch's argmax takes ~0.1-0.2 ms over a 49k
 * vocabulary on this CPU, this ~10 us). */
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
