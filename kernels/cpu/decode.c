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
 * rest of its row alone, and the two partial softmaxes merge like the threads' do. A layer with
 * a sliding window (rf_layer.window) shorter than some row attends each row over its window's
 * keys alone, in either level's build: the window is a key range of rf_attend_part, so the step
 * files need nothing. (A window that holds every row's keys attends as a full layer.)
 *
 * A mixture-of-experts layer (rf_layer.moe) routes each row (router logits in fp32, softmax,
 * top_k), groups the batch's (row, choice) pairs by expert (moe_group), and runs each expert
 * that has pairs over just its rows: every such expert's gate/up tiles side by side form one
 * product split over the threads, SiLU * up runs by pairs, the down products likewise, and
 * each row sums its pairs' outputs times their weights. Only the routed experts' weights are
 * read; a shared expert (Qwen2-MoE) is one more job over every row, weighted by its gate.
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

/* One expert's share of a MoE layer's step (moe_group): its `count` (row, choice) pairs, in
 * slots first .. first + count - 1 of the pair buffers, whose rows there are `inter` wide. */
typedef struct {
    const rf_weight *gate_up, *down;
    int64_t first, count, inter;
    float *gu, *act, *out;    /* slot first's rows: gate_up's output, down's input, output */
    uint16_t *act_b, *in_b;   /* down's input as bf16; gate_up's gathered bf16 input, or NULL */
} moe_job;

/* Per-row buffers hold max_batch rows. xb/xf (a product's input, bf16 and its fp32 values)
 * have rows of the product's in_features; the outputs have rows of its out_features.
 * A MoE layer's (row, choice) pairs have slots of their own: max_batch x top_k routed ones,
 * grouped by expert, then one a row for the shared expert; the moe_ buffers have a row a slot,
 * of the routed experts' or the shared one's width. */
typedef struct {
    float *x, *xf, *qkv, *o, *gate_up, *scores, *partial, *shared;
    uint16_t *xb, *qb;
    split_x xs[MAX_BATCH]; /* each row of the input split for the integer kernels */
    split_x part_xs[MAX_PARTS - 1][MAX_BATCH]; /* ... for a chain's later parts (rf_weight) */
    float *part_out; /* a chain's products, each part's rows apart, before they are placed */
    int64_t rows;          /* the step's batch: how its products' inputs are split */
    /* mixture of experts (all NULL for a dense model) */
    float *logits, *route_w, *gate_w, *pair_w; /* [row][logit], [row][choice], [row], [slot] */
    int32_t *route_id, *row_slot, *pair_row, *expert_count; /* [row][choice] x 2, [slot], [e] */
    moe_job *jobs;
    int64_t *moe_state; /* jobs this layer; whether gate_up's inputs need gathering */
    split_x *in_xs, *act_xs; /* each slot's gate_up input (its row's xs), down input */
    float *moe_gu, *moe_act, *moe_out;
    uint16_t *moe_act_b, *moe_in_b;
    int64_t routed_slots, moe_inter, moe_shared_inter; /* the regions' widths */
} buffers;

static int64_t pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* The MoE layers' largest sizes, which the scratch holds (all 0 for a dense model). */
typedef struct {
    int64_t experts, top_k, inter, shared_inter, bf16_in; /* bf16_in: some gate_up is bf16 */
} moe_dims;

static moe_dims moe_sizes(const rf_model *m) {
    moe_dims d = {0, 0, 0, 0, 0};
#define WIDEN(field, v) d.field = (v) > d.field ? (v) : d.field
    for (int64_t l = 0; l < m->num_layers; l++) {
        const rf_moe *e = m->layers[l].moe;
        if (e == NULL) continue;
        WIDEN(experts, e->num_experts);
        WIDEN(top_k, e->top_k);
        WIDEN(inter, e->inter);
        WIDEN(shared_inter, e->shared_inter);
        WIDEN(bf16_in, e->gate_up[0].format == FORMAT_BF16 ? 1 : 0);
    }
#undef WIDEN
    return d;
}

/* Where slot p's row begins in a pair buffer whose routed rows are `routed` wide and shared
 * rows `shared` wide. */
static int64_t slot_at(const buffers *b, int64_t p, int64_t routed, int64_t shared) {
    return p < b->routed_slots ? p * routed : b->routed_slots * routed + (p - b->routed_slots) * shared;
}

static int64_t widest_input(const rf_model *m) {
    int64_t w = m->hidden > m->inter ? m->hidden : m->inter;
    return w > m->heads * m->head_dim ? w : m->heads * m->head_dim;
}

/* The widest output of a layer's products (qkv, o, gate_up, down): a chain's part_out rows. */
static int64_t widest_output(const rf_model *m) {
    const int64_t qkv = (m->heads + 2 * m->kv_heads) * m->head_dim;
    const int64_t w = 2 * m->inter > m->hidden ? 2 * m->inter : m->hidden;
    return w > qkv ? w : qkv;
}

/* Whether any layer's product weights is a chain (they need part_out and part_xs). */
static int has_chains(const rf_model *m) {
    for (int64_t l = 0; l < m->num_layers; l++) {
        const rf_layer *L = m->layers + l;
        if (L->qkv.next || L->o.next || L->gate_up.next || L->down.next) return 1;
    }
    return 0;
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
    if (has_chains(m)) {
        for (int64_t p = 0; p < MAX_PARTS - 1; p++)
            for (int64_t r = 0; r < B; r++) {
                TAKE(part_xs[p][r].scale, float, w / GROUP + 1);
                TAKE(part_xs[p][r].sum, float, w / GROUP + 1);
                TAKE(part_xs[p][r].hi, int8_t, w / 4 + 1);
                TAKE(part_xs[p][r].lo, int8_t, w / 4 + 1);
            }
        TAKE(part_out, float, B * widest_output(m));
    }
    TAKE(qkv, float, B * (q + 2 * kv));
    TAKE(o, float, B * m->hidden);
    TAKE(gate_up, float, B * 2 * m->inter);
    TAKE(scores, float, m->nthreads * m->heads * m->max_context);
    TAKE(partial, float, B * 2 * m->nthreads * part); /* per row: its own keys', the prefix's */
    TAKE(shared, float, m->nthreads * pad16(rf_shared_work_floats(m)));
    TAKE(xb, uint16_t, B * w / 2 + 1);
    TAKE(qb, uint16_t, B * m->heads * q_stride(m) / 2);
    const moe_dims d = moe_sizes(m);
    if (d.experts) {
        const int64_t routed = B * d.top_k, Bs = d.shared_inter ? B : 0, P = routed + Bs;
        const int64_t I = d.inter, SI = d.shared_inter, act = routed * I + Bs * SI;
        if (b) b->routed_slots = routed, b->moe_inter = I, b->moe_shared_inter = SI;
        TAKE(logits, float, B * (d.experts + 1));
        TAKE(route_w, float, B * d.top_k);
        TAKE(gate_w, float, B);
        TAKE(pair_w, float, P);
        TAKE(route_id, int32_t, B * d.top_k);
        TAKE(row_slot, int32_t, B * d.top_k);
        TAKE(pair_row, int32_t, P);
        TAKE(expert_count, int32_t, d.experts);
        TAKE(jobs, moe_job, (d.experts + 1) * (int64_t)(sizeof(moe_job) / sizeof(float)));
        TAKE(moe_state, int64_t, 4);
        TAKE(in_xs, split_x, P * (int64_t)(sizeof(split_x) / sizeof(float)));
        TAKE(act_xs, split_x, P * (int64_t)(sizeof(split_x) / sizeof(float)));
        TAKE(moe_gu, float, 2 * act);
        TAKE(moe_act, float, act);
        TAKE(moe_act_b, uint16_t, act / 2 + 1);
        TAKE(moe_out, float, P * m->hidden);
        if (d.bf16_in) TAKE(moe_in_b, uint16_t, P * m->hidden / 2 + 1);
        else if (b) b->moe_in_b = NULL;
        for (int64_t p = 0; p < P; p++) {
            const int64_t k = p < routed ? I : SI;
            TAKE(act_xs[p].scale, float, k / GROUP + 1);
            TAKE(act_xs[p].sum, float, k / GROUP + 1);
            TAKE(act_xs[p].hi, int8_t, k / 4 + 1);
            TAKE(act_xs[p].lo, int8_t, k / 4 + 1);
        }
    } else if (b) {
        b->moe_state = NULL;
    }
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
static void prepare_input(const rf_model *m, int64_t format, int64_t rows, int64_t k, float *xf,
                          uint16_t *xb, split_x *xs) {
    for (int64_t i = 0; i < k; i++) xb[i] = f32_to_bf16(xf[i]);
    if (m->bf16_inputs)
        for (int64_t i = 0; i < k; i++) xf[i] = bf16_to_f32_1(xb[i]);
    if (format != FORMAT_BF16) rf_split_x(xf, k, split_mode((int)format, rows), xs);
}

static void set_input(const rf_model *m, const rf_weight *w, buffers *b, int64_t r) {
    float *xf = b->xf + r * w->k;
    prepare_input(m, w->format, b->rows, w->k, xf, b->xb + r * w->k, b->xs + r);
    int64_t p = 0; /* a chain's later parts: xf (rounded above) split for each one's format */
    for (const rf_weight *part = w->next; part; part = part->next, p++)
        if (part->format != FORMAT_BF16)
            rf_split_x(xf, w->k, split_mode((int)part->format, b->rows), &b->part_xs[p][r]);
}

/* Row r's residual stream through an RMSNorm into the input of a product with w. */
static void norm_input(const rf_model *m, const float *weight, const rf_weight *w, buffers *b,
                       int64_t r) {
    const int64_t H = m->hidden;
    rms_norm(b->x + r * H, weight, H, m->eps, b->xf + r * H);
    set_input(m, w, b, r);
}

static int64_t tiles_of(const rf_weight *w) { return (w->n + TILE - 1) / TILE; }

/* Tiles [t0, t1) of y = w x for M rows of x: xs split (the integer formats), xb bf16. */
static void product_tiles(const rf_weight *w, const split_x *xs, const uint16_t *xb, int64_t M,
                          float *y, int64_t t0, int64_t t1) {
    if (w->format == FORMAT_Q4_1)
        rf_q4_1_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q8_0)
        rf_q8_0_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q6)
        rf_q6_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q4_K)
        rf_q4_k_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q6_K)
        rf_q6_k_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q5_K)
        rf_q5_k_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q4_0)
        rf_q4_0_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q5_0)
        rf_q5_0_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q5_1)
        rf_q5_1_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q2_K)
        rf_q2_k_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_Q3_K)
        rf_q3_k_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_IQ4_NL)
        rf_iq4_nl_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else if (w->format == FORMAT_IQ4_XS)
        rf_iq4_xs_gemm_tiles(w->data, xs, y, 0, M, w->n, w->k, t0, t1);
    else
        rf_bf16_gemm_tiles(w->data, xb, y, 0, M, w->n, w->k, t0, t1);
}

/* This thread's tiles of y = w x for B rows (y: B rows of w's n, a chain's parts' summed),
 * input readied before (set_input). A chain's tiles are split over the threads as one
 * weight's; a thread's tiles of a part go to that part's rows of part_out, then into their
 * columns of y (every column by the thread that computed it: no barrier between). */
static void gemv_part(const rf_weight *w, const buffers *b, int64_t B, float *y) {
    int64_t t0, t1, tiles = 0, N = 0;
    for (const rf_weight *part = w; part; part = part->next) tiles += tiles_of(part), N += part->n;
    thread_range(tiles, &t0, &t1);
    if (!w->next) {
        product_tiles(w, b->xs, b->xb, B, y, t0, t1);
        return;
    }
    int64_t first = 0, col = 0, p = 0; /* the part's first tile and column */
    for (const rf_weight *part = w; part; part = part->next, p++) {
        const int64_t lo = t0 > first ? t0 - first : 0;
        const int64_t hi = t1 - first < tiles_of(part) ? t1 - first : tiles_of(part);
        if (lo < hi) {
            float *out = b->part_out + col * B; /* [B][part->n] */
            product_tiles(part, p ? b->part_xs[p - 1] : b->xs, b->xb, B, out, lo, hi);
            const int64_t c0 = lo * TILE, c1 = hi * TILE < part->n ? hi * TILE : part->n;
            for (int64_t r = 0; r < B; r++)
                memcpy(y + r * N + col + c0, out + r * part->n + c0, sizeof(float) * (size_t)(c1 - c0));
        }
        first += tiles_of(part), col += part->n;
    }
}

/* ---- mixture of experts ---- */

static int64_t moe_logits(const rf_moe *e) { return e->num_experts + (e->shared_inter > 0); }

/* This thread's share of the router's logits for B rows (and the shared expert's gate's):
 * logits[r][e] = router[e] . xf[r], fp32. */
static void moe_router(const rf_model *m, const rf_moe *e, const buffers *b, int64_t B) {
    const int64_t H = m->hidden, E = moe_logits(e);
    int64_t i0, i1;
    thread_range(E * B, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) { /* expert-major: a thread reads its router rows once */
        const int64_t ex = i / B, r = i % B;
        const float *w = e->router + ex * H, *x = b->xf + r * H;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t k = 0; k < H; k++) s += w[k] * x[k];
        b->logits[r * E + ex] = s;
    }
}

/* Row r's routing, as moe.py's route: a softmax over its experts' logits (fp32), the top_k
 * probabilities (of equal ones the lower index first, as torch.topk), renormalised to sum to 1
 * if asked; and sigmoid of the shared expert's gate. */
static void moe_route(const rf_moe *e, const buffers *b, int64_t r) {
    const int64_t E = e->num_experts, K = e->top_k;
    float *p = b->logits + r * moe_logits(e), mx = -INFINITY, sum = 0, picked = 0;
    for (int64_t i = 0; i < E; i++) mx = p[i] > mx ? p[i] : mx;
    for (int64_t i = 0; i < E; i++) {
        p[i] = expf(p[i] - mx);
        sum += p[i];
    }
    for (int64_t j = 0; j < K; j++) {
        int64_t best = -1;
        for (int64_t i = 0; i < E; i++) /* (a picked one is -1; a NaN is never picked) */
            if (p[i] >= 0 && (best < 0 || p[i] > p[best])) best = i;
        if (best < 0) best = j; /* all NaN: any expert, the output is NaN anyway */
        const float w = p[best] / sum;
        b->route_id[r * K + j] = (int32_t)best;
        b->route_w[r * K + j] = w;
        picked += w;
        p[best] = -1;
    }
    if (e->norm_topk_prob)
        for (int64_t j = 0; j < K; j++) b->route_w[r * K + j] /= picked;
    if (e->shared_inter) b->gate_w[r] = 1.0f / (1.0f + expf(-p[E]));
}

/* (Thread 0.) The B rows' pairs grouped by expert, in expert order, each expert's rows in
 * batch order: a job for each expert that has pairs, then the shared expert's over every row. */
static void moe_group(const rf_model *m, const rf_moe *e, const buffers *b, int64_t B) {
    const int64_t E = e->num_experts, K = e->top_k, H = m->hidden;
    int32_t *cursor = b->expert_count;
    memset(cursor, 0, E * sizeof(int32_t));
    for (int64_t i = 0; i < B * K; i++) cursor[b->route_id[i]]++;
    int64_t jobs = 0, slot = 0, gather = 0;
    for (int64_t x = 0; x < E; x++) {
        if (cursor[x] == 0) continue;
        b->jobs[jobs++] = (moe_job){e->gate_up + x, e->down + x, slot, cursor[x], e->inter,
                                    NULL, NULL, NULL, NULL, NULL};
        slot += cursor[x];
        cursor[x] = (int32_t)(slot - cursor[x]); /* now where its next pair goes */
    }
    for (int64_t r = 0; r < B; r++)
        for (int64_t j = 0; j < K; j++) {
            const int64_t p = cursor[b->route_id[r * K + j]]++;
            b->pair_row[p] = (int32_t)r;
            b->pair_w[p] = b->route_w[r * K + j];
            b->row_slot[r * K + j] = (int32_t)p;
            b->in_xs[p] = b->xs[r];
        }
    if (e->shared_inter) {
        b->jobs[jobs++] = (moe_job){&e->shared_gate_up, &e->shared_down, b->routed_slots, B,
                                    e->shared_inter, NULL, NULL, NULL, NULL, NULL};
        for (int64_t r = 0; r < B; r++) {
            const int64_t p = b->routed_slots + r;
            b->pair_row[p] = (int32_t)r;
            b->pair_w[p] = b->gate_w[r];
            b->in_xs[p] = b->xs[r];
        }
    }
    const int64_t I = b->moe_inter, SI = b->moe_shared_inter;
    for (int64_t j = 0; j < jobs; j++) {
        moe_job *job = b->jobs + j;
        const int64_t at = slot_at(b, job->first, I, SI);
        job->gu = b->moe_gu + 2 * at;
        job->act = b->moe_act + at;
        job->act_b = b->moe_act_b + at;
        job->out = b->moe_out + job->first * H;
        if (job->gate_up->format == FORMAT_BF16) { /* one row reads its xb row in place */
            job->in_b = job->count > 1 ? b->moe_in_b + job->first * H
                                       : b->xb + b->pair_row[job->first] * H;
            gather |= job->count > 1;
        }
    }
    b->moe_state[0] = jobs;
    b->moe_state[1] = gather;
}

/* This thread's share [p0, p1) of all the jobs' pairs, taken side by side. */
static void my_pairs(const buffers *b, int64_t *p0, int64_t *p1) {
    int64_t total = 0;
    for (int64_t j = 0; j < b->moe_state[0]; j++) total += b->jobs[j].count;
    thread_range(total, p0, p1);
}

/* Of those, job j's pairs [*lo, *hi), `at` the pairs of the jobs before it. */
static void job_share(const moe_job *job, int64_t at, int64_t p0, int64_t p1, int64_t *lo,
                      int64_t *hi) {
    *lo = p0 > at ? p0 - at : 0;
    *hi = p1 - at < job->count ? p1 - at : job->count;
}

/* This thread's share of gathering bf16 gate_up inputs of experts with several rows. */
static void moe_gather(const rf_model *m, const buffers *b) {
    const int64_t H = m->hidden;
    int64_t p0, p1, at = 0, lo, hi;
    my_pairs(b, &p0, &p1);
    for (int64_t j = 0; j < b->moe_state[0] && at < p1; at += b->jobs[j++].count) {
        const moe_job *job = b->jobs + j;
        if (job->gate_up->format != FORMAT_BF16 || job->count == 1) continue;
        job_share(job, at, p0, p1, &lo, &hi);
        for (int64_t i = lo; i < hi; i++)
            memcpy(job->in_b + i * H, b->xb + b->pair_row[job->first + i] * H, H * sizeof(uint16_t));
    }
}

/* This thread's tiles of every job's gate_up product (down = 0) or down product (1): the
 * jobs' tiles side by side, split over the threads as one product's are. */
static void moe_products(const buffers *b, int down) {
    const int64_t jobs = b->moe_state[0];
    int64_t total = 0, t0, t1, at = 0;
    for (int64_t j = 0; j < jobs; j++) total += tiles_of(down ? b->jobs[j].down : b->jobs[j].gate_up);
    thread_range(total, &t0, &t1);
    for (int64_t j = 0; j < jobs && at < t1; j++) {
        const moe_job *job = b->jobs + j;
        const rf_weight *w = down ? job->down : job->gate_up;
        const int64_t T = tiles_of(w), lo = t0 > at ? t0 - at : 0, hi = t1 - at < T ? t1 - at : T;
        if (lo < hi) {
            if (down)
                product_tiles(w, b->act_xs + job->first, job->act_b, job->count, job->out, lo, hi);
            else
                product_tiles(w, b->in_xs + job->first, job->in_b, job->count, job->gu, lo, hi);
        }
        at += T;
    }
}

/* This thread's share of the pairs' SiLU(gate) * up, readied as their down products' inputs. */
static void moe_act(const rf_model *m, const buffers *b) {
    int64_t p0, p1, at = 0, lo, hi;
    my_pairs(b, &p0, &p1);
    for (int64_t j = 0; j < b->moe_state[0] && at < p1; at += b->jobs[j++].count) {
        const moe_job *job = b->jobs + j;
        const int64_t n = job->inter;
        job_share(job, at, p0, p1, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            float *act = job->act + i * n;
            silu_mul(job->gu + i * 2 * n, n, act);
            prepare_input(m, job->down->format, job->count, n, act, job->act_b + i * n,
                          b->act_xs + job->first + i);
        }
    }
}

/* Row r's MLP output: its pairs' expert outputs times their weights, summed (fp32). */
static void moe_sum(const rf_model *m, const rf_moe *e, const buffers *b, int64_t r, float *o) {
    const int64_t H = m->hidden, K = e->top_k;
    memset(o, 0, H * sizeof(float));
    for (int64_t j = 0; j <= K; j++) {
        if (j == K && !e->shared_inter) break;
        const int64_t p = j < K ? b->row_slot[r * K + j] : b->routed_slots + r;
        const float w = b->pair_w[p], *y = b->moe_out + p * H;
        for (int64_t i = 0; i < H; i++) o[i] += w * y[i];
    }
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
            /* rows of one request (a verify pass's drafted tokens) never group with each
             * other: each row then attends as the request alone would, bit for bit */
            if (most < least || lead[0] != mine[0] || rows[grp->rows[0]] == rows[r]) continue;
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

/* The first of a row's `len` keys it attends over alone in a layer: the first in the layer's
 * sliding window (a query at position len - 1 sees keys len - 1 - k for k < window, as
 * transformers' masks have it), else (window 0) the first after the prefix its group attends
 * together. */
static int64_t first_key(int64_t window, int64_t len, int64_t prefix) {
    if (window) return len > window ? len - window : 0;
    return prefix;
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

/* x (D values, D a power of two) times the orthonormal Hadamard matrix, Sylvester's order:
 * kernels/kv_int8.py's rotate (an int8 cache stores its keys rotated, and its readers rotate
 * the queries: q . k = (q H) . (k H)). */
static void hadamard(float *x, int64_t D) {
    for (int64_t h = 1; h < D; h *= 2)
        for (int64_t i = 0; i < D; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const float a = x[j], c = x[j + h];
                x[j] = a + c;
                x[j + h] = a - c;
            }
    const float s = 1.0f / sqrtf((float)D);
    for (int64_t i = 0; i < D; i++) x[i] *= s;
}

/* One row's K and V (fp32 [kv_heads][head_dim] each) into the cache at `slot`: bf16, or int8
 * codes and an fp16 scale per KV head, quantized as kernels/kv_int8.py's quantize (scale =
 * amax / 127 rounded to fp16; codes rounded to nearest even with that scale), the keys less
 * the layer's k_offset first. */
static void store_kv(const rf_model *m, const rf_layer *L, int64_t slot, const float *k,
                     const float *v) {
    const int64_t D = m->head_dim, kv_size = m->kv_heads * D;
    if (L->k_cache) {
        for (int64_t i = 0; i < kv_size; i++) {
            L->k_cache[slot * kv_size + i] = f32_to_bf16(k[i]);
            L->v_cache[slot * kv_size + i] = f32_to_bf16(v[i]);
        }
        return;
    }
    float centred[MAX_HEAD_DIM];
    for (int half = 0; half < 2; half++) {
        int8_t *codes = (half ? L->v_codes : L->k_codes) + slot * kv_size;
        uint16_t *scales = (half ? L->v_scales : L->k_scales) + slot * m->kv_heads;
        for (int64_t h = 0; h < m->kv_heads; h++) {
            const float *x = (half ? v : k) + h * D;
            if (!half && L->k_offset) {
                for (int64_t d = 0; d < D; d++) centred[d] = x[d] - L->k_offset[h * D + d];
                x = centred;
            }
            float amax = 0;
            for (int64_t d = 0; d < D; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
            const uint16_t s16 = _cvtss_sh(amax / 127.0f, _MM_FROUND_TO_NEAREST_INT);
            const float s = _cvtsh_ss(s16);
            scales[h] = s16;
            for (int64_t d = 0; d < D; d++) {
                float c = s > 0 ? nearbyintf(x[d] / s) : 0;
                c = c > 127 ? 127 : c < -127 ? -127 : c;
                codes[h * D + d] = (int8_t)c;
            }
        }
    }
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
    b.rows = B;
    const int64_t H = m->hidden, D = m->head_dim, q_size = m->heads * D, kv_size = m->kv_heads * D;
    const int64_t qkv_size = q_size + 2 * kv_size, qs = q_stride(m), part = m->heads * (D + 2);
    spin_barrier bar = {0, 0};
    shared_group groups[MAX_BATCH];
    int64_t prefix[MAX_BATCH];
    const int64_t num_groups = find_groups(m, B, table, table_stride, rows, lens, groups, prefix);
    int64_t longest = 0; /* a window at least this long sees every key: the layer is full */
    for (int64_t r = 0; r < B; r++) longest = lens[r] > longest ? lens[r] : longest;
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
                if (L->k_cache == NULL && (D & (D - 1)) == 0) /* an int8 cache: rotated keys */
                    for (int64_t h = 0; h < m->heads + m->kv_heads; h++) hadamard(qkv + h * D, D);
                uint16_t *qb = b.qb + r * m->heads * qs;
                for (int64_t h = 0; h < m->heads; h++)
                    for (int64_t d = 0; d < qs; d++)
                        qb[h * qs + d] = d < D ? f32_to_bf16(qkv[h * D + d]) : 0;
                store_kv(m, L, out_slots[r], qkv + q_size, qkv + q_size + kv_size);
            }
            SYNC();
            PHASE(PH_ROPE_KV);
            const int64_t window = L->window < longest ? L->window : 0;
            for (int64_t r = 0; r < B; r++) { /* each row's own keys split over the threads */
                const int64_t first = first_key(window, lens[r], prefix[r]);
                int64_t t0, t1;
                thread_range(lens[r] - first, &t0, &t1);
                rf_attend_part(m, L, b.qkv + r * qkv_size, b.qb + r * m->heads * qs,
                               table + rows[r] * table_stride, first + t0, first + t1,
                               b.scores + id * m->heads * m->max_context,
                               b.partial + (r * 2 * threads + id) * part);
            }
            const int64_t layer_groups = window ? 0 : num_groups; /* (windows: alone) */
            for (int64_t g = 0; g < layer_groups; g++) { /* each shared prefix's keys, likewise */
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
                const int64_t parts = prefix[r] && !window ? 2 * threads : threads;
                attend_merge(m, b.partial + r * 2 * threads * part, parts, b.xf + r * L->o.k);
                set_input(m, &L->o, &b, r);
            }
            SYNC();
            PHASE(PH_ATTN);
            MATMUL(&L->o, b.o, PH_O);
            const rf_moe *moe = L->moe;
            for (int64_t r = r0; r < r1; r++) {
                for (int64_t i = r * H; i < (r + 1) * H; i++) b.x[i] += b.o[i];
                norm_input(m, L->ffn_norm, moe ? moe->gate_up : &L->gate_up, &b, r);
            }
            SYNC();
            PHASE(PH_NORM);
            if (moe) { /* route, group the pairs by expert, run the routed experts only */
                moe_router(m, moe, &b, B);
                SYNC();
                for (int64_t r = r0; r < r1; r++) moe_route(moe, &b, r);
                SYNC();
                if (id == 0) moe_group(m, moe, &b, B);
                SYNC();
                if (b.moe_state[1]) {
                    moe_gather(m, &b);
                    SYNC();
                }
                PHASE(PH_ROUTE);
                moe_products(&b, 0);
                SYNC();
                PHASE(PH_MLP_UP);
                moe_act(m, &b);
                SYNC();
                PHASE(PH_ACT);
                moe_products(&b, 1);
                SYNC();
                PHASE(PH_DOWN);
                for (int64_t r = r0; r < r1; r++) moe_sum(m, moe, &b, r, b.o + r * H);
            } else {
                MATMUL(&L->gate_up, b.gate_up, PH_MLP_UP);
                for (int64_t r = r0; r < r1; r++) {
                    silu_mul(b.gate_up + r * 2 * m->inter, m->inter, b.xf + r * L->down.k);
                    set_input(m, &L->down, &b, r);
                }
                SYNC();
                PHASE(PH_ACT);
                MATMUL(&L->down, b.o, PH_DOWN);
            }
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
                              MAX_BATCH, MAX_GROUP, MAX_HEAD_DIM, sizeof(rf_prefill),
                              sizeof(rf_moe), FORMAT_Q6, FORMAT_Q4_K, FORMAT_Q6_K,
                              FORMAT_Q5_K, FORMAT_Q4_0, FORMAT_Q5_0, FORMAT_Q5_1,
                              FORMAT_IQ4_NL, FORMAT_IQ4_XS, FORMAT_Q3_K,
                              FORMAT_Q2_K};
    const int64_t n = sizeof(values) / sizeof(values[0]);
    memcpy(out, values, sizeof(values));
    return n;
}
