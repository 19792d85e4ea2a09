#include "int8.h"
#include "token.h"

/* One decoding step of a Llama-layout decoder layer (lambda_gelu.hf.LeanDecoder), float32, one token: the work
 * between the layer's weights is a few hundred multiply-adds per head, and in torch it is some thirty small calls of
 * a few microseconds each — at batch 1 as much time as reading the attention's weights. The reference is the
 * decoder's torch path, which the tests and the decoder's own probe compare with this one. */

/* y = rms_norm(x)·w, or ·(1 + w) with plus_one (Gemma), or alone if w is NULL (Gemma 4's norm of the values):
 * x·(1/√(mean(x²) + eps)), the mean in float32 as torch's. */
void lg_rms_norm_f32(const float *x, const float *w, float *y, int64_t d, double eps, int plus_one) {
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < d; j++)
        sum += x[j] * x[j];
    float r = 1.0f / sqrtf(sum / (float)d + (float)eps);
    for (int64_t j = 0; j < d; j++)
        y[j] = w ? (x[j] * r) * (plus_one ? 1.0f + w[j] : w[j]) : x[j] * r;
}

/* v rotated as transformers' rotary embedding rotates it: v·cos + rotate_half(v)·sin, rotate_half(v) = (−v₂, v₁)
 * for v = (v₁, v₂), its two halves. */
static inline void rotate_f32(float *v, const float *cos, const float *sin, int64_t width) {
    int64_t half = width / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/* y = w·x + b (b may be NULL) over the rows [lo, hi) of a projection, read as RUNS runs side by side (common.h): from
 * the int8 rows q with scales s over x̃ with scale t (x rounded to int16, int8.h) where q is given, else from the
 * float32 rows w over x. */
static void project(const float *w, const int8_t *q, const float *s, const float *b, const float *x,
                    const int16_t *xq, double t, int64_t lo, int64_t hi, int64_t d, float *y) {
    for (int64_t i = 0; i < runs_steps(lo, hi); i++) {
        int64_t r[RUNS];
        int m = runs_step(lo, hi, i, r);
        if (q) {
            const int8_t *rows[RUNS];
            int32_t sums[RUNS];
            rows_i8(q, r, m, d, rows);
            sums_i8_i16(rows, m, d, xq, sums);
            for (int k = 0; k < m; k++)
                y[r[k]] = scaled_i8(s[r[k]], t, sums[k]) + (b ? b[r[k]] : 0.0f);
        } else {
            const float *rows[RUNS];
            float sums[RUNS];
            for (int k = 0; k < m; k++)
                rows[k] = w + r[k] * d;
            rows4_f32(rows, x, m, d, sums);
            for (int k = 0; k < m; k++)
                y[r[k]] = sums[k] + (b ? b[r[k]] : 0.0f);
        }
    }
}

/* The attention half of a decoder layer for the token at position pos, in place on its hidden state h (d):
 *     x = rms_norm(h)·norm_w, or h if eps < 0 (OLMo 2's layers, which norm only after);
 *     q | k | v = x·qkvᵀ + qkv_b;
 *     each head of q and of k normalized over head_dim by its own RMS norm if q_norm_w, k_norm_w are given (Qwen3's;
 *     NULL: none), or all of q and all of k at once with whole (OLMo 2's), and each head of v by one without weight
 *     if v_eps ≥ 0 (Gemma 4's; < 0: none);   q, k rotated by cos, sin (this position's) over the first rotary_dim
 *     features of each head (head_dim, or fewer: a partial rotary embedding, Phi-4-mini's), the rest as they are,
 *     before their per-head norms with rotated_first (HunYuan's), else after them;
 *     the cache's position pos ← k, v;   o = softmax(c(q·Kᵀ·scaling))·V per query head, over positions 0..pos of
 *     its key head (query head j reads key head j / (heads / kv_heads), as torch's grouped-query attention), c the
 *     identity or, with softcap > 0 (Gemma 2's), c(s) = softcap·tanh(s / softcap);
 *     h += o·o_wᵀ + o_b, or h += rms_norm(o·o_wᵀ + o_b)·post_w if post_w is given (Gemma 2's and 3's norm after the
 *     attention; NULL: none).
 * qkv is the query, key and value projections' weights stacked (heads + 2·kv_heads)·head_dim rows of d; k_cache and
 * v_cache are (kv_heads, length, head_dim) (a sliding window's caller passes them from its first position, and pos
 * counted from there). A layer that shares (Gemma 4's layers reading an earlier layer's keys and values) has qkv of
 * its query rows alone, writes nothing to the caches and reads them as that layer wrote them, position pos included.
 * With qkv_q, qkv_s (and o_q, o_s) given, the projections read int8 rows instead, each row s·q (quantize_rows: a
 * quarter of the float32 bytes), their input rounded to int16 as t·x̃ and summed exactly in integers (int8.h), the
 * result s·t·(q·x̃) in double: the float32 projection of the dequantized rows but for x's rounding to 16 bits. An
 * input holding a NaN or an infinity, which no x̃ stands for, is read by the float32 rows, which carry it.
 * The projections' rows and the heads are split over the threads of the team that calls it (every one of them, inside
 * a parallel region: lg_decode_tokens' for whole tokens, or lg_decode_attention_f32's, which opens one for this
 * alone and returns 0, or −1 if buffers could not be allocated, h and the caches unchanged). */
void lg_attention_team(const struct lg_attention *a, float *h, const float *cos, const float *sin, float *k_cache,
                       float *v_cache, int64_t pos, int64_t length, int64_t d, const struct lg_attention_scratch *s) {
    int64_t heads = a->heads, head_dim = a->head_dim, kv_heads = a->kv_heads, rotary_dim = a->rotary_dim;
    int64_t nq = heads * head_dim, nk = a->shares ? 0 : kv_heads * head_dim, rows = nq + 2 * nk;
    int64_t group = heads / kv_heads, own_heads = heads + (a->shares ? 0 : kv_heads);
    float *x = s->x, *p = s->p, *o = s->o, *scores = s->scores, *y = s->y, cap = (float)a->softcap;
    int16_t *xq = s->xq, *oq = s->oq;
    double tx = 0.0, to = 0.0;
    int qkv_int8 = 0, o_int8 = 0;
    if (a->qkv_q)
        prefetch_share(a->qkv_q, rows, d);
    else
        prefetch_share(a->qkv, rows, d * (int64_t)sizeof *a->qkv);
    #pragma omp single copyprivate(tx, qkv_int8)
    {
        if (a->eps < 0.0)
            memcpy(x, h, (size_t)d * sizeof *x);
        else
            lg_rms_norm_f32(h, a->norm_w, x, d, a->eps, a->plus_one);
        qkv_int8 = a->qkv_q && !round_rows_i16(x, 1, d, xq, &tx);
    }
    int64_t lo, hi;
    split(rows, 4, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
    project(a->qkv, qkv_int8 ? a->qkv_q : NULL, a->qkv_s, a->qkv_b, x, xq, tx, lo, hi, d, p);
    #pragma omp barrier
    if (a->whole) {  /* one norm over every query head, one over every key head */
        #pragma omp single
        {
            if (a->q_norm_w)
                lg_rms_norm_f32(p, a->q_norm_w, p, nq, a->q_eps, a->q_plus_one);
            if (a->k_norm_w && nk)
                lg_rms_norm_f32(p + nq, a->k_norm_w, p + nq, nk, a->k_eps, a->k_plus_one);
        }
    }
    #pragma omp for schedule(static)
    for (int64_t j = 0; j < own_heads; j++) {  /* the query heads, then the key heads (none if it shares) */
        float *v = p + j * head_dim;
        if (a->rotated_first)
            rotate_f32(v, cos, sin, rotary_dim);
        if (j < heads && a->q_norm_w && !a->whole)
            lg_rms_norm_f32(v, a->q_norm_w, v, head_dim, a->q_eps, a->q_plus_one);
        else if (j >= heads && a->k_norm_w && !a->whole)
            lg_rms_norm_f32(v, a->k_norm_w, v, head_dim, a->k_eps, a->k_plus_one);
        if (!a->rotated_first)
            rotate_f32(v, cos, sin, rotary_dim);
        if (j >= heads) {
            int64_t g = j - heads, at = (g * length + pos) * head_dim;
            float *value = p + nq + nk + g * head_dim;
            if (a->v_eps >= 0.0)
                lg_rms_norm_f32(value, NULL, value, head_dim, a->v_eps, 0);
            memcpy(k_cache + at, p + j * head_dim, (size_t)head_dim * sizeof *p);
            memcpy(v_cache + at, value, (size_t)head_dim * sizeof *p);
        }
    }
    if (a->o_q)
        prefetch_share(a->o_q, d, nq);
    else
        prefetch_share(a->o_w, d, nq * (int64_t)sizeof *a->o_w);
    #pragma omp for schedule(static)
    for (int64_t j = 0; j < heads; j++) {
        const float *q = p + j * head_dim, *keys = k_cache + (j / group) * length * head_dim;
        const float *values = v_cache + (j / group) * length * head_dim;
        float *sc = scores + j * (pos + 1), top = -INFINITY, total = 0.0f;
        for (int64_t t = 0; t <= pos; t++) {
            sc[t] = dot_f32(q, keys + t * head_dim, head_dim) * (float)a->scaling;
            if (cap > 0.0f)
                sc[t] = tanhf(sc[t] / cap) * cap;
            top = sc[t] > top ? sc[t] : top;
        }
        for (int64_t t = 0; t <= pos; t++)
            total += sc[t] = expf(sc[t] - top);
        float *oj = o + j * head_dim;
        for (int64_t i = 0; i < head_dim; i++)
            oj[i] = 0.0f;
        for (int64_t t = 0; t <= pos; t++) {
            float w = sc[t] / total;
            const float *vt = values + t * head_dim;
            for (int64_t i = 0; i < head_dim; i++)
                oj[i] = FMA(w, vt[i], oj[i]);
        }
    }
    #pragma omp single copyprivate(to, o_int8)
    o_int8 = a->o_q && !round_rows_i16(o, 1, nq, oq, &to);
    split(d, 4, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
    project(a->o_w, o_int8 ? a->o_q : NULL, a->o_s, a->o_b, o, oq, to, lo, hi, nq, y);
    if (!a->post_w)
        for (int64_t r = lo; r < hi; r++)
            h[r] += y[r];
    #pragma omp barrier
    if (a->post_w) {
        #pragma omp single
        {
            lg_rms_norm_f32(y, a->post_w, y, d, a->post_eps, a->post_plus_one);
            for (int64_t r = 0; r < d; r++)
                h[r] += y[r];
        }
    }
}

int lg_attention_scratch(const struct lg_attention *a, int64_t d, int64_t pos, struct lg_attention_scratch *s) {
    int64_t nq = a->heads * a->head_dim, rows = nq + 2 * a->kv_heads * a->head_dim;
    s->x = malloc((size_t)(2 * d + rows + nq + a->heads * (pos + 1)) * sizeof *s->x);
    s->xq = malloc((size_t)(d + nq) * sizeof *s->xq);
    if (!s->x || !s->xq) {
        lg_attention_scratch_free(s);
        return -1;
    }
    s->p = s->x + d, s->o = s->p + rows, s->scores = s->o + nq, s->y = s->scores + a->heads * (pos + 1);
    s->oq = s->xq + d;
    return 0;
}

void lg_attention_scratch_free(struct lg_attention_scratch *s) {
    free(s->x);
    free(s->xq);
}

int lg_decode_attention_f32(float *h, const float *norm_w, double eps, int plus_one, const float *q_norm_w,
                            double q_eps, int q_plus_one, const float *k_norm_w, double k_eps, int k_plus_one,
                            const float *post_w, double post_eps, int post_plus_one, double v_eps, int shares,
                            int whole, int rotated_first, const float *qkv,
                            const float *qkv_b, const float *o_w, const float *o_b, const int8_t *qkv_q,
                            const float *qkv_s, const int8_t *o_q, const float *o_s, const float *cos, const float *sin,
                            float *k_cache, float *v_cache, int64_t pos, int64_t length, int64_t d, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, double scaling, double softcap,
                            int max_threads) {
    struct lg_attention a = {norm_w, q_norm_w, k_norm_w, post_w, eps, q_eps, k_eps, post_eps, v_eps, scaling, softcap,
                             plus_one, q_plus_one, k_plus_one, post_plus_one, shares, whole, rotated_first,
                             qkv, qkv_b, o_w, o_b, qkv_s, o_s, qkv_q, o_q, heads, kv_heads, head_dim, rotary_dim};
    struct lg_attention_scratch s;
    if (lg_attention_scratch(&a, d, pos, &s) != 0)
        return -1;
    int nt = max_threads > 1 ? max_threads : 1;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    lg_attention_team(&a, h, cos, sin, k_cache, v_cache, pos, length, d, &s);
    lg_attention_scratch_free(&s);
    return 0;
}
