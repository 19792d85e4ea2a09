/* λ-GELU float32 kernels for the CPU: one pass over memory each way, as F.gelu's own kernels.
 *
 *   forward   y  = x · Φ(z),                 z = λx
 *   backward  gx = g · (Φ(z) + λ·u),         u = x·φ(z)
 *             gλ = Σ g · x · u               (the direct form; see functional.py)
 *
 * Φ uses Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7, the formula of PyTorch's vectorized erf), and
 * its exp(−z²/2) is also φ's, so the backward evaluates one exponential per element. Plain C written
 * for the compiler's auto-vectorizer; threads via OpenMP (the runtime PyTorch already loaded).
 *
 * Layouts (λ constant along contiguous runs, or varying along the contiguous dimension):
 *   runs: x is (outer, C, inner) and λ[c] applies to each contiguous run of `inner` elements;
 *         one λ is outer = C = 1, inner = n.
 *   last: x is (outer, C) and λ[c] applies to column c.
 * gλ is accumulated in double, one row of C partial sums per thread; the caller adds the rows.
 * Each kernel exists for float32 (suffix _f32) and bfloat16 (_bf16): see _kernels_body.h.
 *
 * λ-SiLU (suffix _silu_f32, _silu_bf16) is the same walk with the logistic gate σ in place of Φ:
 *   forward   y  = x · σ(z)
 *   backward  gx = g · (σ(z) + λ·u),         u = x·σ'(z) = x·σ(z)(1 − σ(z))
 *             gλ = Σ g · x · u
 * with one exponential per element, e = exp(−|z|): σ(|z|) = 1/(1 + e), σ' = e/(1 + e)².
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

/* fmaf where the CPU has it (one rounding, vectorized); elsewhere, as on baseline x86-64, fmaf would
 * be a slow library call, so a multiply and an add (two roundings: the tests' bounds allow for both). */
#ifdef FP_FAST_FMAF
#define FMA(a, b, c) fmaf(a, b, c)
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

#define INV_SQRT_2PI 0.3989422804014327f
#define P_OVER_SQRT2 0.2316419f /* A&S 7.1.26's p = 0.3275911, divided by √2: t = 1/(1 + p·|z|/√2) */

static inline float exp_neg(float t) { /* e^t for t ≤ 0, 0 below −87 (Cephes expf, rel. error ~1e-7) */
    float tc = t > -87.0f ? t : -87.0f;
    float n = rintf(tc * 1.4426950408889634f);
    float r = FMA(n, -0.693359375f, tc);
    r = FMA(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = FMA(p, r, 1.3981999507e-3f);
    p = FMA(p, r, 8.3334519073e-3f);
    p = FMA(p, r, 4.1665795894e-2f);
    p = FMA(p, r, 1.6666665459e-1f);
    p = FMA(p, r, 5.0000001201e-1f);
    p = FMA(p, r * r, r + 1.0f);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return t < -87.0f ? 0.0f : p * scale;
}

/* Φ(z) given e = exp(−z²/2). */
static inline float gate(float z, float e) {
    float t = 1.0f / FMA(P_OVER_SQRT2, fabsf(z), 1.0f);
    float r = 1.061405429f;
    r = FMA(r, t, -1.453152027f);
    r = FMA(r, t, 1.421413741f);
    r = FMA(r, t, -0.284496736f);
    r = FMA(r, t, 0.254829592f);
    float h = 0.5f * r * t * e; /* Φ(−|z|) */
    return z >= 0.0f ? 1.0f - h : h;
}

static inline float fwd1(float x, float lam) {
    float z = x * lam;
    return x * gate(z, exp_neg(-0.5f * z * z));
}

/* One element's input gradient; *xu receives x·u for the λ gradient. */
static inline float bwd1(float g, float x, float lam, float *xu) {
    float z = x * lam;
    float e = exp_neg(-0.5f * z * z);
    float u = x * (e * INV_SQRT_2PI);
    *xu = x * u;
    return g * (gate(z, e) + lam * u);
}

static inline float silu_fwd1(float x, float lam) {
    float z = x * lam;
    float e = exp_neg(-fabsf(z));
    float s = 1.0f / (1.0f + e);
    return x * (z >= 0.0f ? s : e * s);
}

static inline float silu_bwd1(float g, float x, float lam, float *xu) {
    float z = x * lam;
    float e = exp_neg(-fabsf(z));
    float s = 1.0f / (1.0f + e);
    float u = x * (e * s * s); /* x·σ'(z) */
    *xu = x * u;
    return g * ((z >= 0.0f ? s : e * s) + lam * u);
}

/* The element range [lo, hi) of thread `tid` among `nt`, in whole multiples of `align`. */
static void split(int64_t n, int64_t align, int tid, int nt, int64_t *lo, int64_t *hi) {
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

/* Walk thread tid's share of a `runs` tensor: runs BODY on each piece, with off, len and c set. */
#define FOR_EACH_RUN(outer, C, inner, tid, nt, BODY)                                          \
    do {                                                                                     \
        int64_t lo_, hi_;                                                                    \
        split((outer) * (C) * (inner), 64, tid, nt, &lo_, &hi_);                             \
        while (lo_ < hi_) {                                                                  \
            int64_t row_ = lo_ / (inner);                                                    \
            int64_t end_ = (row_ + 1) * (inner) < hi_ ? (row_ + 1) * (inner) : hi_;          \
            int64_t off = lo_, len = end_ - lo_, c = row_ % (C);                             \
            BODY;                                                                            \
            lo_ = end_;                                                                      \
        }                                                                                    \
    } while (0)

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define NAME(f) CAT(f, SUFFIX)

/* bfloat16: the upper half of a float32; stores round to nearest even, as torch's conversion */
static inline float bf16_load(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline uint16_t bf16_store(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)(f != f ? 0x7FC0u : rounded); /* NaN → the quiet NaN torch's conversion gives */
}

/* λ-GELU's kernels for float32 and bfloat16 (_f32, _bf16) ... */
#define GATE
#include "_kernels_types.h"
#undef GATE

/* ... and λ-SiLU's: the same loops with the logistic gate (_silu_f32, _silu_bf16) */
#define fwd1 silu_fwd1
#define bwd1 silu_bwd1
#define GATE _silu
#include "_kernels_types.h"
#undef GATE
#undef fwd1
#undef bwd1

/* The inputs (columns of x (n, in)) that are non-zero in some row, in increasing order, written to
 * `active` (room for `in`); returns how many. NaN counts as non-zero, −0 as zero, as `x != 0` does.
 * The same list as lambda_gelu.sparse.active_inputs, without its three tensors and the sync of
 * nonzero(): at batch 1 those cost as much as the sparse product itself. */
int64_t lg_active_union_f32(const float *x, int64_t n, int64_t in, int64_t *active) {
    if (n == 1) {
        int64_t k = 0;
        for (int64_t i = 0; i < in; i++)
            if (x[i] != 0.0f)
                active[k++] = i;
        return k;
    }
    for (int64_t i = 0; i < in; i++)  /* marks first, OR-ed over the rows; then compacted in place */
        active[i] = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < in; i++)
            active[i] |= x[r * in + i] != 0.0f;
    int64_t k = 0;
    for (int64_t i = 0; i < in; i++)
        if (active[i])
            active[k++] = i;  /* k ≤ i: never overwrites a mark still to be read */
    return k;
}

/* Sparse-input linear layer, float32 (lambda_gelu.sparse): y = x · Wt + b for x (n, in) with mostly
 * zero entries, Wt the transposed weight (in, out). Only the rows of Wt whose input is non-zero in some
 * row of x (the batch's union of active inputs) are read, each once for the whole batch: the memory
 * traffic is that fraction of a dense layer's. Threads split the active rows (whole rows: long
 * sequential reads, requested a few rows ahead) into partial sums that are added at the end. The
 * same sum as the dense layer up to float rounding (zeros contribute exactly nothing to a sum of finite
 * products; the order of the terms differs). */
/* Rows are scattered, so the hardware prefetcher, which follows one stream at a time and stops at
 * page boundaries, starts cold on each; requesting them a few rows ahead, into L2, keeps enough
 * reads in flight. In a cold-cache test (batch 1, the 3072 → 768 layer at 10% density, one core)
 * this took 86 µs where one row ahead into L1 took 150. */
#define PREFETCH_ROWS 4
static inline void prefetch_row(const float *row, int64_t n) {
    for (int64_t j = 0; j < n; j += 16)  /* one 64-byte line per 16 floats */
        __builtin_prefetch(row + j, 0, 2);
}

/* acc (n, out) = the rows active[a0:a1] of Wt, weighted by their inputs in x, summed */
static void sparse_rows_f32(const float *x, const float *wt, float *acc, const int64_t *active, int64_t a0,
                            int64_t a1, int64_t n, int64_t in, int64_t out) {
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = a0; a < a1 && a < a0 + PREFETCH_ROWS; a++)
        prefetch_row(wt + active[a] * out, out);
    for (int64_t a = a0; a < a1; a++) {
        int64_t i = active[a];
        const float *w = wt + i * out;
        if (a + PREFETCH_ROWS < a1)
            prefetch_row(wt + active[a + PREFETCH_ROWS] * out, out);
        for (int64_t r = 0; r < n; r++) {
            float v = x[r * in + i];
            if (v == 0.0f)
                continue;
            float *yr = acc + r * out;
            for (int64_t j = 0; j < out; j++)
                yr[j] = FMA(v, w[j], yr[j]);
        }
    }
}

/* What a thread sums over the active units [a0, a1) into acc (n, out): one of the two kernels below, with its
 * operands in `ctx`. */
typedef void (*rows_fn)(const void *ctx, float *acc, const int64_t *active, int64_t a0, int64_t a1);

/* Inside a parallel region, once every thread has summed its share into y (thread 0) or its partial (thread t into
 * partial + (t − 1)·size): thread t of `threads` adds up its slice of the `size` sums, plus bias[k % out] if given. */
static void add_partials(float *y, const float *partial, const float *bias, int64_t size, int64_t out, int t,
                         int threads) {
    int64_t per = (size + threads - 1) / threads;
    int64_t k0 = t * per < size ? t * per : size, k1 = k0 + per < size ? k0 + per : size;
    for (int64_t k = k0; k < k1; k++) {
        float sum = y[k];
        for (int u = 1; u < threads; u++)
            sum += partial[(int64_t)(u - 1) * size + k];
        y[k] = sum + (bias ? bias[k % out] : 0.0f);
    }
}

/* y (n, out) = Σ over the active units of what `rows` sums for each, on nt threads (each sums a share of the units
 * into a partial, added at the end), plus bias if given; −1 if the partial sums could not be allocated, else 0. */
static int parallel_rows(rows_fn rows, const void *ctx, float *y, const float *bias, const int64_t *active,
                         int64_t n_active, int64_t n, int64_t out, int nt) {
    if (nt <= 1) {  /* no parallel region: entering one, even for one thread, costs as much as a small layer */
        rows(ctx, y, active, 0, n_active);
        if (bias)
            for (int64_t k = 0; k < n * out; k++)
                y[k] += bias[k % out];
        return 0;
    }
    float *partial = malloc((size_t)(nt - 1) * n * out * sizeof *partial);  /* the other threads' sums */
    if (!partial)
        return -1;
    #pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), threads = omp_get_num_threads();
        int64_t chunk = (n_active + threads - 1) / threads;
        int64_t a0 = t * chunk < n_active ? t * chunk : n_active;
        int64_t a1 = a0 + chunk < n_active ? a0 + chunk : n_active;
        rows(ctx, t == 0 ? y : partial + (int64_t)(t - 1) * n * out, active, a0, a1);
        #pragma omp barrier
        add_partials(y, partial, bias, n * out, out, t, threads);
    }
    free(partial);
    return 0;
}

struct linear_ctx { const float *x, *wt; int64_t n, in, out; };

static void linear_rows(const void *c, float *acc, const int64_t *active, int64_t a0, int64_t a1) {
    const struct linear_ctx *l = c;
    sparse_rows_f32(l->x, l->wt, acc, active, a0, a1, l->n, l->in, l->out);
}

/* One call does it all, as each call from Python costs microseconds, a sizeable share of a small
 * layer's time at batch 1: lists the active inputs, and if there are at most `max_active`, writes y and
 * returns how many; if more, returns that count and leaves y alone (the caller runs the dense layer);
 * −1 if its buffers could not be allocated. Threads: at most `max_threads`, one per `grain` multiply-adds. */
int64_t lg_sparse_linear_f32(const float *x, const float *wt, const float *bias, float *y, int64_t n, int64_t in,
                             int64_t out, int64_t max_active, int max_threads, int64_t grain) {
    int64_t *active = malloc((size_t)(in > 0 ? in : 1) * sizeof *active);
    if (!active)
        return -1;
    int64_t n_active = lg_active_union_f32(x, n, in, active);
    if (n_active <= max_active) {
        int64_t work = n_active * out * (n > 1 ? n : 1) / grain;
        int nt = work < max_threads ? (int)work : max_threads;
        struct linear_ctx ctx = {x, wt, n, in, out};
        if (parallel_rows(linear_rows, &ctx, y, bias, active, n_active, n, out, nt) != 0)
            n_active = -1;
    }
    free(active);
    return n_active;
}

/* Σ a[j]·b[j] as the vector unit sums it: one partial sum per lane (a reduction OpenMP lets the compiler reorder);
 * one running sum would be a chain of n dependent FMAs, several times slower than reading the rows. */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < n; j++)
        s += a[j] * b[j];
    return s;
}

/* s[i] = w · x[i·d : (i + 1)·d] for the m ≤ 4 rows of x, side by side where there are two or more: each of w's
 * vectors read once for them, and four chains of multiply-adds in flight, where one dot_f32 after another waits on
 * each one's chain (at 8 rows a gated block's loop was bound by those chains, not by reading its rows). Fewer than
 * four rows repeat the first in the chains left over, whose sums are dropped. */
static inline void dots4_f32(const float *w, const float *x, int m, int64_t d, float *s) {
    if (m == 1) {
        s[0] = dot_f32(w, x, d);
        return;
    }
    const float *x0 = x, *x1 = x + d, *x2 = m > 2 ? x + 2 * d : x, *x3 = m > 3 ? x + 3 * d : x;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    #pragma omp simd reduction(+:s0, s1, s2, s3)
    for (int64_t j = 0; j < d; j++) {
        s0 += w[j] * x0[j];
        s1 += w[j] * x1[j];
        s2 += w[j] * x2[j];
        s3 += w[j] * x3[j];
    }
    float all[4] = {s0, s1, s2, s3};
    for (int i = 0; i < m; i++)
        s[i] = all[i];
}

/* One unit k of a gated block over the n rows of x (n, d): adds g[r, k]·(u_row · x_r + u_b)·w to acc's row r (out
 * wide) for each row r where g[r, k] ≠ 0 (every row if `dense`), the up products four rows at a time; returns
 * whether some row's g was nonzero. */
static inline int unit_rows_f32(const float *x, const float *g, int64_t k, const float *u_row, float u_b,
                                const float *w, float *acc, int64_t n, int64_t d, int64_t ff, int64_t out, int dense) {
    int active = 0;
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
        int m = n - r0 < 4 ? (int)(n - r0) : 4, any = dense;
        for (int i = 0; i < m; i++)
            any |= g[(r0 + i) * ff + k] != 0.0f;
        if (!any)
            continue;
        float u[4];
        dots4_f32(u_row, x + r0 * d, m, d, u);
        for (int i = 0; i < m; i++) {
            float gk = g[(r0 + i) * ff + k];
            if (gk == 0.0f && !dense)
                continue;
            active |= gk != 0.0f;
            float h = gk * (u[i] + u_b), *yr = acc + (r0 + i) * out;
            for (int64_t j = 0; j < out; j++)
                yr[j] = FMA(h, w[j], yr[j]);
        }
    }
    return active;
}

/* Sparse gated FFN, float32 (lambda_gelu.sparse_gated): y = Σ_k (g[:, k] · (x · up[k] + up_b[k])) downᵀ[k] over
 * the units k active in some row of g = relu(gate(x)) (n, ff), already computed (up_b: up's bias, or null for none).
 * up is (ff, d), downᵀ (ff, out): an active unit reads its row of each, contiguous, once for the whole batch; an
 * inactive one reads neither. Threads split the active units into partial sums added at the end, in parallel_rows,
 * which adds down's bias. */
static void sparse_gated_rows_f32(int dense, const float *x, const float *g, const float *up, const float *up_b,
                                  const float *down_t, float *acc,
                                  const int64_t *active, int64_t a0, int64_t a1, int64_t n, int64_t d, int64_t ff,
                                  int64_t out) {
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = a0; a < a1 && a < a0 + PREFETCH_ROWS; a++) {
        prefetch_row(up + active[a] * d, d);
        prefetch_row(down_t + active[a] * out, out);
    }
    for (int64_t a = a0; a < a1; a++) {
        int64_t k = active[a];
        const float *u_row = up + k * d, *w = down_t + k * out;
        if (a + PREFETCH_ROWS < a1) {
            prefetch_row(up + active[a + PREFETCH_ROWS] * d, d);
            prefetch_row(down_t + active[a + PREFETCH_ROWS] * out, out);
        }
        unit_rows_f32(x, g, k, u_row, up_b ? up_b[k] : 0.0f, w, acc, n, d, ff, out, dense);
    }
}

struct gated_ctx { const float *x, *g, *up, *up_b, *down_t; int64_t n, d, ff, out; int dense; };

static void gated_rows(const void *c, float *acc, const int64_t *active, int64_t a0, int64_t a1) {
    const struct gated_ctx *q = c;
    sparse_gated_rows_f32(q->dense, q->x, q->g, q->up, q->up_b, q->down_t, acc, active, a0, a1, q->n, q->d, q->ff,
                          q->out);
}

/* A gated block's sum over its units (every unit if `dense`, else those active in some row of g (n, ff)): if there
 * are at most `max_active`, `rows` sums them into y with `ctx` on up to max_threads threads (one per `grain`
 * multiply-adds), adds `bias` (down's, or null) and their count is returned; if more, that count and y untouched
 * (the caller runs the dense block); −1 if buffers could not be allocated. */
static int64_t gated_units(rows_fn rows, const void *ctx, const float *g, const float *bias, float *y, int64_t n,
                           int64_t d, int64_t ff, int64_t out, int64_t max_active, int dense, int max_threads,
                           int64_t grain) {
    int64_t *active = malloc((size_t)(ff > 0 ? ff : 1) * sizeof *active);
    if (!active)
        return -1;
    int64_t n_active = ff;
    if (dense)
        for (int64_t k = 0; k < ff; k++)
            active[k] = k;
    else
        n_active = lg_active_union_f32(g, n, ff, active);
    if (n_active <= max_active) {
        int64_t work = n_active * (d + out) * (n > 1 ? n : 1) / grain;
        int nt = work < max_threads ? (int)work : max_threads;
        if (parallel_rows(rows, ctx, y, bias, active, n_active, n, out, nt) != 0)
            n_active = -1;
    }
    free(active);
    return n_active;
}

static int64_t sparse_gated_f32(int dense, const float *x, const float *g, const float *up, const float *up_b,
                                const float *down_t, const float *down_b, float *y, int64_t n, int64_t d, int64_t ff,
                                int64_t out, int64_t max_active, int max_threads, int64_t grain) {
    struct gated_ctx ctx = {x, g, up, up_b, down_t, n, d, ff, out, dense};
    return gated_units(gated_rows, &ctx, g, down_b, y, n, d, ff, out, max_active, dense, max_threads, grain);
}

/* One call: the sparse block from g = relu(gate(x)) (n, ff), already computed; up_b and down_b: the biases, or null. */
int64_t lg_sparse_gated_f32(const float *x, const float *g, const float *up, const float *up_b, const float *down_t,
                            const float *down_b, float *y, int64_t n, int64_t d, int64_t ff, int64_t out,
                            int64_t max_active, int max_threads, int64_t grain) {
    return sparse_gated_f32(0, x, g, up, up_b, down_t, down_b, y, n, d, ff, out, max_active, max_threads, grain);
}

/* g[r·ff] = relu(row · x_r + b) in float32 for the n rows of x (n, d), NaN kept as torch keeps it, four rows at a
 * time (dots4_f32): one unit's gate, the same sums wherever it is computed; returns whether some row's is nonzero. */
static inline int relu_gates_f32(const float *row, float b, const float *x, int64_t n, int64_t d, float *g,
                                 int64_t ff) {
    int active = 0;
    for (int64_t r0 = 0; r0 < n; r0 += 4) {
        int m = n - r0 < 4 ? (int)(n - r0) : 4;
        float v[4];
        dots4_f32(row, x + r0 * d, m, d, v);
        for (int i = 0; i < m; i++) {
            float gi = v[i] + b;
            gi = gi > 0.0f || gi != gi ? gi : 0.0f;
            g[(r0 + i) * ff] = gi;
            active |= gi != 0.0f;
        }
    }
    return active;
}

/* Threads for a gate's n·ff·d multiply-adds: one per `grain`, at least one, at most max_threads. */
static int gate_threads(int64_t n, int64_t d, int64_t ff, int max_threads, int64_t grain) {
    int64_t work = n * ff * d / grain;
    return work < 1 ? 1 : work < max_threads ? (int)work : max_threads;
}

/* The same with the gate computed here too, g = relu(x · gateᵀ + gate_b) into the caller's g (n, ff), for a batch of
 * a few rows (decoding): each unit's row read once for the batch, the units split over the threads — at batch 1 a
 * matrix-vector product bound by reading the rows, which this loop does as fast as the BLAS's and without the
 * separate calls a torch gate costs. The caller runs the dense block from g where this returns more than max_active.
 * `dense` nonzero: every unit is computed, zero or not (this loop without the sparsity, to compare). */
int64_t lg_sparse_gated_fused_f32(const float *x, const float *gate, const float *gate_b, const float *up,
                                  const float *up_b, const float *down_t, const float *down_b, float *g, float *y,
                                  int64_t n, int64_t d, int64_t ff, int64_t out, int64_t max_active, int dense,
                                  int max_threads, int64_t grain) {
    int nt = gate_threads(n, d, ff, max_threads, grain);
    #pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k = 0; k < ff; k++)
        relu_gates_f32(gate + k * d, gate_b ? gate_b[k] : 0.0f, x, n, d, g + k, ff);
    return sparse_gated_f32(dense, x, g, up, up_b, down_t, down_b, y, n, d, ff, out, max_active, max_threads, grain);
}

/* Σ q[i·d + j]·b[j] over j for the four int8 rows q, q + d, q + 2d, q + 3d at once, b an int16 vector, into s[0..3]:
 * exact integer sums, as long as d·127·max|b| < 2³¹ (screen_scale). Products of int16 operands, written so, become
 * the vector unit's multiply-adds of 16-bit pairs (several times faster than int8 rows converted to float, which at
 * batch 1 left the screen waiting on its own arithmetic, not on memory); an OpenMP simd reduction here, or the
 * products taken in 32 bits, vectorized three to four times slower. */
static inline void dot4_i8_i16(const int8_t *q, int64_t d, const int16_t *b, int32_t *s) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t j = 0; j < d; j++) {
        int32_t bj = b[j];
        s0 += (int16_t)q[j] * bj;
        s1 += (int16_t)q[d + j] * bj;
        s2 += (int16_t)q[2 * d + j] * bj;
        s3 += (int16_t)q[3 * d + j] * bj;
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

static inline int32_t dot_i8_i16(const int8_t *q, const int16_t *b, int64_t d) {
    int32_t s = 0;
    for (int64_t j = 0; j < d; j++)
        s += (int16_t)q[j] * (int16_t)b[j];
    return s;
}

/* The exact sums of the m ≤ 4 int8 rows q, q + d, ... with b into s[0..m), four at once where there are four. */
static inline void sums_i8_i16(const int8_t *q, int m, int64_t d, const int16_t *b, int32_t *s) {
    if (m == 4)
        dot4_i8_i16(q, d, b, s);
    else
        for (int i = 0; i < m; i++)
            s[i] = dot_i8_i16(q + i * d, b, d);
}

/* The largest |x̃| the screen quantizes x to, for rows of d entries: int16, and d·127·|x̃| < 2³¹ (exact int32 sums). */
static inline int32_t screen_scale(int64_t d) {
    int64_t m = (int64_t)2147483647 / (127 * (d > 0 ? d : 1));
    return m < 32767 ? (int32_t)m : 32767;
}

/* x (n, d) as int16 for those sums, row by row: x̃ = x / t rounded to nearest, t = max|x| / screen_scale(d) (into
 * t[r]; 0 for a row of zeros). Returns 0, or 1 if some row holds a NaN or an infinity, which no x̃ stands for. */
static int round_rows_i16(const float *x, int64_t n, int64_t d, int16_t *xq, double *t) {
    double top = screen_scale(d);
    int bad = 0;
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * d;
        double largest = 0.0;
        for (int64_t j = 0; j < d; j++) {
            bad |= !isfinite(xr[j]);
            largest = fabs((double)xr[j]) > largest ? fabs((double)xr[j]) : largest;
        }
        t[r] = largest / top;
        for (int64_t j = 0; j < d; j++) {
            double v = t[r] > 0.0 && isfinite(t[r]) ? nearbyint(xr[j] / t[r]) : 0.0;
            xq[r * d + j] = (int16_t)(v > top ? top : v < -top ? -top : v == v ? v : 0.0);
        }
    }
    return bad;
}

/* A screen's view of each row of x (n, d): its int16 rounding x̃ and scale t (round_rows_i16) into xq and scale[r],
 * and, rounded up, ‖x‖₂ into norm[r] and ‖x − t·x̃‖₂ into residual[r] (plus what double rounds in each x − t·x̃).
 * A row with a NaN or an infinity gets a norm that is not finite, which certifies nothing. */
static void screen_rows_of_x(const float *x, int64_t n, int64_t d, int16_t *xq, double *norm, double *residual,
                             double *scale) {
    round_rows_i16(x, n, d, xq, scale);
    double above = 1.0 + (double)(d + 4) * 0x1p-52;  /* over what double rounds in a sum of d squares and its root */
    for (int64_t r = 0; r < n; r++) {
        double sum = 0.0, res = 0.0;
        for (int64_t j = 0; j < d; j++) {
            double xj = x[r * d + j], e = xj - scale[r] * xq[r * d + j];
            sum += xj * xj;
            res += e * e;
        }
        norm[r] = sqrt(sum) * above;
        residual[r] = sqrt(res) * above + 0x1p-48 * norm[r];
    }
}

/* How far product + b (product = s·t·(q·x̃), in double) can be from the exact w·x + b, for an int8 row q with scale s
 * and radii r ≥ ‖w − s·q‖₂, nq ≥ s·‖q‖₂ (lambda_gelu.sparse_gated.screen_rows) and x's norm and residual from
 * screen_rows_of_x: r·‖x‖₂ + nq·‖x − t·x̃‖₂ by Cauchy–Schwarz on x·(w − s·q) + s·q·(x − t·x̃), plus double's
 * roundings of the product and the sum; SCREEN_SAFETY covers the roundings of the margin's own products and sums. */
#define SCREEN_SAFETY (1.0 + 1.0 / 65536)
static inline double screen_margin(double product, double b, float r, float nq, double norm, double residual) {
    return ((double)r * norm + (double)nq * residual + 0x1p-48 * (fabs(product) + fabs(b))) * SCREEN_SAFETY;
}

/* Sparse gated FFN over int8 weights (lambda_gelu.sparse_gated, SparseGatedMLP(int8=True)): gate, up (ff, d) and
 * downᵀ (ff, out) are rows of int8 q, each with a float32 scale s, standing for the row s·q; the biases (or null)
 * stay float32. Each row of x is taken as t·x̃, x̃ its int16 rounding (round_rows_i16), so that every q·x̃ is an
 * exact integer sum, several times faster than int8 converted to float (a call whose x holds a NaN or an infinity
 * sums x itself in float, which carries them). The gate is computed here too, g = relu(x · gateᵀ + gate_b) into the
 * caller's g (n, ff) — each unit's row read once for the whole batch, the units split over the threads — then the
 * active units as in the float32 kernel, reading a quarter of its bytes.
 * `dense` nonzero: every unit is computed, zero or not (the same int8 block without the sparsity, to compare). */
#define SCREEN_AHEAD 16  /* int8 rows read in order (a gate's, or its screen's) are requested so many rows ahead */
static inline void prefetch_bytes(const int8_t *row, int64_t n) {
    for (int64_t j = 0; j < n; j += 64)
        __builtin_prefetch(row + j, 0, 2);
}

static inline float dot_i8(const int8_t *a, const float *b, int64_t n) {
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < n; j++)
        s += (float)a[j] * b[j];
    return s;
}

struct gated_i8_ctx { const float *x, *g, *up_s, *up_b, *down_s; const int8_t *up_q, *down_q; const int16_t *xq;
                      const double *t; int64_t n, d, ff, out; int dense, in_float; };

/* s·(q·x) for one int8 row: the exact integer sum over x̃ scaled back (t), or, if x is not finite, in float. */
static inline float row_i8(const int8_t *q, float s, const float *x, const int16_t *xq, double t, int in_float,
                           int64_t d) {
    return in_float ? s * dot_i8(q, x, d) : (float)((double)s * t * dot_i8_i16(q, xq, d));
}

static void gated_i8_rows(const void *c, float *acc, const int64_t *active, int64_t a0, int64_t a1) {
    const struct gated_i8_ctx *q = c;
    int64_t n = q->n, d = q->d, ff = q->ff, out = q->out;
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = a0; a < a1 && a < a0 + PREFETCH_ROWS; a++) {
        prefetch_bytes(q->up_q + active[a] * d, d);
        prefetch_bytes(q->down_q + active[a] * out, out);
    }
    for (int64_t a = a0; a < a1; a++) {
        int64_t k = active[a];
        const int8_t *u_row = q->up_q + k * d, *w = q->down_q + k * out;
        if (a + PREFETCH_ROWS < a1) {
            prefetch_bytes(q->up_q + active[a + PREFETCH_ROWS] * d, d);
            prefetch_bytes(q->down_q + active[a + PREFETCH_ROWS] * out, out);
        }
        for (int64_t r = 0; r < n; r++) {
            float gk = q->g[r * ff + k];
            if (gk == 0.0f && !q->dense)
                continue;
            float u = row_i8(u_row, q->up_s[k], q->x + r * d, q->xq + r * d, q->t[r], q->in_float, d);
            float h = gk * (q->up_b ? u + q->up_b[k] : u) * q->down_s[k];
            float *yr = acc + r * out;
            for (int64_t j = 0; j < out; j++)
                yr[j] = FMA(h, (float)w[j], yr[j]);
        }
    }
}

int64_t lg_sparse_gated_i8(const float *x, const int8_t *gate_q, const float *gate_s, const float *gate_b,
                           const int8_t *up_q, const float *up_s, const float *up_b, const int8_t *down_q,
                           const float *down_s, const float *down_b, float *g, float *y, int64_t n, int64_t d,
                           int64_t ff, int64_t out, int dense, int max_threads, int64_t grain) {
    int16_t *xq = malloc((size_t)(n > 0 ? n : 1) * (d > 0 ? d : 1) * sizeof *xq);
    double *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!xq || !t) {
        free(xq);
        free(t);
        return -1;
    }
    int in_float = round_rows_i16(x, n, d, xq, t);  /* a NaN or an infinity is carried by float sums only */
    int nt = gate_threads(n, d, ff, max_threads, grain);
    #pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k0 = 0; k0 < ff; k0 += 4) {
        int m = ff - k0 < 4 ? (int)(ff - k0) : 4;
        if (k0 + SCREEN_AHEAD + 4 <= ff)
            prefetch_bytes(gate_q + (k0 + SCREEN_AHEAD) * d, 4 * d);
        for (int64_t r = 0; r < n; r++) {
            float v[4];
            if (m == 4 && !in_float) {
                int32_t sums[4];
                dot4_i8_i16(gate_q + k0 * d, d, xq + r * d, sums);
                for (int i = 0; i < 4; i++)
                    v[i] = (float)((double)gate_s[k0 + i] * t[r] * sums[i]);
            } else
                for (int i = 0; i < m; i++)
                    v[i] = row_i8(gate_q + (k0 + i) * d, gate_s[k0 + i], x + r * d, xq + r * d, t[r], in_float, d);
            for (int i = 0; i < m; i++) {
                float vk = gate_b ? v[i] + gate_b[k0 + i] : v[i];
                g[r * ff + k0 + i] = vk > 0.0f || vk != vk ? vk : 0.0f;  /* relu, NaN kept as torch keeps it */
            }
        }
    }
    struct gated_i8_ctx ctx = {x, g, up_s, up_b, down_s, up_q, down_q, xq, t, n, d, ff, out, dense, in_float};
    int64_t n_active = gated_units(gated_i8_rows, &ctx, g, down_b, y, n, d, ff, out, ff, dense, max_threads, grain);
    free(xq);
    free(t);
    return n_active;
}

/* What one thread of lg_sparse_gated_screened_f32 does over the units cand[0:m) its screen left, in three stages
 * UNITS_AHEAD units apart: a unit's float32 gate row is requested; then its gate computed into g (n, ff) and, only if
 * it is not 0 in some row, its up and downᵀ rows requested; then those rows summed into acc as in
 * sparse_gated_rows_f32. A unit the screen left but the exact gate zeroes costs its gate row alone. Returns the units
 * active in some row. */
#define UNITS_AHEAD 8
struct screened_ctx { const float *x, *gate, *gate_b, *up, *up_b, *down_t; float *g; int64_t n, d, ff, out; };

static inline void screened_gate(const struct screened_ctx *q, int64_t k) {
    if (relu_gates_f32(q->gate + k * q->d, q->gate_b ? q->gate_b[k] : 0.0f, q->x, q->n, q->d, q->g + k, q->ff)) {
        prefetch_row(q->up + k * q->d, q->d);
        prefetch_row(q->down_t + k * q->out, q->out);
    }
}

static int64_t screened_rows(const struct screened_ctx *q, float *acc, const int64_t *cand, int64_t m) {
    int64_t n = q->n, d = q->d, ff = q->ff, out = q->out, n_active = 0;
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = 0; a < m && a < 2 * UNITS_AHEAD; a++)
        prefetch_row(q->gate + cand[a] * d, d);
    for (int64_t a = 0; a < m && a < UNITS_AHEAD; a++)
        screened_gate(q, cand[a]);
    for (int64_t a = 0; a < m; a++) {
        if (a + 2 * UNITS_AHEAD < m)
            prefetch_row(q->gate + cand[a + 2 * UNITS_AHEAD] * d, d);
        if (a + UNITS_AHEAD < m)
            screened_gate(q, cand[a + UNITS_AHEAD]);
        int64_t k = cand[a];
        n_active += unit_rows_f32(q->x, q->g, k, q->up + k * d, q->up_b ? q->up_b[k] : 0.0f, q->down_t + k * out, acc,
                                  n, d, ff, out, 0);
    }
    return n_active;
}

/* The float32 block of lg_sparse_gated_fused_f32 with its gate screened by int8 rows (lambda_gelu.sparse_gated,
 * SparseGatedMLP(screen=True)). The gate's rows are read as int8 q with scales s, a quarter of their bytes, and
 * each row x of the batch as int16 x̃ with one scale t = max|x| / screen_scale(d), rounded to nearest. With the exact
 * integer sum S = q·x̃, a = s·t·S + gate_b (in double) is within
 *     r·‖x‖₂ + n·‖x − t·x̃‖₂ + 2⁻⁴⁸·(|s·t·S| + |gate_b|)
 * of the exact gate x·gate[k] + gate_b: r ≥ ‖gate[k] − s·q‖₂ and n ≥ s·‖q‖₂ (one each per row, rounded up;
 * screen_rows) by Cauchy–Schwarz on x·(gate[k] − s·q) + s·q·(x − t·x̃), plus double's roundings of a. The norms are
 * computed in double and rounded up. A unit whose a plus that margin is ≤ 0 in every row of the batch has an exact
 * gate ≤ 0: its g is 0 and none of its float32 rows is read. Every other unit's gate is computed from its float32
 * row, as in the unscreened kernel — so g and y are that kernel's up to float rounding, and a unit the screen leaves
 * out is one the exact ReLU zeroes. The bound fails safe: a row of x with a NaN or an infinity certifies nothing, nor
 * does a NaN or infinite margin. One parallel region: each thread screens its own share of the units (the int8
 * rows read four at a time and requested SCREEN_AHEAD rows ahead: their reads are short and the sums between them
 * long; screen_units), then sums the units it left (screened_rows) into its partial, and the partials are added.
 * Writes g and y, whatever the count (g may be NULL: the gates then go to a buffer of its own, for a caller that wants
 * y alone); returns the units active in some row, or −1 if buffers could not be allocated. */
struct screen_ctx { const int8_t *q; const float *s, *b, *r, *nq; const int16_t *xq; const double *norm, *residual,
                    *scale; float *g; int64_t n, d, ff; };

/* Screens the units [lo, hi) (lo a multiple of 4) for every row of x, zeroes their g, and lists those the screen
 * leaves (whose exact gate may be positive in some row) in cand; returns how many. */
static int64_t screen_units(const struct screen_ctx *c, int64_t lo, int64_t hi, int64_t *cand) {
    int64_t n = c->n, d = c->d, ff = c->ff, m_left = 0;
    for (int64_t k0 = lo; k0 < hi; k0 += 4) {
        int m = hi - k0 < 4 ? (int)(hi - k0) : 4;
        int exact[4] = {0, 0, 0, 0};
        if (k0 + SCREEN_AHEAD + 4 <= hi)
            prefetch_bytes(c->q + (k0 + SCREEN_AHEAD) * d, 4 * d);
        for (int64_t r = 0; r < n; r++) {
            int32_t sums[4];
            sums_i8_i16(c->q + k0 * d, m, d, c->xq + r * d, sums);
            for (int i = 0; i < m; i++) {
                int64_t k = k0 + i;
                double b = c->b ? c->b[k] : 0.0, product = (double)c->s[k] * c->scale[r] * sums[i];
                double margin = screen_margin(product, b, c->r[k], c->nq[k], c->norm[r], c->residual[r]);
                exact[i] |= !(product + b + margin <= 0.0 && isfinite(c->norm[r]));
            }
        }
        for (int i = 0; i < m; i++) {
            if (exact[i])
                cand[m_left++] = k0 + i;
            for (int64_t r = 0; r < n; r++)
                c->g[r * ff + k0 + i] = 0.0f;  /* the units left get theirs in screened_rows */
        }
    }
    return m_left;
}

int64_t lg_sparse_gated_screened_f32(const float *x, const float *gate, const float *gate_b, const int8_t *gate_q,
                                     const float *gate_s, const float *gate_r, const float *gate_n, const float *up,
                                     const float *up_b, const float *down_t, const float *down_b, float *g, float *y,
                                     int64_t n, int64_t d, int64_t ff, int64_t out, int max_threads, int64_t grain) {
    int64_t rows = n > 0 ? n : 1;
    int nt = gate_threads(n, d, ff, max_threads, grain);
    double *norm = malloc((size_t)rows * 3 * sizeof *norm);  /* per row of x: ‖x‖₂, ‖x − t·x̃‖₂ (up), t */
    int16_t *xq = malloc((size_t)rows * (d > 0 ? d : 1) * sizeof *xq);
    int64_t *cand = malloc((size_t)(ff > 0 ? ff : 1) * sizeof *cand);  /* each thread's list from cand + its lo */
    float *own_g = g ? NULL : malloc((size_t)rows * (ff > 0 ? ff : 1) * sizeof *g);
    float *partial = nt > 1 ? malloc((size_t)(nt - 1) * rows * out * sizeof *partial) : NULL;  /* threads 1.. */
    g = g ? g : own_g;
    int64_t n_active = 0;
    if (norm && xq && cand && g && (nt == 1 || partial)) {
        double *residual = norm + rows, *scale = norm + 2 * rows;
        screen_rows_of_x(x, n, d, xq, norm, residual, scale);  /* a row with a NaN or an infinity: a norm not finite */
        struct screen_ctx screen = {gate_q, gate_s, gate_b, gate_r, gate_n, xq, norm, residual, scale, g, n, d, ff};
        struct screened_ctx ctx = {x, gate, gate_b, up, up_b, down_t, g, n, d, ff, out};
        #pragma omp parallel num_threads(nt) if (nt > 1) reduction(+:n_active)
        {
            int t = omp_get_thread_num(), threads = omp_get_num_threads();
            int64_t lo, hi;
            split(ff, 4, t, threads, &lo, &hi);
            int64_t left = screen_units(&screen, lo, hi, cand + lo);
            n_active += screened_rows(&ctx, t == 0 ? y : partial + (int64_t)(t - 1) * n * out, cand + lo, left);
            #pragma omp barrier
            add_partials(y, partial, down_b, n * out, out, t, threads);
        }
    } else {
        n_active = -1;
    }
    free(norm);
    free(xq);
    free(cand);
    free(own_g);
    free(partial);
    return n_active;
}

/* The row k of w (rows, d) with the largest y_k = w[k]·x + b[k] for one x (d), the first of them if several are: a
 * greedy decoder's next token from its output layer (lambda_gelu.screened_argmax), reading the rows as int8 q with
 * scales s and radii r, nq (screen_rows), a quarter of their bytes. Each y_k is within screen_margin m_k of
 * a_k = s·t·(q·x̃) + b[k], as a gate is in lg_sparse_gated_screened_f32, so the largest y_k is at least
 * L = max_j (a_j − m_j), and only a row with a_k + m_k ≥ L can hold it: those alone are read in float32, their y_k
 * summed in double. A row whose bounds are NaN is read too. Writes the rows read to *n_read; returns k, −1 if
 * buffers could not be allocated, or −2 if x or some y_k read is not finite (the caller then computes every row,
 * to treat them as it treats them). */
int64_t lg_screened_argmax_f32(const float *x, const float *w, const float *b, const int8_t *q, const float *s,
                               const float *r, const float *nq, int64_t rows, int64_t d, int max_threads,
                               int64_t grain, int64_t *n_read) {
    double *bounds = malloc((size_t)(rows > 0 ? rows : 1) * 2 * sizeof *bounds);  /* a_k − m_k, then a_k + m_k */
    int16_t *xq = malloc((size_t)(d > 0 ? d : 1) * sizeof *xq);
    *n_read = 0;
    if (!bounds || !xq) {
        free(bounds);
        free(xq);
        return -1;
    }
    double norm, residual, scale, *lo = bounds, *hi = bounds + rows, floor = -INFINITY;
    screen_rows_of_x(x, 1, d, xq, &norm, &residual, &scale);
    if (!isfinite(norm)) {
        free(bounds);
        free(xq);
        return -2;
    }
    int nt = gate_threads(1, d, rows, max_threads, grain);
    #pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static) reduction(max : floor)
    for (int64_t k0 = 0; k0 < rows; k0 += 4) {
        int m = rows - k0 < 4 ? (int)(rows - k0) : 4;
        int32_t sums[4];
        if (k0 + SCREEN_AHEAD + 4 <= rows)
            prefetch_bytes(q + (k0 + SCREEN_AHEAD) * d, 4 * d);
        sums_i8_i16(q + k0 * d, m, d, xq, sums);
        for (int i = 0; i < m; i++) {
            int64_t k = k0 + i;
            double bk = b ? b[k] : 0.0, product = (double)s[k] * scale * sums[i], a = product + bk;
            double e = screen_margin(product, bk, r[k], nq[k], norm, residual);
            e += 0x1p-50 * (fabs(a) + e);  /* what double rounds in a − e and a + e */
            lo[k] = a - e;
            hi[k] = a + e;
            floor = lo[k] > floor ? lo[k] : floor;  /* a NaN bound leaves it */
        }
    }
    free(xq);
    int64_t best = -1, read = 0;
    double top = -INFINITY;
    for (int64_t k = 0; k < rows && best != -2; k++) {
        if (hi[k] < floor)
            continue;
        const float *row = w + k * d;
        double y = b ? b[k] : 0.0;
        for (int64_t j = 0; j < d; j++)
            y += (double)row[j] * x[j];
        read++;
        if (!isfinite(y))
            best = -2;
        else if (best < 0 || y > top)
            best = k, top = y;
    }
    free(bounds);
    *n_read = read;
    return best;
}

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
 * The projections' rows and the heads are split over the threads.
 * Returns 0, or −1 if buffers could not be allocated (h and the caches unchanged). */
int lg_decode_attention_f32(float *h, const float *norm_w, double eps, int plus_one, const float *q_norm_w,
                            double q_eps, int q_plus_one, const float *k_norm_w, double k_eps, int k_plus_one,
                            const float *post_w, double post_eps, int post_plus_one, double v_eps, int shares,
                            int whole, int rotated_first, const float *qkv,
                            const float *qkv_b, const float *o_w, const float *o_b, const float *cos, const float *sin,
                            float *k_cache, float *v_cache, int64_t pos, int64_t length, int64_t d, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, int64_t rotary_dim, double scaling, double softcap,
                            int max_threads) {
    int64_t nq = heads * head_dim, nk = shares ? 0 : kv_heads * head_dim, rows = nq + 2 * nk;
    int64_t group = heads / kv_heads, own_heads = heads + (shares ? 0 : kv_heads);
    float *x = malloc((size_t)(2 * d + rows + nq + heads * (pos + 1)) * sizeof *x);
    if (!x)
        return -1;
    /* the projections, the heads' outputs, their weights, the attention's output before its norm */
    float *p = x + d, *o = p + rows, *scores = o + nq, *y = scores + heads * (pos + 1);
    float cap = (float)softcap;
    if (eps < 0.0)
        memcpy(x, h, (size_t)d * sizeof *x);
    else
        lg_rms_norm_f32(h, norm_w, x, d, eps, plus_one);
    int nt = max_threads > 1 ? max_threads : 1;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            p[r] = dot_f32(qkv + r * d, x, d) + (qkv_b ? qkv_b[r] : 0.0f);
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
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < d; r++) {
            float out = dot_f32(o_w + r * nq, o, nq) + (o_b ? o_b[r] : 0.0f);
            if (post_w)
                y[r] = out;
            else
                h[r] += out;
        }
    }
    if (post_w) {
        lg_rms_norm_f32(y, post_w, y, d, post_eps, post_plus_one);
        for (int64_t r = 0; r < d; r++)
            h[r] += y[r];
    }
    free(x);
    return 0;
}
