/* A GGUF tensor's blocks straight into a tiled format (the same source in every level's build):
 * rf_repack writes the bytes kernels/cpu/__init__.py's tile_* functions write from the group
 * forms of kernels/gguf_blocks.py (affine_groups, symmetric_6bit_groups, symmetric_int8_groups),
 * bit for bit, without the torch detour (int8/float32 tensors of the whole chunk, permutes,
 * concatenations): loading a 1B Q4_K_M spent ~4 s there.
 *
 *   Q4_K       -> q4_k   as stored: d, dmin, the six-bit scales and mins, the nibbles
 *   Q5_K       -> q5_k   as stored: q4_k's fields and the fifth bits
 *   Q4_0       -> q4_0   as stored: d, the nibbles
 *   Q5_0, Q5_1 -> q5_0, q5_1 as stored: d (Q5_1: m), the nibbles, the fifth bits
 *   Q4_1       -> q4_1   as stored: d, m, the nibbles
 *   IQ4_NL     -> iq4_nl as stored: d, the nibbles (indices into IQ4_VALUES)
 *   IQ4_XS     -> iq4_xs as stored: d, each group's ls - 32 as int8, the nibbles
 *   Q4_K, Q4_0 -> q4_1   fp16 scale d * sc (Q4_0: d) and low -(dmin * m) (Q4_0: d * -8)
 *   Q6_K       -> q6_k   as stored: d, the int8 scales, the 6-bit values
 *   Q3_K       -> q3_k   as stored: d, the six-bit scales as int8 (sc - 32), the 3-bit values
 *   Q2_K       -> q2_k   as stored: d, dmin, the scale bytes, the 2-bit values
 *   Q6_K       -> q6     the stored 6-bit value, fp16 scale d * sc per 16
 *   Q8_0       -> q8_0   the int8 values, fp32 scale d
 *
 * Tiles are split over threads; each thread unpacks a tile's 16 rows into scratch, then writes
 * the tile's groups. Rows past `rows` in the last tile are zeros (tile_*'s padding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemv.h"

/* scalar products and roundings must be torch's: no fused multiply-adds */
#ifdef __clang__
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13,
       GGML_Q6_K = 14, GGML_IQ4_NL = 20, GGML_IQ4_XS = 23 };

static inline float bits_f32(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t w; memcpy(&w, &f, 4); return w; }

/* IEEE fp16 <-> fp32, exact / round to nearest even, as torch converts (FP16 library's forms) */
static inline float half_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    const float normalized = bits_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = bits_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    return bits_f32(sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized)));
}

static inline uint16_t f32_to_half(float f) {
    float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    const uint32_t w = f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = bits_f32((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_bits(base);
    const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline uint16_t load_half(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

/* One row of blocks -> q [K] (the format's stored values), scales and lows per group. */
static void unpack_q4_k(const uint8_t *b, int64_t K, uint8_t *q, float *scale, float *low) {
    for (int64_t blk = 0; blk < K / 256; blk++, b += 144) {
        const float d = half_to_f32(load_half(b)), dmin = half_to_f32(load_half(b + 2));
        const uint8_t *s = b + 4, *qs = b + 16;
        for (int j = 0; j < 8; j++) {
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            scale[blk * 8 + j] = d * (float)sc;
            low[blk * 8 + j] = -(dmin * (float)m);
        }
        uint8_t *out = q + blk * 256;
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                out[64 * j + l] = qs[32 * j + l] & 0xF;
                out[64 * j + 32 + l] = qs[32 * j + l] >> 4;
            }
    }
}

static void unpack_q4_0(const uint8_t *b, int64_t K, uint8_t *q, float *scale, float *low) {
    for (int64_t g = 0; g < K / 32; g++, b += 18) {
        const float d = half_to_f32(load_half(b));
        scale[g] = d, low[g] = d * -8.0f;
        for (int j = 0; j < 16; j++) q[32 * g + j] = b[2 + j] & 0xF, q[32 * g + 16 + j] = b[2 + j] >> 4;
    }
}

/* q: the unsigned 6-bit value (q + 32); scale per 16 */
static void unpack_q6_k(const uint8_t *b, int64_t K, uint8_t *q, float *scale) {
    for (int64_t blk = 0; blk < K / 256; blk++, b += 210) {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = half_to_f32(load_half(b + 208));
        for (int s = 0; s < 16; s++) scale[blk * 16 + s] = d * (float)sc[s];
        uint8_t *out = q + blk * 256;
        for (int n = 0; n < 2; n++, ql += 64, qh += 32, out += 128)
            for (int l = 0; l < 32; l++) {
                out[l] = (uint8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
                out[l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
                out[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                out[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
    }
}

static void unpack_q8_0(const uint8_t *b, int64_t K, uint8_t *q, float *scale) {
    for (int64_t g = 0; g < K / 32; g++, b += 34) {
        scale[g] = half_to_f32(load_half(b));
        memcpy(q + 32 * g, b + 2, 32);
    }
}

/* One (tile, group)'s bytes from the tile's unpacked rows (q [TILE][K], s/lo [TILE][per row]). */
static void write_q4_1(uint8_t *o, const uint8_t *q, const float *s, const float *lo, int64_t K,
                       int64_t g) {
    const int64_t G = K / GROUP;
    uint16_t *hs = (uint16_t *)o, *hl = (uint16_t *)(o + 32);
    for (int r = 0; r < TILE; r++) hs[r] = f32_to_half(s[r * G + g]), hl[r] = f32_to_half(lo[r * G + g]);
    uint8_t *nib = o + 64;
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < TILE; r++) {
            const uint8_t *row = q + r * K + g * GROUP + 8 * c;
            for (int i = 0; i < 4; i++) nib[(c * TILE + r) * 4 + i] = (uint8_t)(row[i] | (row[4 + i] << 4));
        }
}

/* Row r's 32 values of a group of GGUF's 4-bit layout (qs: 16 bytes, column l < 16 qs[l]'s low
 * nibble, column 16 + l its high one) as q4_1 holds nibbles: chunk c's byte 4 r + i holds
 * columns 8 c + i (low nibble) and 8 c + 4 + i (high). */
static void regroup_nibbles(uint8_t *nib, const uint8_t *qs, int r) {
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 4; i++) {
            const int lo = 8 * c + i, hi = 8 * c + 4 + i;
            const int v_lo = lo < 16 ? qs[lo] & 15 : qs[lo - 16] >> 4;
            const int v_hi = hi < 16 ? qs[hi] & 15 : qs[hi - 16] >> 4;
            nib[(c * TILE + r) * 4 + i] = (uint8_t)(v_lo | (v_hi << 4));
        }
}

/* One (tile, group) of Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL rows (raw: the tile's first row,
 * row_bytes apart; `live` of them) as q4_0 / q4_1 / q5_0 / q5_1 / iq4_nl: each row's d (and
 * m) moved, its nibbles regrouped as q4_1 holds them and its fifth bits as q5_k holds them, no
 * arithmetic. */
static void write_group_as_stored(int src, uint8_t *o, const uint8_t *raw, int64_t row_bytes,
                                  int live, int64_t g) {
    const int five = src == GGML_Q5_0 || src == GGML_Q5_1;
    const int with_m = src == GGML_Q4_1 || src == GGML_Q5_1;
    const int64_t block = src == GGML_Q5_0 ? 22 : src == GGML_Q5_1 ? 24 : src == GGML_Q4_1 ? 20 : 18;
    const int header = with_m ? 64 : 32;
    memset(o, 0, (size_t)(header + 256 + (five ? 64 : 0)));
    uint8_t *nib = o + header, *fifth = nib + 256;
    for (int r = 0; r < live; r++) {
        const uint8_t *b = raw + r * row_bytes + g * block;
        const uint8_t *qs = b + (src == GGML_Q5_0 ? 6 : src == GGML_Q5_1 ? 8 : with_m ? 4 : 2);
        uint32_t qh = 0; /* Q5_*: bit l is column l's fifth bit */
        if (five) memcpy(&qh, b + (src == GGML_Q5_0 ? 2 : 4), 4);
        memcpy(o + 2 * r, b, 2);
        if (with_m) memcpy(o + 32 + 2 * r, b + 2, 2);
        regroup_nibbles(nib, qs, r);
        if (five) /* (q4_0 has no fifth bits: those bytes are the next group's) */
            for (int c = 0; c < 4; c++)
                for (int i = 0; i < 4; i++) {
                    const int lo = 8 * c + i, hi = 8 * c + 4 + i;
                    fifth[4 * r + i] |= (uint8_t)((((qh >> lo) & 1) << (2 * c)) |
                                                  (((qh >> hi) & 1) << (2 * c + 1)));
                }
    }
}

/* One tile of IQ4_XS rows [16 t, 16 t + 16) (those at or past `rows` zeros) as iq4_xs: per
 * super-block each row's d moved, each group's six-bit ls as the int8 ls - 32, the nibbles
 * regrouped (sub-block j: qs[16 j ..], GGUF's 4-bit layout), no arithmetic. */
static void write_iq4_xs_tile(uint8_t *o, const uint8_t *raw, int64_t rows, int64_t K, int64_t t) {
    const int64_t row_bytes = K / 256 * 136;
    memset(o, 0, (size_t)(K / 256 * IQ4_XS_BLOCK));
    for (int r = 0; r < TILE && t * TILE + r < rows; r++) {
        const uint8_t *b = raw + (t * TILE + r) * row_bytes;
        for (int64_t sb = 0; sb < K / 256; sb++, b += 136) {
            uint8_t *h = o + sb * IQ4_XS_BLOCK;
            const int scales_h = b[2] | (b[3] << 8);
            memcpy(h + 2 * r, b, 2);
            for (int j = 0; j < 8; j++) {
                const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((scales_h >> (2 * j)) & 3) << 4);
                h[32 + 16 * j + r] = (uint8_t)(int8_t)(ls - 32);
                regroup_nibbles(h + 160 + 256 * j, b + 8 + 16 * j, r);
            }
        }
    }
}

/* Group g's 6-bit values (q + 32 in q's rows) as q6 and q6_k hold them: 256 bytes of low
 * nibbles, then 128 of high bit pairs. */
/* One row of Q3_K blocks -> q + 4 [K] (0..7): w[128 n + 32 j + l]'s low two bits are bits 2j,
 * 2j + 1 of qs[32 n + l], its third bit (set: q + 4 >= 4) bit 4 n + j of hmask[l]. */
static void unpack_q3_k(const uint8_t *b, int64_t K, uint8_t *q) {
    for (int64_t blk = 0; blk < K / 256; blk++, b += 110) {
        const uint8_t *hmask = b, *qs = b + 32;
        uint8_t *out = q + blk * 256;
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    out[128 * n + 32 * j + l] = (uint8_t)(((qs[32 * n + l] >> (2 * j)) & 3) |
                                                          (((hmask[l] >> (4 * n + j)) & 1) << 2));
    }
}

/* q3_k's headers of tile t from its Q3_K rows: per super-block d and each row's 16 six-bit
 * scales minus 32, as int8 (rows at or past `rows`: zeros). */
static void write_q3_k_headers(uint8_t *o, const uint8_t *raw, int64_t rows, int64_t K, int64_t t) {
    const int64_t row_bytes = K / 256 * 110;
    for (int64_t sb = 0; sb < K / 256; sb++) memset(o + sb * Q3_K_BLOCK, 0, 288);
    for (int r = 0; r < TILE && t * TILE + r < rows; r++) {
        const uint8_t *b = raw + (t * TILE + r) * row_bytes;
        for (int64_t sb = 0; sb < K / 256; sb++, b += 110) {
            uint8_t *h = o + sb * Q3_K_BLOCK;
            const uint8_t *s = b + 96;
            memcpy(h + 2 * r, b + 108, 2);
            for (int i = 0; i < 16; i++) {
                const int low = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
                const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
                h[32 + 16 * i + r] = (uint8_t)(int8_t)((low | (high << 4)) - 32);
            }
        }
    }
}

/* One tile of Q2_K rows [16 t, 16 t + 16) (those at or past `rows` zeros) as q2_k: per
 * super-block each row's d, dmin and scale bytes moved, its 2-bit values regrouped (group j's
 * column c: bits 2 (j % 4) of qs[32 (j / 4) + c]), no arithmetic. */
static void write_q2_k_tile(uint8_t *o, const uint8_t *raw, int64_t rows, int64_t K, int64_t t) {
    const int64_t row_bytes = K / 256 * 84;
    memset(o, 0, (size_t)(K / 256 * Q2_K_BLOCK));
    for (int r = 0; r < TILE && t * TILE + r < rows; r++) {
        const uint8_t *b = raw + (t * TILE + r) * row_bytes;
        for (int64_t sb = 0; sb < K / 256; sb++, b += 84) {
            uint8_t *h = o + sb * Q2_K_BLOCK;
            const uint8_t *qs = b + 16;
            memcpy(h + 2 * r, b + 80, 2), memcpy(h + 32 + 2 * r, b + 82, 2);
            for (int s = 0; s < 16; s++) h[64 + 16 * s + r] = b[s];
            for (int j = 0; j < 8; j++) {
                uint8_t *pairs = h + 320 + 128 * j;
                for (int c = 0; c < GROUP; c++) {
                    const int q = (qs[32 * (j / 4) + c] >> (2 * (j % 4))) & 3;
                    pairs[((c / 16) * TILE + r) * 4 + c % 4] |= (uint8_t)(q << (2 * ((c % 16) / 4)));
                }
            }
        }
    }
}

/* Group g's q + 4 (0..7, in q's rows) as q3_k holds them: the low bit pairs as q6's high ones
 * (128 bytes), then the third bits (64 bytes: bit p of byte 4 r + i, column 4 p + i's). */
static void write_q3_bits(uint8_t *pairs, const uint8_t *q, int64_t K, int64_t g) {
    uint8_t *third = pairs + 128;
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < TILE; r++) {
            const uint8_t *row = q + r * K + g * GROUP + 16 * h;
            for (int i = 0; i < 4; i++) {
                uint8_t v = 0;
                for (int j = 0; j < 4; j++) v |= (uint8_t)((row[4 * j + i] & 3) << (2 * j));
                pairs[(h * TILE + r) * 4 + i] = v;
            }
        }
    for (int r = 0; r < TILE; r++) {
        const uint8_t *row = q + r * K + g * GROUP;
        for (int i = 0; i < 4; i++) {
            uint8_t v = 0;
            for (int p = 0; p < 8; p++) v |= (uint8_t)((row[4 * p + i] >> 2) << p);
            third[4 * r + i] = v;
        }
    }
}

static void write_q6_bits(uint8_t *nib, const uint8_t *q, int64_t K, int64_t g) {
    uint8_t *twos = nib + 256;
    for (int c = 0; c < 4; c++)
        for (int r = 0; r < TILE; r++) {
            const uint8_t *row = q + r * K + g * GROUP + 8 * c;
            for (int i = 0; i < 4; i++)
                nib[(c * TILE + r) * 4 + i] = (uint8_t)((row[i] & 15) | ((row[4 + i] & 15) << 4));
        }
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < TILE; r++) {
            const uint8_t *row = q + r * K + g * GROUP + 16 * h;
            for (int i = 0; i < 4; i++) {
                uint8_t v = 0;
                for (int j = 0; j < 4; j++) v |= (uint8_t)((row[4 * j + i] >> 4) << (2 * j));
                twos[(h * TILE + r) * 4 + i] = v;
            }
        }
}

static int64_t write_q6(uint8_t *o, const uint8_t *q, const float *s, int64_t K, int64_t g) {
    const int64_t S = K / 16;
    int64_t over = 0;
    uint16_t *d = (uint16_t *)o;
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < TILE; r++) {
            const float v = s[r * S + 2 * g + h];
            over += !(__builtin_fabsf(v) <= 65504.0f);
            d[h * TILE + r] = f32_to_half(v);
        }
    write_q6_bits(o + 64, q, K, g);
    return over;
}

/* q6_k's headers of tile t from its Q6_K rows: per super-block d and the 16 int8 scales of each
 * row, moved (rows at or past `rows`: zeros). */
static void write_q6_k_headers(uint8_t *o, const uint8_t *raw, int64_t rows, int64_t K, int64_t t) {
    const int64_t row_bytes = K / 256 * 210;
    for (int64_t sb = 0; sb < K / 256; sb++) memset(o + sb * Q6_K_BLOCK, 0, 288);
    for (int r = 0; r < TILE && t * TILE + r < rows; r++) {
        const uint8_t *b = raw + (t * TILE + r) * row_bytes;
        for (int64_t sb = 0; sb < K / 256; sb++, b += 210) {
            uint8_t *h = o + sb * Q6_K_BLOCK;
            memcpy(h + 2 * r, b + 208, 2);
            for (int s = 0; s < 16; s++) h[32 + 16 * s + r] = b[192 + s];
        }
    }
}

static void write_q8_0(uint8_t *o, const uint8_t *q, const float *s, int64_t K, int64_t g) {
    const int64_t G = K / GROUP;
    float *scale = (float *)o;
    for (int r = 0; r < TILE; r++) scale[r] = s[r * G + g];
    uint8_t *qo = o + 64;
    for (int quad = 0; quad < 8; quad++)
        for (int r = 0; r < TILE; r++) memcpy(qo + (quad * TILE + r) * 4, q + r * K + g * GROUP + 4 * quad, 4);
}

/* One tile of Q4_K (Q5_K) rows [16 t, 16 t + 16) (those at or past `rows` zeros) as q4_k
 * (q5_k): per super-block the header's fields moved row by row and the nibbles (and fifth
 * bits) regrouped, no arithmetic. */
static void write_k_tile(int fmt, uint8_t *o, const uint8_t *raw, int64_t rows, int64_t K,
                         int64_t t) {
    const int five = fmt == FORMAT_Q5_K;
    const int64_t block = five ? 176 : 144, row_bytes = K / 256 * block;
    memset(o, 0, (size_t)(K / 256 * k_block_bytes(fmt)));
    for (int r = 0; r < TILE && t * TILE + r < rows; r++) {
        const uint8_t *b = raw + (t * TILE + r) * row_bytes;
        for (int64_t sb = 0; sb < K / 256; sb++, b += block) {
            uint8_t *h = o + sb * k_block_bytes(fmt);
            const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
            memcpy(h + 2 * r, b, 2), memcpy(h + 32 + 2 * r, b + 2, 2);
            for (int j = 0; j < 8; j++) {
                const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
                const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                const int nib_shift = 4 * (j & 1), two_shift = 2 * (j & 3);
                h[64 + 16 * (j >> 1) + r] |= (uint8_t)((sc & 15) << nib_shift);
                h[128 + 16 * (j >> 1) + r] |= (uint8_t)((m & 15) << nib_shift);
                h[192 + 16 * (j >> 2) + r] |= (uint8_t)((sc >> 4) << two_shift);
                h[224 + 16 * (j >> 2) + r] |= (uint8_t)((m >> 4) << two_shift);
            }
            /* sub-block j = 2c + n holds qs[32c + l] >> 4n, l < 32; its chunk cc, byte 4r + i:
             * columns 8cc + i (low nibble) and 8cc + 4 + i (high) */
            for (int j = 0; j < 8; j++) {
                const uint8_t *src = qs + 32 * (j >> 1);
                const int shift = 4 * (j & 1);
                uint8_t *nib = h + 256 + k_group_bytes(fmt) * j, *fifth = nib + 256;
                for (int cc = 0; cc < 4; cc++)
                    for (int i = 0; i < 4; i++) {
                        nib[(cc * TILE + r) * 4 + i] =
                            (uint8_t)(((src[8 * cc + i] >> shift) & 15) |
                                      (((src[8 * cc + 4 + i] >> shift) & 15) << 4));
                        if (five) /* Q5_K: column l's fifth bit is bit j of qh[l] */
                            fifth[4 * r + i] |= (uint8_t)((((qh[8 * cc + i] >> j) & 1) << (2 * cc)) |
                                                          (((qh[8 * cc + 4 + i] >> j) & 1) << (2 * cc + 1)));
                    }
            }
        }
    }
}

static int64_t block_bytes(int src) {
    switch (src) {
    case GGML_Q4_0: return 18;
    case GGML_Q5_0: return 22;
    case GGML_Q4_1: return 20;
    case GGML_Q5_1: return 24;
    case GGML_Q8_0: return 34;
    case GGML_Q4_K: return 144;
    case GGML_Q5_K: return 176;
    case GGML_Q6_K: return 210;
    case GGML_Q3_K: return 110;
    case GGML_Q2_K: return 84;
    case GGML_IQ4_NL: return 18;
    case GGML_IQ4_XS: return 136;
    default: return 0;
    }
}

static int64_t group_bytes(int fmt) {
    return fmt == FORMAT_Q4_1 ? 320 : fmt == FORMAT_Q4_0 ? Q4_0_BLOCK
         : fmt == FORMAT_Q5_0 ? Q5_0_BLOCK : fmt == FORMAT_Q5_1 ? Q5_1_BLOCK
         : fmt == FORMAT_Q6 ? 448 : fmt == FORMAT_Q8_0 ? 576
         : fmt == FORMAT_Q4_K ? Q4_K_GROUP : fmt == FORMAT_Q6_K ? Q6_K_GROUP
         : fmt == FORMAT_Q5_K ? Q5_K_GROUP : fmt == FORMAT_IQ4_NL ? Q4_0_BLOCK
         : fmt == FORMAT_IQ4_XS ? IQ4_XS_GROUP : fmt == FORMAT_Q3_K ? Q3_K_GROUP
         : fmt == FORMAT_Q2_K ? Q2_K_GROUP : 0;
}

static int pair_ok(int src, int fmt) {
    return ((src == GGML_Q4_K || src == GGML_Q4_0) && fmt == FORMAT_Q4_1) ||
           (src == GGML_Q4_0 && fmt == FORMAT_Q4_0) || (src == GGML_Q5_0 && fmt == FORMAT_Q5_0) ||
           (src == GGML_Q5_1 && fmt == FORMAT_Q5_1) || (src == GGML_Q4_1 && fmt == FORMAT_Q4_1) ||
           (src == GGML_Q4_K && fmt == FORMAT_Q4_K) || (src == GGML_Q5_K && fmt == FORMAT_Q5_K) ||
           (src == GGML_Q6_K && (fmt == FORMAT_Q6 || fmt == FORMAT_Q6_K)) ||
           (src == GGML_Q8_0 && fmt == FORMAT_Q8_0) ||
           (src == GGML_IQ4_NL && fmt == FORMAT_IQ4_NL) || (src == GGML_IQ4_XS && fmt == FORMAT_IQ4_XS) ||
           (src == GGML_Q3_K && fmt == FORMAT_Q3_K) || (src == GGML_Q2_K && fmt == FORMAT_Q2_K);
}

/* raw: `rows` rows of K / (values per block) blocks of GGML type `src`; out: ceil(rows / TILE)
 * tiles of format `fmt`. Returns the number of q6 scales over fp16's range (the caller refuses
 * the layer then), -1 for a pair of types it does not convert / K not whole blocks, -2 when
 * scratch memory could not be had. */
int64_t rf_repack(int src, int fmt, const uint8_t *raw, int64_t rows, int64_t K, uint8_t *out,
                  int nthreads) {
    const int64_t per_block = src == GGML_Q4_0 || src == GGML_Q4_1 || src == GGML_Q5_0 || src == GGML_Q5_1 ||
                              src == GGML_Q8_0 || src == GGML_IQ4_NL ? 32 : 256;
    if (!pair_ok(src, fmt) || K <= 0 || K % per_block) return -1;
    const int64_t row_bytes = K / per_block * block_bytes(src), G = K / GROUP;
    const int64_t tiles = (rows + TILE - 1) / TILE, tile_bytes = G * group_bytes(fmt);
    const int64_t per_row = src == GGML_Q6_K ? K / 16 : G;
    int64_t over = 0, failed = 0;
    if (nthreads > tiles) nthreads = (int)(tiles > 0 ? tiles : 1);
    if (is_group_affine(fmt) && (fmt != FORMAT_Q4_1 || src == GGML_Q4_1)) { /* as stored */
#pragma omp parallel num_threads(nthreads)
        {
            int64_t t0, t1;
            thread_range(tiles, &t0, &t1);
            for (int64_t t = t0; t < t1; t++) {
                const int live = rows - t * TILE < TILE ? (int)(rows - t * TILE) : TILE;
                for (int64_t g = 0; g < G; g++)
                    write_group_as_stored(src, out + t * tile_bytes + g * group_bytes(fmt),
                                          raw + t * TILE * row_bytes, row_bytes, live, g);
            }
        }
        return 0;
    }
    if (is_k_affine(fmt) || fmt == FORMAT_Q2_K) {
#pragma omp parallel num_threads(nthreads)
        {
            int64_t t0, t1;
            thread_range(tiles, &t0, &t1);
            for (int64_t t = t0; t < t1; t++) {
                if (fmt == FORMAT_IQ4_XS) write_iq4_xs_tile(out + t * tile_bytes, raw, rows, K, t);
                else if (fmt == FORMAT_Q2_K) write_q2_k_tile(out + t * tile_bytes, raw, rows, K, t);
                else write_k_tile(fmt, out + t * tile_bytes, raw, rows, K, t);
            }
        }
        return 0;
    }
#pragma omp parallel num_threads(nthreads) reduction(+ : over, failed)
    {
        uint8_t *q = malloc((size_t)(TILE * K));
        float *s = malloc(sizeof(float) * (size_t)(TILE * per_row));
        float *lo = malloc(sizeof(float) * (size_t)(TILE * per_row));
        int64_t t0, t1;
        thread_range(tiles, &t0, &t1);
        failed += t0 < t1 && !(q && s && lo);
        for (int64_t t = t0; t < t1 && q && s && lo; t++) {
            for (int r = 0; r < TILE; r++) {
                const int64_t row = t * TILE + r;
                uint8_t *qr = q + r * K;
                float *sr = s + r * per_row, *lr = lo + r * per_row;
                if (row >= rows) {
                    memset(qr, 0, (size_t)K);
                    memset(sr, 0, sizeof(float) * (size_t)per_row);
                    memset(lr, 0, sizeof(float) * (size_t)per_row);
                    continue;
                }
                const uint8_t *b = raw + row * row_bytes;
                if (src == GGML_Q4_K) unpack_q4_k(b, K, qr, sr, lr);
                else if (src == GGML_Q4_0) unpack_q4_0(b, K, qr, sr, lr);
                else if (src == GGML_Q6_K) unpack_q6_k(b, K, qr, sr);
                else if (src == GGML_Q3_K) unpack_q3_k(b, K, qr);
                else unpack_q8_0(b, K, qr, sr);
            }
            uint8_t *o = out + t * tile_bytes;
            if (fmt == FORMAT_Q3_K) {
                write_q3_k_headers(o, raw, rows, K, t);
                for (int64_t g = 0; g < G; g++) write_q3_bits((uint8_t *)q6_bits(fmt, o, g), q, K, g);
                continue;
            }
            if (fmt == FORMAT_Q6_K) {
                write_q6_k_headers(o, raw, rows, K, t);
                for (int64_t g = 0; g < G; g++) write_q6_bits((uint8_t *)q6_bits(fmt, o, g), q, K, g);
                continue;
            }
            for (int64_t g = 0; g < G; g++, o += group_bytes(fmt)) {
                if (fmt == FORMAT_Q4_1) write_q4_1(o, q, s, lo, K, g);
                else if (fmt == FORMAT_Q6) over += write_q6(o, q, s, K, g);
                else write_q8_0(o, q, s, K, g);
            }
        }
        free(q), free(s), free(lo);
    }
    return failed ? -2 : over;
}
