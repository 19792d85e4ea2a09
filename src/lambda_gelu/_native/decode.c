#include "int8.h"

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

/* y[0..m) = the rows r0..r0 + m (m ≤ 4) of a projection, w·x + b (b may be NULL): from the int8 rows q with scales
 * s over x̃ with scale t (x rounded to int16, int8.h) where q is given, else from the float32 rows w over x. */
static inline void project4(const float *w, const int8_t *q, const float *s, const float *b, const float *x,
                            const int16_t *xq, double t, int64_t r0, int m, int64_t d, float *y) {
    if (q) {
        int32_t sums[4];
        sums_i8_i16(q + r0 * d, m, d, xq, sums);
        for (int i = 0; i < m; i++)
            y[i] = (float)((double)s[r0 + i] * t * sums[i]) + (b ? b[r0 + i] : 0.0f);
    } else
        for (int i = 0; i < m; i++)
            y[i] = dot_f32(w + (r0 + i) * d, x, d) + (b ? b[r0 + i] : 0.0f);
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
 * The projections' rows and the heads are split over the threads.
 * Returns 0, or −1 if buffers could not be allocated (h and the caches unchanged). */
int lg_decode_attention_f32(float *h, const float *norm_w, double eps, int plus_one, const float *q_norm_w,
                            double q_eps, int q_plus_one, const float *k_norm_w, double k_eps, int k_plus_one,
                            const float *post_w, double post_eps, int post_plus_one, double v_eps, int shares,
                            int whole, int rotated_first, const float *qkv,
                            const float *qkv_b, const float *o_w, const float *o_b, const int8_t *qkv_q,
                            const float *qkv_s, const int8_t *o_q, const float *o_s, const float *cos, const float *sin,
                            float *k_cache, float *v_cache, int64_t pos, int64_t length, int64_t d, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, double scaling, double softcap,
                            int max_threads) {
    int64_t nq = heads * head_dim, nk = shares ? 0 : kv_heads * head_dim, rows = nq + 2 * nk;
    int64_t group = heads / kv_heads, own_heads = heads + (shares ? 0 : kv_heads);
    float *x = malloc((size_t)(2 * d + rows + nq + heads * (pos + 1)) * sizeof *x);
    int16_t *xq = malloc((size_t)(d + nq) * sizeof *xq), *oq = xq + d;  /* x and o as int16, for the int8 rows */
    if (!x || !xq) {
        free(x);
        free(xq);
        return -1;
    }
    double tx = 0.0, to = 0.0;
    /* the projections, the heads' outputs, their weights, the attention's output before its norm */
    float *p = x + d, *o = p + rows, *scores = o + nq, *y = scores + heads * (pos + 1);
    float cap = (float)softcap;
    if (eps < 0.0)
        memcpy(x, h, (size_t)d * sizeof *x);
    else
        lg_rms_norm_f32(h, norm_w, x, d, eps, plus_one);
    int qkv_int8 = qkv_q && !round_rows_i16(x, 1, d, xq, &tx), o_int8 = o_q != NULL;
    int nt = max_threads > 1 ? max_threads : 1;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        #pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < rows; r0 += 4)
            project4(qkv, qkv_int8 ? qkv_q : NULL, qkv_s, qkv_b, x, xq, tx, r0, rows - r0 < 4 ? (int)(rows - r0) : 4,
                     d, p + r0);
        #pragma omp single
        if (whole) {  /* one norm over every query head, one over every key head */
            if (q_norm_w)
                lg_rms_norm_f32(p, q_norm_w, p, nq, q_eps, q_plus_one);
            if (k_norm_w && nk)
                lg_rms_norm_f32(p + nq, k_norm_w, p + nq, nk, k_eps, k_plus_one);
        }
        #pragma omp for schedule(static)
        for (int64_t j = 0; j < own_heads; j++) {  /* the query heads, then the key heads (none if it shares) */
            float *v = p + j * head_dim;
            if (rotated_first)
                rotate_f32(v, cos, sin, rotary_dim);
            if (j < heads && q_norm_w && !whole)
                lg_rms_norm_f32(v, q_norm_w, v, head_dim, q_eps, q_plus_one);
            else if (j >= heads && k_norm_w && !whole)
                lg_rms_norm_f32(v, k_norm_w, v, head_dim, k_eps, k_plus_one);
            if (!rotated_first)
                rotate_f32(v, cos, sin, rotary_dim);
            if (j >= heads) {
                int64_t g = j - heads, at = (g * length + pos) * head_dim;
                float *value = p + nq + nk + g * head_dim;
                if (v_eps >= 0.0)
                    lg_rms_norm_f32(value, NULL, value, head_dim, v_eps, 0);
                memcpy(k_cache + at, p + j * head_dim, (size_t)head_dim * sizeof *p);
                memcpy(v_cache + at, value, (size_t)head_dim * sizeof *p);
            }
        }
        #pragma omp for schedule(static)
        for (int64_t j = 0; j < heads; j++) {
            const float *q = p + j * head_dim, *keys = k_cache + (j / group) * length * head_dim;
            const float *values = v_cache + (j / group) * length * head_dim;
            float *s = scores + j * (pos + 1), top = -INFINITY, total = 0.0f;
            for (int64_t t = 0; t <= pos; t++) {
                s[t] = dot_f32(q, keys + t * head_dim, head_dim) * (float)scaling;
                if (cap > 0.0f)
                    s[t] = tanhf(s[t] / cap) * cap;
                top = s[t] > top ? s[t] : top;
            }
            for (int64_t t = 0; t <= pos; t++)
                total += s[t] = expf(s[t] - top);
            float *oj = o + j * head_dim;
            for (int64_t i = 0; i < head_dim; i++)
                oj[i] = 0.0f;
            for (int64_t t = 0; t <= pos; t++) {
                float a = s[t] / total;
                const float *vt = values + t * head_dim;
                for (int64_t i = 0; i < head_dim; i++)
                    oj[i] = FMA(a, vt[i], oj[i]);
            }
        }
        #pragma omp single
        o_int8 = o_int8 && !round_rows_i16(o, 1, nq, oq, &to);
        #pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < d; r0 += 4) {
            int m = d - r0 < 4 ? (int)(d - r0) : 4;
            float out[4];
            project4(o_w, o_int8 ? o_q : NULL, o_s, o_b, o, oq, to, r0, m, nq, out);
            for (int i = 0; i < m; i++) {
                if (post_w)
                    y[r0 + i] = out[i];
                else
                    h[r0 + i] += out[i];
            }
        }
    }
    if (post_w) {
        lg_rms_norm_f32(y, post_w, y, d, post_eps, post_plus_one);
        for (int64_t r = 0; r < d; r++)
            h[r] += y[r];
    }
    free(x);
    free(xq);
    return 0;
}
