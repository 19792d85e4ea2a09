/* A decoder layer as the one-call token step reads it (token.c): its attention (decode.c) and its sparse gated FFN
 * (gated.c), each a function that every thread of an OpenMP team calls, so that a whole token runs in one parallel
 * region; the per-layer entry points open a region of their own around the same functions. The Python side mirrors
 * these structs (lambda_gelu.inference.token_step) and checks their sizes against lg_token_sizes. */
#pragma once
#include <stddef.h>
#include "common.h"

/* y = rms_norm(x)·w (decode.c) */
void lg_rms_norm_f32(const float *x, const float *w, float *y, int64_t d, double eps, int plus_one);

/* The attention half of a layer (lg_decode_attention_f32 says what each field does). */
struct lg_attention {
    const float *norm_w, *q_norm_w, *k_norm_w, *post_w;
    double eps, q_eps, k_eps, post_eps, v_eps, scaling, softcap;
    int plus_one, q_plus_one, k_plus_one, post_plus_one, shares, whole, rotated_first;
    const float *qkv, *qkv_b, *o_w, *o_b, *qkv_s, *o_s;
    const int8_t *qkv_q, *o_q;
    int64_t heads, kv_heads, head_dim, rotary_dim;
};

/* Its scratch, sized for d, the layer's projections and positions 0..pos and a team of `threads`: the projections'
 * outputs, the heads' scores, the output before its norm, and each thread's own vectors (decode.c: struct own). */
struct lg_attention_scratch { float *p, *scores, *y, *own; int16_t *own_q; int64_t d, nq, nk, heads; };

/* Allocates that scratch for the layer's sizes (or larger), positions 0..pos and a team of up to `threads`; −1 if it
 * cannot (nothing held). */
int lg_attention_scratch(const struct lg_attention *a, int64_t d, int64_t pos, int threads,
                         struct lg_attention_scratch *s);
void lg_attention_scratch_free(struct lg_attention_scratch *s);

/* One token's attention at position pos (counted in the caches from their pointers' first position), in place on
 * h (d): called by every thread of a team. */
void lg_attention_team(const struct lg_attention *a, float *h, const float *cos, const float *sin, float *k_cache,
                       float *v_cache, int64_t pos, int64_t length, int64_t d, const struct lg_attention_scratch *s);

/* A sparse gated FFN with an exact ReLU gate (lambda_gelu.inference.gated.SparseGatedMLP) for one token: the norm
 * before it (eps < 0: none) and the one after it (post_w NULL: none), its output's scale (Granite's; 1: none), and its
 * rows: with int8, gate_q, up_q, down_q (downᵀ's rows) with scales gate_s, up_s (a row each) and down_s (an output
 * each), unit k's up row at up_q + k·stride and its downᵀ row at down_q + k·stride (unit_rows: one block of rows
 * [up | downᵀ], stride d + out); with int4, the same rows as 4-bit rows (int4.h) with a scale a row (gate_s, up_s,
 * down_s), downᵀ's rows included, against x rounded to int8 (int4 = 1) or x itself in float (int4 = 2: continuous in
 * x, for a decoder's probe); else the float32 rows gate, up, down_t (downᵀ), unit k's three at gate, up, down_t +
 * k·stride (unit_rows: one block [gate | up | downᵀ], stride 2·d + out), with the gate's int8 screen gate_q, gate_s,
 * gate_r, gate_n (screen_rows). Biases may be NULL. */
struct lg_ffn {
    const float *norm_w, *post_w;
    double eps, post_eps, scale;
    int plus_one, post_plus_one, int8, int4;
    const int8_t *gate_q, *up_q, *down_q;
    const float *gate_s, *up_s, *down_s, *gate_r, *gate_n, *gate, *up, *down_t, *gate_b, *up_b, *down_b;
    int64_t ff, out, stride;
};

/* Its scratch for a team of `threads`: x (d) and its int16 rounding (int8.h), or its int8 one with that one's
 * block sums and the same in pair order (int4.h), the gates (ff), each thread's list of units (ff in all), the other
 * threads' partial sums ((threads − 1)·d), x's norm, residual and scale, and y (d), the block's output; `active`
 * counts the units active. */
struct lg_ffn_scratch { float *x, *g, *partial, *y; int16_t *xq, *xs; int8_t *x8, *xp; int64_t *units; double *stats;
                        int64_t active; };

/* Allocates that scratch; −1 if it cannot (nothing held). */
int lg_ffn_scratch(int64_t d, int64_t ff, int64_t out, int threads, struct lg_ffn_scratch *s);
void lg_ffn_scratch_free(struct lg_ffn_scratch *s);

/* y = the FFN of h (d) into s->y (out wide), and h += y if `add` (out = d): called by every thread of a team. */
void lg_ffn_team(const struct lg_ffn *f, float *h, int add, int64_t d, struct lg_ffn_scratch *s);

/* The output layer's rows as the screened argmax reads them (argmax.c): float32 w (rows, d) and bias b (NULL: none),
 * their int8 copies q with scales s and radii r, nq (lambda_gelu.inference.gated.screen_rows), and the multiply-adds
 * a thread is worth (grain: lambda_gelu._native.GRAIN). */
struct lg_head { const float *w, *b; const int8_t *q; const float *s, *r, *nq; int64_t rows, grain; };

int64_t lg_screened_argmax_f32(const float *x, const float *w, const float *b, const int8_t *q, const float *s,
                               const float *r, const float *nq, int64_t rows, int64_t d, int max_threads,
                               int64_t grain, int64_t *n_read);
