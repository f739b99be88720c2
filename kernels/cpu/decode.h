/* The decode step's model description (decode.c) and the vector kernels each instruction-set
 * level implements for it (step_avx512.c, step_avx2.c). */
#ifndef RADIXFLOW_DECODE_H
#define RADIXFLOW_DECODE_H

#include "gemv.h"

#define MAX_GROUP 16    /* query heads per KV head */
#define MAX_BATCH 64    /* requests per step */
#define MAX_HEAD_DIM 512
#define SHARED_CHUNK 64 /* keys per block of a shared prefix's product (rf_attend_shared) */

#define MAX_PARTS 3 /* formats in one product's weight (a fused q/k/v's parts stored apart) */

/* A weight [n][k] in one tiled format; or, where `next` is set, its first n rows, the weight
 * `next` holding the rows after them (a fused layer whose parts are stored in different
 * types, each kept in its own format: at most MAX_PARTS in a chain, every part's n but the
 * last's a multiple of TILE). Only a layer's qkv, o, gate_up and down may be chains. */
typedef struct rf_weight {
    int64_t format, n, k;
    const uint8_t *data;
    const struct rf_weight *next;
} rf_weight;

/* A mixture-of-experts layer's MLP (decode.c's moe_*): each row's router logits (fp32), a
 * softmax over the experts, its top_k (renormalised to sum to 1 if norm_topk_prob); the rows
 * grouped by expert, and each expert that has rows run over just those (only the routed
 * experts' weights are read); out = sum of the weights times their experts' outputs, plus
 * sigmoid(shared gate . x) times the shared expert's (Qwen2-MoE) where shared_inter > 0. */
typedef struct {
    int64_t num_experts, top_k, norm_topk_prob;
    int64_t inter, shared_inter;  /* each routed expert's; the shared expert's, 0: none */
    const float *router;          /* fp32 [num_experts + (shared_inter > 0)][hidden]: the
                                     router's rows, then the shared expert's gate */
    const rf_weight *gate_up, *down; /* [num_experts] each; gate rows, then up rows. Every
                                        gate_up (the shared one's too) in one format */
    rf_weight shared_gate_up, shared_down;
} rf_moe;

typedef struct {
    const float *attn_norm, *ffn_norm; /* [hidden] */
    const float *q_norm, *k_norm;      /* [head_dim], or NULL (Qwen3 has them) */
    const float *qkv_bias;             /* [q + 2 kv], or NULL (Qwen2 has it) */
    rf_weight qkv, o, gate_up, down;   /* (gate_up, down unused in a MoE layer) */
    uint16_t *k_cache, *v_cache; /* bf16 [slots][kv_heads][head_dim]; NULL: an int8 cache */
    const rf_moe *moe;           /* NULL: a dense MLP (gate_up, down) */
    int64_t window; /* a sliding window: a row of len keys attends keys max(0, len - window) ..
                       len - 1, alone (no shared prefix) unless the window holds every row's
                       keys; 0: all of them */
    /* An int8 cache (kernels/kv_int8.py, set where k_cache is NULL): per slot and KV head,
     * head_dim codes [slots][kv_heads][head_dim] and their fp16 scale [slots][kv_heads]. The
     * step writes its K/V quantized (store_kv; keys and queries rotated first where head_dim
     * is a power of two, kernels/kv_int8.py's rotate); attention dequantizes each block of keys into
     * scratch as it reads it (kv_slice, KV_SLICES) at avx512, as bf16 values; avx2 widens the
     * codes to fp32 as it loads them (widen16: exact, the scales folded into the scores and
     * weights) for one request, and into fp32 values for a shared prefix and prefill. */
    int8_t *k_codes, *v_codes;
    uint16_t *k_scales, *v_scales;
    const float *k_offset; /* an int8 cache's: fp32 [kv_heads][head_dim], subtracted from each
                              (rotated) key before it is quantized (kernels/kv_int8.py's
                              key_offset; attention is unchanged by it) */
} rf_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_context, nthreads,
        max_batch;
    int64_t bf16_inputs; /* 1: a bf16 model (its products' inputs rounded to bf16), 0: fp32 */
    int64_t min_shared_prefix; /* requests sharing at least this many leading KV slots attend
                                  over them together (rf_attend_shared); 0: never */
    float eps, scale;
    const rf_layer *layers;
    const float *final_norm;
    rf_weight head;
    float *scratch; /* rf_decode_scratch_floats(model) floats */
    double *profile; /* NULL, or PROFILE_PHASES seconds that each step adds to (thread 0) */
    int64_t profile_cpu_time; /* 1: the profile counts thread 0's CPU time (its waits at the
                                 barriers spin, so they count too), 0: wall time */
} rf_model;

/* What thread 0 spent where, barrier waits included: the profile's slots. */
enum { PH_NORM, PH_QKV, PH_ROPE_KV, PH_ATTN, PH_O, PH_MLP_UP, PH_ACT, PH_DOWN, PH_HEAD,
       PH_ROUTE, PROFILE_PHASES };

/* bf16 values per query head in the step's bf16 queries: head_dim padded to whole 32-value
 * chunks. */
static inline int64_t q_stride(const rf_model *m) { return (m->head_dim + 31) / 32 * 32; }

/* This thread's keys [t0, t1) of one request for every head: per head h, partial[h * (D + 2)]
 * holds its max score, then its sum of exp(score - max), then its exp-weighted V sum (D
 * values). q: the request's queries, fp32 [heads][D]; qb: the same as bf16 [heads][q_stride];
 * slots: its KV slots; scores: room for heads * max_context floats. */
void rf_attend_part(const rf_model *m, const rf_layer *L, const float *q, const uint16_t *qb,
                    const int32_t *slots, int64_t t0, int64_t t1, float *scores, float *partial);

/* Queries per KV head that rf_attend_shared's buffers hold: max_batch requests x the heads of a
 * group, padded to 16. */
static inline int64_t shared_queries(const rf_model *m) {
    return (m->max_batch * (m->heads / m->kv_heads) + 15) / 16 * 16;
}

/* This thread's keys [t0, t1) of a prefix that n requests share (slots: the prefix's KV slots,
 * the same in each of their rows), for every head of all n at once: per KV head, the n x group
 * queries against each block of SHARED_CHUNK keys as one matrix product, then the values, so
 * that each key and value read feeds every query (FlashInfer's cascade). partial[i] gets
 * request i's partial softmax as rf_attend_part writes it; q[i], qb[i] are its queries (fp32,
 * bf16) as there. work: rf_shared_work_floats(m) floats of this thread's own. */
void rf_attend_shared(const rf_model *m, const rf_layer *L, int64_t n, const float *const *q,
                      const uint16_t *const *qb, const int32_t *slots, int64_t t0, int64_t t1,
                      float *work, float *const *partial);
int64_t rf_shared_work_floats(const rf_model *m);

/* One request's attention for n new tokens at positions prefix .. prefix + n - 1, each over
 * the keys at positions 0 .. its own (causal): q and out [n][heads][head_dim] (rows q_stride /
 * out_stride values apart) in the level's model dtype, bf16 at avx512 (vdpbf16ps), fp32 at
 * avx2; K/V in the pool's layout (bf16 [slots][kv_heads][head_dim]; or, where k is NULL, int8
 * codes and fp16 scales as rf_layer's) at slots[0 .. prefix + n). */
typedef struct {
    int64_t n, prefix, heads, kv_heads, head_dim, q_stride, out_stride, nthreads;
    float scale;
    const void *q;
    const uint16_t *k, *v;
    const int64_t *slots;
    void *out;
    const int8_t *k_codes, *v_codes;
    const uint16_t *k_scales, *v_scales;
} rf_prefill;

/* The fp16 scale of KV head kvh of the slot at `slot` (an int8 cache). */
static inline float kv_scale(const uint16_t *scales, int64_t slot, int64_t kv_heads,
                             int64_t kvh) {
    return _cvtsh_ss(scales[slot * kv_heads + kvh]);
}

/* 0, or -1 for a shape it does not take (head_dim not a multiple of
 * rf_prefill_dim_multiple() or over MAX_HEAD_DIM; a group over MAX_GROUP), -2 when its work
 * buffers could not be allocated. decode.c splits the request into tiles of tokens x KV heads
 * over OpenMP threads; each level's step file computes a tile (rf_prefill_tile). */
int64_t rf_prefill_attention(const rf_prefill *job);

/* The level's tile: queries (tokens x the heads of a group) at most, what head_dim must be a
 * multiple of, the floats of one thread's work, and tokens [t0, t1) for KV head kvh. */
int64_t rf_prefill_tile_queries(void);
int64_t rf_prefill_dim_multiple(void);
int64_t rf_prefill_work_floats(int64_t head_dim);
void rf_prefill_tile(const rf_prefill *job, int64_t kvh, int64_t t0, int64_t t1, float *work);

/* out[i] = silu(x[i]) (fp32). */
void rf_silu(const float *x, int64_t n, float *out);

void rf_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t *out);

/* rows.c: an extend batch's per-token vector work on contiguous rows of the model's dtype
 * (bf16 != 0: bf16, else fp32), rounded as the torch model rounds (see rows.c).
 * x += delta (unless delta is NULL), then out = RMSNorm(x) * weight; x, delta, out [rows][n]. */
void rf_rows_add_rms_norm(void *x, const void *delta, const void *weight, void *out,
                          int64_t rows, int64_t n, float eps, int64_t bf16, int64_t nthreads);
/* In place, the first `heads` heads of each row of x (rows row_stride values apart):
 * x cos + roll(x, head_dim / 2) signed_sin, cos and signed_sin [rows][head_dim] (rope.py);
 * head_dim <= MAX_HEAD_DIM. */
void rf_rows_rope(void *x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_dim,
                  const void *cos, const void *signed_sin, int64_t bf16, int64_t nthreads);
/* out [rows][n] = silu(gate) * up, gate_up [rows][2n] (gate first). */
void rf_rows_silu_mul(const void *gate_up, void *out, int64_t rows, int64_t n, int64_t bf16,
                      int64_t nthreads);

#endif
