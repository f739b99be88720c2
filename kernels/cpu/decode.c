/* One decode step of a Llama-family model for up to MAX_BATCH requests, one token each, in one
 * call (CPU; the same source in every instruction-set level's build: the products come from
 * gemv_<level>.c, attention, SiLU and argmax from step_<level>.c).
 *
 * A token's forward is ~30 layers x a dozen small operations; run as torch ops each costs
 * microseconds of dispatch, and a step pays it ~400 times. Here the step runs in one OpenMP
 * parallel region: the matrix products are split over the threads by tiles (gemv_*.c), reading
 * the weights once for all rows; attention by each request's key ranges (each thread keeps a
 * partial softmax per request that the threads then merge), K and V read in place from the KV
 * pool through the request's slot list; the per-row vector work (norms, rope, SiLU, residuals)
 * by rows, between barriers of our own (spin_wait).
 *
 * Requests whose slot rows begin with the same slots (a prefix the radix cache holds once: a
 * system prompt, few-shot examples, forked branches) are found once a step (find_groups); each
 * such group attends over its shared prefix together (rf_attend_shared: all its queries against
 * each block of prefix keys as one matrix product, FlashInfer's cascade), each request over the
 * rest of its row alone, and the two partial softmaxes merge like the threads' do.
 *
 * Numerics: the residual stream stays fp32; for a bf16 model the inputs of the matrix products
 * are rounded to bf16 as the torch model rounds them (an fp32 model's stay fp32), then prepared
 * for the integer weight formats as the level does it (gemv_<level>.c: exact 16-bit integers
 * at avx512, 8-bit groups at avx2); K/V are stored as bf16 (the pool's dtype).
 * tests/runtime/test_native_decode.py holds the step to the eager model's closeness to fp32.
 */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decode.h"

/* ---- scratch ---- */

/* Per-row buffers hold max_batch rows. xb/xf (a product's input, bf16 and its fp32 values)
 * have rows of the product's in_features; the outputs have rows of its out_features. */
typedef struct {
    float *x, *xf, *qkv, *o, *gate_up, *scores, *partial, *shared;
    uint16_t *xb, *qb;
    split_x xs[MAX_BATCH]; /* each row of the input split for the integer kernels */
} buffers;

static int64_t pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

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
    TAKE(partial, float, B * 2 * m->nthreads * part); /* per row: its own keys', the prefix's */
    TAKE(shared, float, m->nthreads * pad16(rf_shared_work_floats(m)));
    TAKE(xb, uint16_t, B * w / 2 + 1);
    TAKE(qb, uint16_t, B * m->heads * q_stride(m) / 2);
#undef TAKE
    return at;
}

int64_t rf_decode_scratch_floats(const rf_model *m) { return layout(m, NULL, NULL); }

/* ---- per-row helpers ---- */

/* out = x / rms(x) * weight (fp32). */
static void rms_norm(const float *x, const float *weight, int64_t n, float eps, float *out) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * weight[i];
}

static void rms_norm_inplace(float *x, const float *weight, int64_t n, float eps) {
    float ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * inv * weight[i];
}

/* out[i] = silu(gate_up[i]) * gate_up[n + i] for i < n (fp32). */
static void silu_mul(const float *gate_up, int64_t n, float *out) {
    rf_silu(gate_up, n, out);
    for (int64_t i = 0; i < n; i++) out[i] *= gate_up[n + i];
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

/* Readies row r's input of a product with w, whose fp32 values are in its xf row: xb gets
 * them as bf16 (what the bf16 weight format multiplies). A bf16 model rounds every product's
 * input to bf16 (m->bf16_inputs), so xf takes the rounded values too, as the torch model would
 * have them; an fp32 model's stay exact. The integer formats then split xf (rf_split_x). */
static void set_input(const rf_model *m, const rf_weight *w, buffers *b, int64_t r) {
    uint16_t *xb = b->xb + r * w->k;
    float *xf = b->xf + r * w->k;
    for (int64_t i = 0; i < w->k; i++) xb[i] = f32_to_bf16(xf[i]);
    if (m->bf16_inputs)
        for (int64_t i = 0; i < w->k; i++) xf[i] = bf16_to_f32_1(xb[i]);
    if (w->format != FORMAT_BF16) rf_split_x(xf, w->k, w->format == FORMAT_Q8_0, b->xs[r]);
}

/* Row r's residual stream through an RMSNorm into the input of a product with w. */
static void norm_input(const rf_model *m, const float *weight, const rf_weight *w, buffers *b,
                       int64_t r) {
    const int64_t H = m->hidden;
    rms_norm(b->x + r * H, weight, H, m->eps, b->xf + r * H);
    set_input(m, w, b, r);
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

/* Merges `threads` partial softmaxes of every head into out (fp32 [heads][D]). */
static void attend_merge(const rf_model *m, const float *partials, int64_t threads,
                         float *out) {
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
        for (int64_t d = 0; d < D; d++) out[h * D + d] = acc[d] / denom;
    }
}

/* ---- requests that share a prefix ---- */

typedef struct {
    int64_t count, prefix; /* requests, and the slots all of them begin with */
    int16_t rows[MAX_BATCH]; /* their rows in the batch; rows[0] leads */
} shared_group;

/* How many of the first n slots a and b hold alike. */
static int64_t common_slots(const int32_t *a, const int32_t *b, int64_t n) {
    int64_t i = 0;
    while (i + 16 <= n && !memcmp(a + i, b + i, 16 * sizeof(int32_t))) i += 16;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Groups the B rows by the slots they begin with, greedily: each row joins the group whose
 * leader it shares the most with, where that adds to the prefix keys the group reads once
 * (count x prefix minus the one read it keeps), or leads a group of its own. Returns how many
 * groups share at least m->min_shared_prefix slots among two rows or more, put first in
 * `groups`; prefix[r] is row r's group's shared length (0: it attends alone). */
static int64_t find_groups(const rf_model *m, int64_t B, const int32_t *table, int64_t stride,
                           const int64_t *rows, const int64_t *lens, shared_group *groups,
                           int64_t *prefix) {
    const int64_t least = m->min_shared_prefix;
    int64_t count = 0;
    for (int64_t r = 0; r < B; r++) prefix[r] = 0;
    if (least <= 0 || B < 2) return 0;
    for (int64_t r = 0; r < B; r++) {
        const int32_t *mine = table + rows[r] * stride;
        int64_t best = -1, best_gain = 0, best_len = 0;
        for (int64_t g = 0; g < count; g++) {
            shared_group *grp = groups + g;
            const int32_t *lead = table + rows[grp->rows[0]] * stride;
            const int64_t most = grp->prefix < lens[r] ? grp->prefix : lens[r];
            if (most < least || lead[0] != mine[0]) continue;
            const int64_t len = common_slots(lead, mine, most);
            const int64_t gain = grp->count * len - (grp->count - 1) * grp->prefix;
            if (len >= least && gain > best_gain) best = g, best_gain = gain, best_len = len;
        }
        if (best < 0) {
            groups[count].count = 0;
            groups[count].prefix = lens[r];
            best = count++, best_len = lens[r];
        }
        groups[best].rows[groups[best].count++] = (int16_t)r;
        groups[best].prefix = best_len;
    }
    int64_t shared = 0;
    for (int64_t g = 0; g < count; g++)
        if (groups[g].count > 1 && groups[g].prefix >= least) {
            for (int64_t i = 0; i < groups[g].count; i++) prefix[groups[g].rows[i]] = groups[g].prefix;
            groups[shared++] = groups[g];
        }
    return shared;
}

/* find_groups for Python (DecodeStep.shared_prefixes): prefix[r] for the B rows, and the
 * number of groups. */
int64_t rf_shared_prefixes(const rf_model *m, int64_t B, const int32_t *table, int64_t stride,
                           const int64_t *rows, const int64_t *lens, int64_t *prefix) {
    shared_group groups[MAX_BATCH];
    return find_groups(m, B, table, stride, rows, lens, groups, prefix);
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

/* The profile's clock: wall time, or this thread's CPU time (time another process held the core
 * does not count). */
static double profile_clock(const rf_model *m) {
    if (!m->profile_cpu_time) return omp_get_wtime();
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Logits [logit_rows][vocab] (fp32) of the first logit_rows of B rows, one token each: x_in
 * [B][hidden] their embeddings, cos/sin [B][head_dim] their rope rows, out_slots[r] where row r's
 * K/V go, and table + rows[r] * table_stride row r's KV slots, lens[r] of them (the last is
 * out_slots[r]; lens[r] <= max_context). B <= max_batch, logit_rows <= B.
 *
 * Every layer writes all rows' K/V before any row attends, so several rows may be one request's
 * consecutive tokens (jump-forward's forced tokens): each sees the ones before it. Rows whose
 * logits nobody samples from go last and skip the head. */
void rf_decode_batch(const rf_model *m, int64_t B, const float *x_in, const float *cos,
                     const float *sin, const int64_t *out_slots, const int32_t *table,
                     int64_t table_stride, const int64_t *rows, const int64_t *lens,
                     int64_t logit_rows, float *logits) {
    buffers b;
    layout(m, m->scratch, &b);
    const int64_t H = m->hidden, D = m->head_dim, q_size = m->heads * D, kv_size = m->kv_heads * D;
    const int64_t qkv_size = q_size + 2 * kv_size, qs = q_stride(m), part = m->heads * (D + 2);
    spin_barrier bar = {0, 0};
    shared_group groups[MAX_BATCH];
    int64_t prefix[MAX_BATCH];
    const int64_t num_groups = find_groups(m, B, table, table_stride, rows, lens, groups, prefix);
    memcpy(b.x, x_in, B * H * sizeof(float));
    for (int64_t r = 0; r < B; r++) norm_input(m, m->layers[0].attn_norm, &m->layers[0].qkv, &b, r);
#pragma omp parallel num_threads(m->nthreads)
    {
        const int id = omp_get_thread_num(), threads = omp_get_num_threads();
        double *prof = id == 0 ? m->profile : NULL, last = prof ? profile_clock(m) : 0;
        int64_t r0, r1; /* this thread's rows for the per-row work between products */
        thread_range(B, &r0, &r1);
#define PHASE(slot) \
    do { if (prof) { double now_ = profile_clock(m); prof[slot] += now_ - last; last = now_; } } while (0)
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
            for (int64_t r = 0; r < B; r++) { /* each row's own keys split over the threads */
                int64_t t0, t1;
                thread_range(lens[r] - prefix[r], &t0, &t1);
                rf_attend_part(m, L, b.qkv + r * qkv_size, b.qb + r * m->heads * qs,
                               table + rows[r] * table_stride, prefix[r] + t0, prefix[r] + t1,
                               b.scores + id * m->heads * m->max_context,
                               b.partial + (r * 2 * threads + id) * part);
            }
            for (int64_t g = 0; g < num_groups; g++) { /* each shared prefix's keys, likewise */
                const shared_group *grp = groups + g;
                const float *gq[MAX_BATCH];
                const uint16_t *gqb[MAX_BATCH];
                float *out[MAX_BATCH];
                for (int64_t i = 0; i < grp->count; i++) {
                    const int64_t r = grp->rows[i];
                    gq[i] = b.qkv + r * qkv_size;
                    gqb[i] = b.qb + r * m->heads * qs;
                    out[i] = b.partial + (r * 2 * threads + threads + id) * part;
                }
                int64_t t0, t1;
                thread_range(grp->prefix, &t0, &t1);
                rf_attend_shared(m, L, grp->count, gq, gqb, table + rows[grp->rows[0]] * table_stride,
                                 t0, t1, b.shared + id * pad16(rf_shared_work_floats(m)), out);
            }
            SYNC();
            for (int64_t r = r0; r < r1; r++) {
                attend_merge(m, b.partial + r * 2 * threads * part, prefix[r] ? 2 * threads : threads,
                             b.xf + r * L->o.k);
                set_input(m, &L->o, &b, r);
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
                silu_mul(b.gate_up + r * 2 * m->inter, m->inter, b.xf + r * L->down.k);
                set_input(m, &L->down, &b, r);
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
        if (logit_rows > 0) {
            gemv_part(&m->head, &b, logit_rows, logits);
            SYNC();
            PHASE(PH_HEAD);
        }
#undef MATMUL
#undef SYNC
#undef PHASE
    }
}


int64_t rf_prefill_attention(const rf_prefill *J) {
    const int64_t G = J->kv_heads > 0 ? J->heads / J->kv_heads : 0, D = J->head_dim;
    if (J->kv_heads <= 0 || J->heads % J->kv_heads || G > MAX_GROUP
        || D % rf_prefill_dim_multiple() || D > MAX_HEAD_DIM || J->n <= 0 || J->prefix < 0
        || J->prefix + J->n > INT32_MAX)
        return -1;
    const int64_t tokens = rf_prefill_tile_queries() / G; /* per tile (>= 6: G <= MAX_GROUP) */
    const int64_t tiles = (J->n + tokens - 1) / tokens, tasks = tiles * J->kv_heads;
    const size_t bytes = (rf_prefill_work_floats(D) * sizeof(float) + 63) / 64 * 64;
    int failed = 0;
#pragma omp parallel num_threads(J->nthreads)
    {
        float *work = aligned_alloc(64, bytes);
        if (work == NULL) {
#pragma omp atomic write
            failed = 1;
        }
        /* the last tiles see the most keys: they go first */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (work == NULL) continue;
            const int64_t tile = tiles - 1 - task / J->kv_heads, t0 = tile * tokens;
            rf_prefill_tile(J, task % J->kv_heads, t0, t0 + tokens < J->n ? t0 + tokens : J->n, work);
        }
        free(work);
    }
    return failed ? -2 : 0;
}

/* The bindings' contract (kernels/cpu/abi.py checks it when the library loads): the sizes of
 * the structures Python builds, the layout constants and enums it restates, and the limits it
 * reads from here. Returns how many values it wrote. */
int64_t rf_abi(int64_t *out) {
    const int64_t values[] = {sizeof(rf_weight), sizeof(rf_layer), sizeof(rf_model), TILE, GROUP,
                              FORMAT_BF16, FORMAT_Q4_1, FORMAT_Q8_0, PROFILE_PHASES, MAX_ROWS,
                              MAX_BATCH, MAX_GROUP, MAX_HEAD_DIM, sizeof(rf_prefill)};
    const int64_t n = sizeof(values) / sizeof(values[0]);
    memcpy(out, values, sizeof(values));
    return n;
}
