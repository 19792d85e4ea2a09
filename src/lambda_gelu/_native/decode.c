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

/* A thread's own scratch (lg_attention_scratch holds one for each thread of the team): x and its int16 rounding, its
 * copy of the query and key heads (normed and rotated), its share of the positions' weighted values for each query
 * head (not yet divided by their weights' sum), those shares' largest score and sum of weights, the heads' outputs
 * merged, and their int16 rounding. */
struct own { float *x, *qk, *part, *top, *total, *o; int16_t *xq, *oq; };

static int64_t own_floats(const struct lg_attention_scratch *s) {  /* whole cache lines: no two threads share one */
    return (s->d + 3 * s->nq + s->nk + 2 * s->heads + 15) / 16 * 16;
}

static int64_t own_int16s(const struct lg_attention_scratch *s) {
    return (s->d + s->nq + 31) / 32 * 32;
}

static struct own own_scratch(const struct lg_attention_scratch *s, int t) {
    float *f = s->own + t * own_floats(s);
    int16_t *q = s->own_q + t * own_int16s(s);
    struct own w = {f, f + s->d, f + s->d + s->nq + s->nk, NULL, NULL, NULL, q, q + s->d};
    w.top = w.part + s->nq, w.total = w.top + s->heads, w.o = w.total + s->heads;
    return w;
}

/* v[i] = exp(v[i]) for the n weights of a softmax (v ≤ 0, or NaN): in the AVX2 loop eight at a time, by Cephes'
 * expf (2^k·p(r), r = v − k·ln 2, |r| ≤ ln 2 / 2, p of degree 7), within 2 units in the last place of exp; 0 below
 * −87.3 (where exp is below about 2^−126, the smallest normal float) and NaN for NaN. expf itself is the reference, and
 * takes the rest: one call a weight cost a decoding step's attention more than its scores (three query heads a key
 * head, 48 positions: 600 of 1,700 cycles a head). */
static void exp_f32(float *v, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 lowest = _mm256_set1_ps(-87.3f), log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 ln2_hi = _mm256_set1_ps(0.693359375f), ln2_lo = _mm256_set1_ps(-2.12194440e-4f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(v + i), keep = _mm256_cmp_ps(x, lowest, _CMP_NLT_UQ);  /* x ≥ −87.3, or NaN */
        __m256 c = _mm256_max_ps(x, lowest), k = _mm256_round_ps(_mm256_mul_ps(c, log2e), _MM_FROUND_TO_NEAREST_INT);
        __m256 r = _mm256_fnmadd_ps(k, ln2_lo, _mm256_fnmadd_ps(k, ln2_hi, c));
        __m256 p = _mm256_set1_ps(1.9875691500e-4f);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
        p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
        __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
        __m256 e = _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(two_k)), keep);
        _mm256_storeu_ps(v + i, _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    }
#endif
    for (; i < n; i++)
        v[i] = expf(v[i]);
}

void lg_exp_f32(float *v, int64_t n) {  /* exp_f32, for its tests */
    exp_f32(v, n);
}

/* acc (d) += Σ_t w[t]·rows[t] over n rows of d: in the AVX2 loop 64 of acc at a time held in registers over all the
 * rows (for each row, a multiply-add a vector; acc in memory instead was a load and a store beside each). */
static void weighted_rows_f32(const float *w, const float *rows, int64_t n, int64_t d, float *acc) {
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 64 <= d; i += 64) {
        __m256 a[8];
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_loadu_ps(acc + i + 8 * k);
        for (int64_t t = 0; t < n; t++) {
            __m256 e = _mm256_set1_ps(w[t]);
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(e, _mm256_loadu_ps(rows + t * d + i + 8 * k), a[k]);
        }
        for (int k = 0; k < 8; k++)
            _mm256_storeu_ps(acc + i + 8 * k, a[k]);
    }
#endif
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = i; j < d; j++)
            acc[j] = FMA(w[t], rows[t * d + j], acc[j]);
}

/* Positions a tile of keys or values: read from memory once for the query heads that share them, then from L1. */
#define ATTENTION_TILE 16

/* One thread's share [t0, t1) of the positions for every query head, from its copy of the heads (qk): for each key
 * head, tile by tile, its keys' scores c(q·k·scaling) for each query head that reads it (query head j reads key head
 * j / group, as torch's grouped-query attention), four keys at a time (dots4_f32); then each query head's largest
 * score (top: a NaN score, not counted in it, makes its own weight, the sum and so the head's output NaN, as torch's
 * softmax does), its weights exp(score − top) (exp_f32) and their sum (total); then, tile by tile again, Σ weight·v
 * into part. An empty share, or one whose scores are all −∞, gives total 0, which merge_heads passes over. */
static void attend_share(const struct lg_attention *a, const struct own *w, const float *k_cache, const float *v_cache,
                         float *scores, int64_t positions, int64_t length, int64_t t0, int64_t t1) {
    int64_t head_dim = a->head_dim, group = a->heads / a->kv_heads;
    float cap = (float)a->softcap;
    for (int64_t g = 0; g < a->kv_heads; g++) {
        const float *keys = k_cache + g * length * head_dim, *values = v_cache + g * length * head_dim;
        int64_t j0 = g * group, j1 = j0 + group;
        for (int64_t tile = t0; tile < t1; tile += ATTENTION_TILE) {
            int64_t end = tile + ATTENTION_TILE < t1 ? tile + ATTENTION_TILE : t1;
            for (int64_t j = j0; j < j1; j++) {
                const float *q = w->qk + j * head_dim;
                float *sc = scores + j * positions;
                for (int64_t t = tile; t < end; t += 4)
                    dots4_f32(q, keys + t * head_dim, end - t < 4 ? (int)(end - t) : 4, head_dim, sc + t);
                for (int64_t t = tile; t < end; t++) {
                    sc[t] *= (float)a->scaling;
                    if (cap > 0.0f)
                        sc[t] = tanhf(sc[t] / cap) * cap;
                }
            }
        }
        for (int64_t j = j0; j < j1; j++) {
            float *sc = scores + j * positions, top = -INFINITY, total = 0.0f, *part = w->part + j * head_dim;
            for (int64_t t = t0; t < t1; t++)
                top = sc[t] > top ? sc[t] : top;
            if (top == -INFINITY)  /* every score −∞ or NaN: weights of 0 beside a finite score elsewhere, NaN kept */
                for (int64_t t = t0; t < t1; t++)
                    sc[t] = sc[t] != sc[t] ? sc[t] : 0.0f;
            else {
                for (int64_t t = t0; t < t1; t++)
                    sc[t] -= top;
                exp_f32(sc + t0, t1 - t0);
            }
            for (int64_t t = t0; t < t1; t++)
                total += sc[t];
            w->top[j] = top, w->total[j] = total;
            for (int64_t i = 0; i < head_dim; i++)
                part[i] = 0.0f;
        }
        for (int64_t tile = t0; tile < t1; tile += ATTENTION_TILE) {
            int64_t n = (tile + ATTENTION_TILE < t1 ? tile + ATTENTION_TILE : t1) - tile;
            for (int64_t j = j0; j < j1; j++)
                weighted_rows_f32(scores + j * positions + tile, values + tile * head_dim, n, head_dim,
                                  w->part + j * head_dim);
        }
    }
}

/* The heads' outputs into w->o from the team's shares (attend_share): softmax over all positions is each share's
 * weights times exp(its top − the largest top), so o = Σ_u exp(top_u − top)·part_u / Σ_u exp(top_u − top)·total_u over
 * the shares u with weights (total ≠ 0: an empty share, or one whose every score is −∞, adds nothing; one with a NaN
 * score makes o NaN; if no share has weights, o is 0 / 0, NaN, as torch's softmax of −∞ alone). */
static void merge_heads(const struct lg_attention *a, const struct lg_attention_scratch *s, int threads, float *o) {
    int64_t head_dim = a->head_dim;
    for (int64_t j = 0; j < a->heads; j++) {
        float top = -INFINITY, total = 0.0f, *oj = o + j * head_dim;
        for (int u = 0; u < threads; u++) {
            float tu = own_scratch(s, u).top[j];
            top = tu > top ? tu : top;
        }
        for (int64_t i = 0; i < head_dim; i++)
            oj[i] = 0.0f;
        for (int u = 0; u < threads; u++) {
            struct own w = own_scratch(s, u);
            if (w.total[j] == 0.0f)
                continue;
            float e = expf(w.top[j] - top);
            const float *part = w.part + j * head_dim;
            total += e * w.total[j];
            for (int64_t i = 0; i < head_dim; i++)
                oj[i] = FMA(e, part[i], oj[i]);
        }
        for (int64_t i = 0; i < head_dim; i++)
            oj[i] /= total;
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
 * The projections' rows and the positions are split over the threads of the team that calls it (every one of them,
 * inside a parallel region: lg_decode_tokens' for whole tokens, or lg_decode_attention_f32's, which opens one for this
 * alone and returns 0, or −1 if buffers could not be allocated, h and the caches unchanged). What each thread needs of
 * the few small vectors between the projections (x, the rotated heads, the merged outputs) it computes itself, the
 * same values as the others: a barrier costs more than those steps (0.6 µs on a 2-core EPYC), and a step one thread
 * took while the others waited cost as much again. Three barriers a layer: after the query, key and value rows, after
 * the positions, after the output rows (four with post_w). */
void lg_attention_team(const struct lg_attention *a, float *h, const float *cos, const float *sin, float *k_cache,
                       float *v_cache, int64_t pos, int64_t length, int64_t d, const struct lg_attention_scratch *s) {
    int64_t heads = a->heads, head_dim = a->head_dim, kv_heads = a->kv_heads, rotary_dim = a->rotary_dim;
    int64_t nq = heads * head_dim, nk = a->shares ? 0 : kv_heads * head_dim, rows = nq + 2 * nk, positions = pos + 1;
    int64_t own_heads = heads + (a->shares ? 0 : kv_heads), lo, hi, t0, t1;
    int t = omp_get_thread_num(), threads = omp_get_num_threads();
    struct own w = own_scratch(s, t);
    float *p = s->p, *y = s->y;
    double tx = 0.0, to = 0.0;
    if (a->qkv_q)
        prefetch_share(a->qkv_q, rows, d);
    else
        prefetch_share(a->qkv, rows, d * (int64_t)sizeof *a->qkv);
    if (a->eps < 0.0)
        memcpy(w.x, h, (size_t)d * sizeof *h);
    else
        lg_rms_norm_f32(h, a->norm_w, w.x, d, a->eps, a->plus_one);
    int qkv_int8 = a->qkv_q && !round_rows_i16(w.x, 1, d, w.xq, &tx);
    split(rows, 4, t, threads, &lo, &hi);
    project(a->qkv, qkv_int8 ? a->qkv_q : NULL, a->qkv_s, a->qkv_b, w.x, w.xq, tx, lo, hi, d, p);
    #pragma omp barrier
    memcpy(w.qk, p, (size_t)(nq + nk) * sizeof *p);
    if (a->whole) {  /* one norm over every query head, one over every key head */
        if (a->q_norm_w)
            lg_rms_norm_f32(w.qk, a->q_norm_w, w.qk, nq, a->q_eps, a->q_plus_one);
        if (a->k_norm_w && nk)
            lg_rms_norm_f32(w.qk + nq, a->k_norm_w, w.qk + nq, nk, a->k_eps, a->k_plus_one);
    }
    for (int64_t j = 0; j < own_heads; j++) {  /* the query heads, then the key heads (none if it shares) */
        float *v = w.qk + j * head_dim;
        if (a->rotated_first)
            rotate_f32(v, cos, sin, rotary_dim);
        if (j < heads && a->q_norm_w && !a->whole)
            lg_rms_norm_f32(v, a->q_norm_w, v, head_dim, a->q_eps, a->q_plus_one);
        else if (j >= heads && a->k_norm_w && !a->whole)
            lg_rms_norm_f32(v, a->k_norm_w, v, head_dim, a->k_eps, a->k_plus_one);
        if (!a->rotated_first)
            rotate_f32(v, cos, sin, rotary_dim);
    }
    split(positions, 1, t, threads, &t0, &t1);
    if (t1 == positions)  /* the last share, the only one to read position pos: its key and value into the caches */
        for (int64_t g = 0; g < nk / head_dim; g++) {
            int64_t at = (g * length + pos) * head_dim;
            float *value = p + nq + nk + g * head_dim;
            if (a->v_eps >= 0.0)
                lg_rms_norm_f32(value, NULL, value, head_dim, a->v_eps, 0);
            memcpy(k_cache + at, w.qk + nq + g * head_dim, (size_t)head_dim * sizeof *p);
            memcpy(v_cache + at, value, (size_t)head_dim * sizeof *p);
        }
    if (a->o_q)
        prefetch_share(a->o_q, d, nq);
    else
        prefetch_share(a->o_w, d, nq * (int64_t)sizeof *a->o_w);
    attend_share(a, &w, k_cache, v_cache, s->scores, positions, length, t0, t1);
    #pragma omp barrier
    merge_heads(a, s, threads, w.o);
    int o_int8 = a->o_q && !round_rows_i16(w.o, 1, nq, w.oq, &to);
    split(d, 4, t, threads, &lo, &hi);
    project(a->o_w, o_int8 ? a->o_q : NULL, a->o_s, a->o_b, w.o, w.oq, to, lo, hi, nq, y);
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

int lg_attention_scratch(const struct lg_attention *a, int64_t d, int64_t pos, int threads,
                         struct lg_attention_scratch *s) {
    int64_t nq = a->heads * a->head_dim, nk = a->kv_heads * a->head_dim, rows = nq + 2 * nk;
    threads = threads > 1 ? threads : 1;
    *s = (struct lg_attention_scratch){.d = d, .nq = nq, .nk = nk, .heads = a->heads};
    s->p = malloc((size_t)(rows + a->heads * (pos + 1) + d) * sizeof *s->p);
    s->own = malloc((size_t)(threads * own_floats(s)) * sizeof *s->own);
    s->own_q = malloc((size_t)(threads * own_int16s(s)) * sizeof *s->own_q);
    if (!s->p || !s->own || !s->own_q) {
        lg_attention_scratch_free(s);
        return -1;
    }
    s->scores = s->p + rows, s->y = s->scores + a->heads * (pos + 1);
    return 0;
}

void lg_attention_scratch_free(struct lg_attention_scratch *s) {
    free(s->p);
    free(s->own);
    free(s->own_q);
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
    int nt = max_threads > 1 ? max_threads : 1;
    struct lg_attention_scratch s;
    if (lg_attention_scratch(&a, d, pos, nt, &s) != 0)
        return -1;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    lg_attention_team(&a, h, cos, sin, k_cache, v_cache, pos, length, d, &s);
    lg_attention_scratch_free(&s);
    return 0;
}
