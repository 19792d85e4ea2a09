/* Sparse gated FFNs (lambda_gelu.inference.gated): once the gate is an exact ReLU, an inactive unit skips its
 * rows of up and down; float32, int8, 4-bit, and float32 with an int8 screen of the gate. */
#include "int4.h"
#include "token.h"

/* Unit k of a gated block for the m ≤ 4 rows rs[0..m) of x (n, d): acc's row r (out wide) += g[r, k]·(u_row · x_r +
 * u_b)·w for each, their up products side by side (dots4p_f32: the unit's row read once for them). */
static inline void unit_some_rows_f32(const float *x, const float *g, int64_t k, const float *u_row, float u_b,
                                      const float *w, float *acc, const int64_t *rs, int m, int64_t d, int64_t ff,
                                      int64_t out) {
    float u[4];
    dots4p_f32(u_row, x + rs[0] * d, x + rs[m > 1 ? 1 : 0] * d, x + rs[m > 2 ? 2 : 0] * d, x + rs[m > 3 ? 3 : 0] * d,
               m, d, u);
    for (int i = 0; i < m; i++) {
        float h = g[rs[i] * ff + k] * (u[i] + u_b), *yr = acc + rs[i] * out;
        for (int64_t j = 0; j < out; j++)
            yr[j] = FMA(h, w[j], yr[j]);
    }
}

/* One unit k of a gated block over the n rows of x (n, d): adds g[r, k]·(u_row · x_r + u_b)·w to acc's row r (out
 * wide) for each row r where g[r, k] ≠ 0 (every row if `dense`), the up products of four such rows at a time: a row
 * whose gate is 0 costs nothing. Returns whether some row's g was nonzero. */
static inline int unit_rows_f32(const float *x, const float *g, int64_t k, const float *u_row, float u_b,
                                const float *w, float *acc, int64_t n, int64_t d, int64_t ff, int64_t out, int dense) {
    int active = 0, m = 0;
    int64_t rs[4];
    for (int64_t r = 0; r < n; r++) {
        float gk = g[r * ff + k];
        active |= gk != 0.0f;
        if (gk == 0.0f && !dense)
            continue;
        rs[m++] = r;
        if (m == 4)
            unit_some_rows_f32(x, g, k, u_row, u_b, w, acc, rs, m, d, ff, out), m = 0;
    }
    if (m)
        unit_some_rows_f32(x, g, k, u_row, u_b, w, acc, rs, m, d, ff, out);
    return active;
}

/* Sparse gated FFN, float32 (lambda_gelu.inference.gated): y = Σ_k (g[:, k] · (x · up[k] + up_b[k])) downᵀ[k] over
 * the units k active in some row of g = relu(gate(x)) (n, ff), already computed (up_b: up's bias, or null for none).
 * Unit k's rows of up (d wide) and downᵀ (out wide) lie at up + k·stride and down_t + k·stride (unit_rows: one block
 * of rows [gate | up | downᵀ], stride 2·d + out): an active unit reads its two rows, one run of bytes, once for the
 * whole batch; an inactive one reads neither. Threads split the active units into partial sums added at the end, in
 * parallel_rows, which adds down's bias. */
static void sparse_gated_rows_f32(int dense, const float *x, const float *g, const float *up, const float *up_b,
                                  const float *down_t, float *acc,
                                  const int64_t *active, int64_t a0, int64_t a1, int64_t n, int64_t d, int64_t ff,
                                  int64_t out, int64_t stride) {
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = a0; a < a1 && a < a0 + PREFETCH_ROWS; a++) {
        prefetch_row(up + active[a] * stride, d);
        prefetch_row(down_t + active[a] * stride, out);
    }
    for (int64_t a = a0; a < a1; a++) {
        int64_t k = active[a];
        const float *u_row = up + k * stride, *w = down_t + k * stride;
        if (a + PREFETCH_ROWS < a1) {
            prefetch_row(up + active[a + PREFETCH_ROWS] * stride, d);
            prefetch_row(down_t + active[a + PREFETCH_ROWS] * stride, out);
        }
        unit_rows_f32(x, g, k, u_row, up_b ? up_b[k] : 0.0f, w, acc, n, d, ff, out, dense);
    }
}

struct gated_ctx { const float *x, *g, *up, *up_b, *down_t; int64_t n, d, ff, out, stride; int dense; };

static void gated_rows(const void *c, float *acc, const int64_t *active, int64_t a0, int64_t a1) {
    const struct gated_ctx *q = c;
    sparse_gated_rows_f32(q->dense, q->x, q->g, q->up, q->up_b, q->down_t, acc, active, a0, a1, q->n, q->d, q->ff,
                          q->out, q->stride);
}

/* A gated block's sum over its units (every unit if `dense`, else those active in some row of g (n, ff)): if there
 * are at most `max_active`, `rows` sums them into y with `ctx` on up to max_threads threads (one per `grain`
 * multiply-adds), scales each output by `scale` (int8 downᵀ rows' per-output scales, or null), adds `bias` (down's,
 * or null) and their count is returned; if more, that count and y untouched (the caller runs the dense block); −1 if
 * buffers could not be allocated. */
static int64_t gated_units(rows_fn rows, const void *ctx, const float *g, const float *scale, const float *bias,
                           float *y, int64_t n, int64_t d, int64_t ff, int64_t out, int64_t max_active, int dense,
                           int max_threads, int64_t grain) {
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
        if (parallel_rows(rows, ctx, y, scale, bias, active, n_active, n, out, nt) != 0)
            n_active = -1;
    }
    free(active);
    return n_active;
}

static int64_t sparse_gated_f32(int dense, const float *x, const float *g, const float *up, const float *up_b,
                                const float *down_t, const float *down_b, float *y, int64_t n, int64_t d, int64_t ff,
                                int64_t out, int64_t stride, int64_t max_active, int max_threads, int64_t grain) {
    struct gated_ctx ctx = {x, g, up, up_b, down_t, n, d, ff, out, stride, dense};
    return gated_units(gated_rows, &ctx, g, NULL, down_b, y, n, d, ff, out, max_active, dense, max_threads, grain);
}

/* One call: the sparse block from g = relu(gate(x)) (n, ff), already computed; up_b and down_b: the biases, or null. */
int64_t lg_sparse_gated_f32(const float *x, const float *g, const float *up, const float *up_b, const float *down_t,
                            const float *down_b, float *y, int64_t n, int64_t d, int64_t ff, int64_t out,
                            int64_t stride, int64_t max_active, int max_threads, int64_t grain) {
    return sparse_gated_f32(0, x, g, up, up_b, down_t, down_b, y, n, d, ff, out, stride, max_active, max_threads,
                            grain);
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

/* The same with the gate computed here too, g = relu(x · gateᵀ + gate_b) into the caller's g (n, ff), for a batch of
 * a few rows (a short prompt's; decoding unscreened): each row of gate (ff, d, contiguous: the layer's own weight) read
 * once for the batch, the units split over the threads — at batch 1 a matrix-vector product bound by reading the rows,
 * which this loop does as fast as the BLAS's and without the separate calls a torch gate costs — then the active
 * units' up and downᵀ rows (`stride` apart). Every gate row is read here, so the gate is read as one stream, not from
 * a block of unit rows whose gate rows lie apart: measured side by side over SmolLM2's 30 FFNs, the block's gate rows
 * cost ×1.29 at 1 row and ×1.11–×1.13 at 15–24. The caller runs the dense block from g where this returns more than
 * max_active. `dense` nonzero: every unit is computed, zero or not (this loop without the sparsity, to compare). */
int64_t lg_sparse_gated_fused_f32(const float *x, const float *gate, const float *gate_b, const float *up,
                                  const float *up_b, const float *down_t, const float *down_b, float *g, float *y,
                                  int64_t n, int64_t d, int64_t ff, int64_t out, int64_t stride, int64_t max_active,
                                  int dense, int max_threads, int64_t grain) {
    int nt = gate_threads(n, d, ff, max_threads, grain);
    #pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k = 0; k < ff; k++)
        relu_gates_f32(gate + k * d, gate_b ? gate_b[k] : 0.0f, x, n, d, g + k, ff);
    return sparse_gated_f32(dense, x, g, up, up_b, down_t, down_b, y, n, d, ff, out, stride, max_active, max_threads,
                            grain);
}
/* Sparse gated FFN over int8 weights (lambda_gelu.inference.gated, SparseGatedMLP(int8=True)): gate and up (ff, d) are
 * rows of int8 q, each with a float32 scale s, standing for the row s·q; downᵀ (ff, out) is int8 rows q with one
 * float32 scale per output (down's own rows, quantized as rows: downᵀ[k, j] = q[k, j]·s[j], applied once to each
 * output's sum, not to each unit's row); unit k's up and downᵀ rows `stride` bytes after unit k − 1's (unit_rows keeps
 * them side by side: an active unit's two rows are one run of bytes, not two reads far apart); the biases (or null)
 * stay float32. Each row of x is taken as t·x̃, x̃ its int16 rounding (round_rows_i16), so that every q·x̃ is an exact
 * integer sum, several times faster than int8 converted to float (a call whose x holds a NaN or an infinity sums x
 * itself in float, which carries them). The gate is computed here too, g = relu(x · gateᵀ + gate_b) into the caller's g
 * (n, ff) — each unit's row read once for the whole batch, the units split over the threads — then the active units as
 * in the float32 kernel, reading a quarter of its bytes. `dense` nonzero: every unit is computed, zero or not (the same
 * int8 block without the sparsity, to compare). */
static inline float dot_i8(const int8_t *a, const float *b, int64_t n) {
    float s = 0.0f;
    #pragma omp simd reduction(+:s)
    for (int64_t j = 0; j < n; j++)
        s += (float)a[j] * b[j];
    return s;
}

struct gated_i8_ctx { const float *x, *g, *up_s, *up_b; const int8_t *up_q, *down_q; const int16_t *xq;
                      const double *t; float *widened; int64_t n, d, ff, out, stride; int dense, in_float; };

/* s·(q·x) for one int8 row: the exact integer sum over x̃ scaled back (t), or, if x is not finite, in float. */
static inline float row_i8(const int8_t *q, float s, const float *x, const int16_t *xq, double t, int in_float,
                           int64_t d) {
    return in_float ? s * dot_i8(q, x, d) : scaled_i8(s, t, dot_i8_i16(q, xq, d));
}

/* One unit k for the m ≤ 4 rows rs[0..m) of x (n rows): acc's row r (out wide) += g[r, k]·(s_u·(up[k]·x_r) + u_b)·
 * q_down[k], the int8 downᵀ row given widened to float32 in w (its per-output scales come when the sums are added); the
 * up sums of four rows side by side (the unit's row read and widened once for them), in float where x is not finite. */
static inline void unit_rows_i8(const struct gated_i8_ctx *q, int64_t k, const int64_t *rs, int m, const float *w,
                                float *acc) {
    int64_t d = q->d, ff = q->ff, out = q->out;
    const int8_t *u_row = q->up_q + k * q->stride;
    float u[4];
    if (m == 4 && !q->in_float) {
        int32_t sums[4];
        dot4x_i8_i16(u_row, q->xq + rs[0] * d, q->xq + rs[1] * d, q->xq + rs[2] * d, q->xq + rs[3] * d, d, sums);
        for (int i = 0; i < 4; i++)
            u[i] = scaled_i8(q->up_s[k], q->t[rs[i]], sums[i]);
    } else
        for (int i = 0; i < m; i++)
            u[i] = row_i8(u_row, q->up_s[k], q->x + rs[i] * d, q->xq + rs[i] * d, q->t[rs[i]], q->in_float, d);
    for (int i = 0; i < m; i++) {
        float h = q->g[rs[i] * ff + k] * (u[i] + (q->up_b ? q->up_b[k] : 0.0f)), *y = acc + rs[i] * out;
        for (int64_t j = 0; j < out; j++)
            y[j] = FMA(h, w[j], y[j]);
    }
}

/* What a thread sums over the active units [a0, a1) for the n rows of x: each unit's downᵀ row widened to float32
 * once (into the thread's slice of q->widened), then summed into its rows where g ≠ 0 (every row if dense), four at a
 * time. */
static void gated_i8_rows(const void *c, float *acc, const int64_t *active, int64_t a0, int64_t a1) {
    const struct gated_i8_ctx *q = c;
    int64_t n = q->n, d = q->d, ff = q->ff, out = q->out, stride = q->stride;
    float *w = q->widened + (int64_t)omp_get_thread_num() * out;
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = a0; a < a1 && a < a0 + PREFETCH_ROWS; a++) {
        prefetch_bytes(q->up_q + active[a] * stride, d);
        prefetch_bytes(q->down_q + active[a] * stride, out);
    }
    for (int64_t a = a0; a < a1; a++) {
        int64_t k = active[a], rs[4];
        const int8_t *w_q = q->down_q + k * stride;
        if (a + PREFETCH_ROWS < a1) {
            prefetch_bytes(q->up_q + active[a + PREFETCH_ROWS] * stride, d);
            prefetch_bytes(q->down_q + active[a + PREFETCH_ROWS] * stride, out);
        }
        for (int64_t j = 0; j < out; j++)
            w[j] = (float)w_q[j];
        int m = 0;
        for (int64_t r = 0; r < n; r++)
            if (q->g[r * ff + k] != 0.0f || q->dense) {
                rs[m++] = r;
                if (m == 4)
                    unit_rows_i8(q, k, rs, m, w, acc), m = 0;
            }
        if (m)
            unit_rows_i8(q, k, rs, m, w, acc);
    }
}

/* y (n, out) = x (n, d) · (s·q)ᵀ + b for int8 rows q (out, d) with a float32 scale each (b: out, or null), x taken as
 * its int16 rounding (xq, t: round_rows_i16's) for exact integer sums, four rows of x at a time, each of q's rows read
 * once for them, on nt threads; in float where in_float (x holds a NaN or an infinity). `relu`: y = relu(…), NaN kept
 * as torch keeps it (a gate's). */
static void batch_rows_i8(const float *x, const int16_t *xq, const double *t, int in_float, const int8_t *q,
                          const float *s, const float *b, float *y, int64_t n, int64_t d, int64_t out, int relu,
                          int nt) {
    #pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t k = 0; k < out; k++) {
        const int8_t *row = q + k * d;
        for (int64_t r0 = 0; r0 < n; r0 += 4) {
            int m = n - r0 < 4 ? (int)(n - r0) : 4;
            float v[4];
            if (m == 4 && !in_float) {
                int32_t sums[4];
                dot4x_i8_i16(row, xq + r0 * d, xq + (r0 + 1) * d, xq + (r0 + 2) * d, xq + (r0 + 3) * d, d, sums);
                for (int i = 0; i < 4; i++)
                    v[i] = scaled_i8(s[k], t[r0 + i], sums[i]);
            } else
                for (int i = 0; i < m; i++)
                    v[i] = row_i8(row, s[k], x + (r0 + i) * d, xq + (r0 + i) * d, t[r0 + i], in_float, d);
            for (int i = 0; i < m; i++) {
                float vk = b ? v[i] + b[k] : v[i];
                y[(r0 + i) * out + k] = !relu || vk > 0.0f || vk != vk ? vk : 0.0f;
            }
        }
    }
}

/* One call: a batch's projection over int8 rows (a prompt's attention, lambda_gelu.inference.int8.linear_i8), summed
 * as the decoding step sums its int8 projections; 0, or −1 if its buffers could not be allocated. */
int lg_linear_i8(const float *x, const int8_t *q, const float *s, const float *b, float *y, int64_t n, int64_t d,
                 int64_t out, int max_threads, int64_t grain) {
    int16_t *xq = malloc((size_t)(n > 0 ? n : 1) * (d > 0 ? d : 1) * sizeof *xq);
    double *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    if (!xq || !t) {
        free(xq);
        free(t);
        return -1;
    }
    int in_float = round_rows_i16(x, n, d, xq, t);
    batch_rows_i8(x, xq, t, in_float, q, s, b, y, n, d, out, 0, gate_threads(n, d, out, max_threads, grain));
    free(xq);
    free(t);
    return 0;
}

static int64_t one_row(const struct lg_ffn *f, const float *x, float *g, float *y, int64_t d, int nt);

int64_t lg_sparse_gated_i8(const float *x, const int8_t *gate_q, const float *gate_s, const float *gate_b,
                           const int8_t *up_q, const float *up_s, const float *up_b, const int8_t *down_q,
                           const float *down_s, const float *down_b, float *g, float *y, int64_t n, int64_t d,
                           int64_t ff, int64_t out, int64_t stride, int dense, int max_threads, int64_t grain) {
    if (n == 1 && !dense) {  /* decoding: the gate and the active units in one pass, lg_ffn_team's */
        struct lg_ffn f = {.eps = -1.0, .scale = 1.0, .int8 = 1, .gate_q = gate_q, .up_q = up_q, .down_q = down_q,
                           .gate_s = gate_s, .up_s = up_s, .down_s = down_s, .gate_b = gate_b, .up_b = up_b,
                           .down_b = down_b, .ff = ff, .out = out, .stride = stride};
        return one_row(&f, x, g, y, d, gate_threads(n, d, ff, max_threads, grain));
    }
    int16_t *xq = malloc((size_t)(n > 0 ? n : 1) * (d > 0 ? d : 1) * sizeof *xq);
    double *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    float *widened = malloc((size_t)(max_threads > 1 ? max_threads : 1) * (out > 0 ? out : 1) * sizeof *widened);
    if (!xq || !t || !widened) {
        free(xq);
        free(t);
        free(widened);
        return -1;
    }
    int in_float = round_rows_i16(x, n, d, xq, t);  /* a NaN or an infinity is carried by float sums only */
    int nt = gate_threads(n, d, ff, max_threads, grain);
    batch_rows_i8(x, xq, t, in_float, gate_q, gate_s, gate_b, g, n, d, ff, 1, nt);  /* the gate, relu'd */
    struct gated_i8_ctx ctx = {x, g, up_s, up_b, up_q, down_q, xq, t, widened, n, d, ff, out, stride, dense, in_float};
    int64_t n_active = gated_units(gated_i8_rows, &ctx, g, down_s, down_b, y, n, d, ff, out, ff, dense, max_threads,
                                   grain);
    free(xq);
    free(t);
    free(widened);
    return n_active;
}

/* What one thread of lg_sparse_gated_screened_f32 does over the units cand[0:m) its screen left, in three stages
 * UNITS_AHEAD units apart: a unit's float32 gate row is requested; then its gate computed into g (n, ff) and, only if
 * it is not 0 in some row, its up and downᵀ rows requested; then those rows summed into acc as in
 * sparse_gated_rows_f32. A unit the screen left but the exact gate zeroes costs its gate row alone. Returns the units
 * active in some row. */
#define UNITS_AHEAD 8
struct screened_ctx { const float *x, *gate, *gate_b, *up, *up_b, *down_t; float *g; int64_t n, d, ff, out, stride; };

static inline void screened_gate(const struct screened_ctx *q, int64_t k) {
    if (relu_gates_f32(q->gate + k * q->stride, q->gate_b ? q->gate_b[k] : 0.0f, q->x, q->n, q->d, q->g + k, q->ff)) {
        prefetch_row(q->up + k * q->stride, q->d);
        prefetch_row(q->down_t + k * q->stride, q->out);
    }
}

static int64_t screened_rows(const struct screened_ctx *q, float *acc, const int64_t *cand, int64_t m) {
    int64_t n = q->n, d = q->d, ff = q->ff, out = q->out, stride = q->stride, n_active = 0;
    for (int64_t k = 0; k < n * out; k++)
        acc[k] = 0.0f;
    for (int64_t a = 0; a < m && a < 2 * UNITS_AHEAD; a++)
        prefetch_row(q->gate + cand[a] * stride, d);
    for (int64_t a = 0; a < m && a < UNITS_AHEAD; a++)
        screened_gate(q, cand[a]);
    for (int64_t a = 0; a < m; a++) {
        if (a + 2 * UNITS_AHEAD < m)
            prefetch_row(q->gate + cand[a + 2 * UNITS_AHEAD] * stride, d);
        if (a + UNITS_AHEAD < m)
            screened_gate(q, cand[a + UNITS_AHEAD]);
        int64_t k = cand[a];
        n_active += unit_rows_f32(q->x, q->g, k, q->up + k * stride, q->up_b ? q->up_b[k] : 0.0f,
                                  q->down_t + k * stride, acc, n, d, ff, out, 0);
    }
    return n_active;
}

/* The float32 block of lg_sparse_gated_fused_f32 with its gate screened by int8 rows (lambda_gelu.inference.gated,
 * SparseGatedMLP(screen=True)). The gate's rows are read as int8 q with scales s, a quarter of their bytes, and
 * each row x of the batch as int16 x̃ with one scale t = max|x| / screen_scale(d), rounded to nearest. With the exact
 * integer sum S = q·x̃, a = s·t·S + gate_b (in double) is within
 *     r·‖x‖₂ + n·‖x − t·x̃‖₂ + 2⁻⁴⁸·(|s·t·S| + |gate_b|)
 * of the exact gate x·gate[k] + gate_b: r ≥ ‖gate[k] − s·q‖₂ and n ≥ s·‖q‖₂ (one each per row, rounded up;
 * screen_rows) by Cauchy–Schwarz on x·(gate[k] − s·q) + s·q·(x − t·x̃), plus double's roundings of a. The norms are
 * computed in double and rounded up. A unit whose a plus that margin is ≤ 0 in every row of the batch has an exact
 * gate ≤ 0: its g is 0 and none of its float32 rows is read. Every other unit's gate is computed from its float32
 * row, as in the unscreened kernel (unit k's gate, up and downᵀ rows `stride` floats after unit k − 1's, as there)
 * — so g and y are that kernel's up to float rounding, and a unit the screen leaves out is one the exact ReLU
 * zeroes. The bound fails safe: a row of x with a NaN or an infinity certifies nothing, nor does a NaN or infinite
 * margin. One parallel region: each thread screens its own share of the units (its int8 rows read in order, one
 * after another; screen_units), then sums the units it left (screened_rows) into its partial, and the partials are
 * added.
 * Writes g and y, whatever the count (g may be NULL: the gates then go to a buffer of its own, for a caller that wants
 * y alone); returns the units active in some row, or −1 if buffers could not be allocated. */
struct screen_ctx { const int8_t *q; const float *s, *b, *r, *nq; const int16_t *xq; const double *norm, *residual,
                    *scale; float *g; int64_t n, d, ff; };

/* Screens the units [lo, hi) for every row of x (their int8 rows read as RUNS runs side by side, common.h), zeroes
 * their g, and lists those the screen leaves (whose exact gate may be positive in some row) in cand; returns how
 * many. */
static int64_t screen_units(const struct screen_ctx *c, int64_t lo, int64_t hi, int64_t *cand) {
    int64_t n = c->n, d = c->d, ff = c->ff, m_left = 0;
    for (int64_t step = 0; step < runs_steps(lo, hi); step++) {
        int64_t ks[RUNS];
        int m = runs_step(lo, hi, step, ks), exact[RUNS] = {0};
        const int8_t *rows[RUNS];
        rows_i8(c->q, ks, m, d, rows);
        for (int64_t r = 0; r < n; r++) {
            int32_t sums[RUNS];
            sums_i8_i16(rows, m, d, c->xq + r * d, sums);
            for (int i = 0; i < m; i++) {
                int64_t k = ks[i];
                double b = c->b ? c->b[k] : 0.0, product = (double)c->s[k] * c->scale[r] * sums[i];
                double margin = screen_margin(product, b, c->r[k], c->nq[k], c->norm[r], c->residual[r]);
                exact[i] |= !(product + b + margin <= 0.0 && isfinite(c->norm[r]));
            }
        }
        for (int i = 0; i < m; i++) {
            if (exact[i])
                cand[m_left++] = ks[i];
            for (int64_t r = 0; r < n; r++)
                c->g[r * ff + ks[i]] = 0.0f;  /* the units left get theirs in screened_rows */
        }
    }
    return m_left;
}

int64_t lg_sparse_gated_screened_f32(const float *x, const float *gate, const float *gate_b, const int8_t *gate_q,
                                     const float *gate_s, const float *gate_r, const float *gate_n, const float *up,
                                     const float *up_b, const float *down_t, const float *down_b, float *g, float *y,
                                     int64_t n, int64_t d, int64_t ff, int64_t out, int64_t stride, int max_threads,
                                     int64_t grain) {
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
        struct screened_ctx ctx = {x, gate, gate_b, up, up_b, down_t, g, n, d, ff, out, stride};
        #pragma omp parallel num_threads(nt) if (nt > 1) reduction(+:n_active)
        {
            int t = omp_get_thread_num(), threads = omp_get_num_threads();
            int64_t lo, hi;
            split(ff, 4, t, threads, &lo, &hi);
            int64_t left = screen_units(&screen, lo, hi, cand + lo);
            n_active += screened_rows(&ctx, t == 0 ? y : partial + (int64_t)(t - 1) * n * out, cand + lo, left);
            #pragma omp barrier
            add_partials(y, partial, NULL, down_b, n * out, out, t, threads);
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

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 widen8(const int8_t *p) {  /* eight int8 as float32 */
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#endif

/* acc (out) += Σ over the m ≤ 4 units k[0..m) of g[k]·(s_u·(up[k]·x) + u_b)·q_down[k] (the int8 downᵀ rows, their
 * per-output scales applied by add_partials): their up rows summed one after another and their downᵀ rows added to
 * acc in one pass over it, in the units' order (the sums unit_rows_i8 makes one unit at a time). */
static inline void units4_i8(const struct lg_ffn *f, const int64_t *k, int m, const float *g, const float *x,
                             const int16_t *xq, double t, int in_float, int64_t d, float *restrict acc) {
    int64_t out = f->out, stride = f->stride;
    float h[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int8_t *w[4], *up = f->up_q;
    for (int i = 0; i < m; i++)
        h[i] = row_i8(up + k[i] * stride, f->up_s[k[i]], x, xq, t, in_float, d);
    for (int i = 0; i < 4; i++) {
        w[i] = f->down_q + k[i < m ? i : 0] * stride;
        h[i] = i < m ? g[k[i]] * (f->up_b ? h[i] + f->up_b[k[i]] : h[i]) : 0.0f;
    }
    const int8_t *restrict w0 = w[0], *restrict w1 = w[1], *restrict w2 = w[2], *restrict w3 = w[3];
    float h0 = h[0], h1 = h[1], h2 = h[2], h3 = h[3];
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)  /* the loop below eight at a time, int8 widened in one step, not 3 */
    __m256 v0 = _mm256_set1_ps(h0), v1 = _mm256_set1_ps(h1), v2 = _mm256_set1_ps(h2), v3 = _mm256_set1_ps(h3);
    for (; j + 8 <= out; j += 8) {
        __m256 a = _mm256_fmadd_ps(v0, widen8(w0 + j), _mm256_loadu_ps(acc + j));
        a = _mm256_fmadd_ps(v1, widen8(w1 + j), a);
        a = _mm256_fmadd_ps(v3, widen8(w3 + j), _mm256_fmadd_ps(v2, widen8(w2 + j), a));
        _mm256_storeu_ps(acc + j, a);
    }
#endif
    for (; j < out; j++)
        acc[j] = FMA(h3, (float)w3[j], FMA(h2, (float)w2[j], FMA(h1, (float)w1[j], FMA(h0, (float)w0[j], acc[j]))));
}

/* What one thread's pass over its units needs of a row format: the values of m ≤ 4 gates' rows k[0..m) into v, and
 * the sums of m ≤ 4 active units k[0..m) into acc; ctx holds x as that format takes it. */
typedef void (*gates4_fn)(const struct lg_ffn *f, const void *ctx, const int64_t *k, int m, int64_t d, float *v);
typedef void (*units4_fn)(const struct lg_ffn *f, const void *ctx, const int64_t *k, int m, const float *g, int64_t d,
                          float *acc);

/* One token's FFN, a thread's share [lo, hi) of the units four at a time, int8 and 4-bit rows alike: their gates
 * (gates4, the rows read as RUNS runs side by side, common.h), and each unit found active has its up and downᵀ rows
 * (up_bytes, down_bytes) requested then and summed (units4) UNITS_AHEAD units later, while the next gate rows stream
 * in: one pass over the block, no list between the gate and the units, no barrier. Returns the units active. */
static inline int64_t units_pass(const struct lg_ffn *f, const void *ctx, gates4_fn gates4, units4_fn units4,
                                 int64_t up_bytes, int64_t down_bytes, int64_t lo, int64_t hi, int64_t d, float *g,
                                 int64_t *units, float *acc) {
    int64_t queued = 0, done = 0;
    for (int64_t j = 0; j < f->out; j++)
        acc[j] = 0.0f;
    for (int64_t step = 0; step < runs_steps(lo, hi); step++) {
        int64_t ks[RUNS];
        int m = runs_step(lo, hi, step, ks);
        float v[RUNS];
        gates4(f, ctx, ks, m, d, v);
        for (int i = 0; i < m; i++) {
            int64_t k = ks[i];
            float vk = f->gate_b ? v[i] + f->gate_b[k] : v[i];
            g[k] = vk > 0.0f || vk != vk ? vk : 0.0f;  /* relu, NaN kept as torch keeps it */
            if (g[k] != 0.0f) {
                units[queued++] = k;
                prefetch_bytes(f->up_q + k * f->stride, up_bytes);
                prefetch_bytes(f->down_q + k * f->stride, down_bytes);
            }
        }
        for (; queued - done >= UNITS_AHEAD + 4; done += 4)
            units4(f, ctx, units + done, 4, g, d, acc);
    }
    for (; done < queued; done += 4)
        units4(f, ctx, units + done, queued - done < 4 ? (int)(queued - done) : 4, g, d, acc);
    return queued;
}

/* int8 rows against x rounded to int16 (x̃, scale t), or x itself in float where it is not finite. */
struct i8_ctx { const float *x; const int16_t *xq; double t; int in_float; };

static inline void gates4_i8(const struct lg_ffn *f, const void *ctx, const int64_t *k, int m, int64_t d, float *v) {
    const struct i8_ctx *c = ctx;
    if (c->in_float) {
        for (int i = 0; i < m; i++)
            v[i] = row_i8(f->gate_q + k[i] * d, f->gate_s[k[i]], c->x, c->xq, c->t, 1, d);
        return;
    }
    const int8_t *rows[RUNS];
    int32_t sums[RUNS];
    rows_i8(f->gate_q, k, m, d, rows);
    sums_i8_i16(rows, m, d, c->xq, sums);
    for (int i = 0; i < m; i++)
        v[i] = scaled_i8(f->gate_s[k[i]], c->t, sums[i]);
}

static inline void units4_i8_ctx(const struct lg_ffn *f, const void *ctx, const int64_t *k, int m, const float *g,
                                 int64_t d, float *acc) {
    const struct i8_ctx *c = ctx;
    units4_i8(f, k, m, g, c->x, c->xq, c->t, c->in_float, d, acc);
}

/* 4-bit rows (int4.h) against x rounded to int8 (x̂, the same in pair order xp, scale t, block sums xs), or x itself
 * in float where it is not finite: the gates and the active units' up rows four at a time (q4_rows), their downᵀ
 * rows added to acc in one pass over it (q4_add). */
struct q4_ctx { const int8_t *xq, *xp; const int16_t *xs; const float *x; double t; int in_float; };

static inline void gates4_q4(const struct lg_ffn *f, const void *ctx, const int64_t *k, int m, int64_t d, float *v) {
    const struct q4_ctx *c = ctx;
    int64_t width = q4_row_bytes(d);
    const uint8_t *gate = (const uint8_t *)f->gate_q, *rows[RUNS];
    float s[RUNS];
    for (int i = 0; i < m; i++)
        rows[i] = gate + k[i] * width, s[i] = f->gate_s[k[i]];
    if (c->in_float)
        for (int i = 0; i < m; i++)
            v[i] = q4_row_f32(rows[i], s[i], c->x, d);
    else
        q4_rows(rows, m, s, c->xq, c->xp, c->xs, c->t, d, v);
}

static inline void units4_q4(const struct lg_ffn *f, const void *ctx, const int64_t *k, int m, const float *g,
                             int64_t d, float *acc) {
    const struct q4_ctx *c = ctx;
    const uint8_t *up[4], *down[4];
    float h[4], s[4];
    for (int i = 0; i < m; i++) {
        up[i] = (const uint8_t *)f->up_q + k[i] * f->stride, down[i] = (const uint8_t *)f->down_q + k[i] * f->stride;
        s[i] = f->up_s[k[i]];
    }
    if (c->in_float)
        for (int i = 0; i < m; i++)
            h[i] = q4_row_f32(up[i], s[i], c->x, d);
    else
        q4_rows(up, m, s, c->xq, c->xp, c->xs, c->t, d, h);
    for (int i = 0; i < m; i++) {
        h[i] = g[k[i]] * (f->up_b ? h[i] + f->up_b[k[i]] : h[i]);
        s[i] = f->down_s[k[i]];
    }
    q4_add(down, m, s, h, f->out, acc);
}

/* One token's FFN inside a team (token.h): each thread's share of the units in one pass (units_pass), int8 or 4-bit;
 * float32, screened as lg_sparse_gated_screened_f32 screens (screen_units, screened_rows). The threads' partial sums
 * are added, down's bias with them, then the norm after the block and its scale. */
void lg_ffn_team(const struct lg_ffn *f, float *h, int add, int64_t d, struct lg_ffn_scratch *s) {
    int t = omp_get_thread_num(), threads = omp_get_num_threads(), in_float = 0;
    int64_t ff = f->ff, out = f->out, lo, hi, n_active;
    double *stats = s->stats;  /* x's norm, its residual and its scale */
    prefetch_share(f->gate_q, ff, f->int4 ? q4_row_bytes(d) : d);
    #pragma omp single copyprivate(in_float)
    {
        if (f->eps < 0.0)
            memcpy(s->x, h, (size_t)d * sizeof *h);
        else
            lg_rms_norm_f32(h, f->norm_w, s->x, d, f->eps, f->plus_one);
        if (f->int4) {
            in_float = round_row_i8(s->x, d, s->x8, stats + 2) || f->int4 == 2;
            block_sums_i8(s->x8, d, s->xs);
            q4_pair_order(s->x8, d, s->xp);
        } else if (f->int8)
            in_float = round_rows_i16(s->x, 1, d, s->xq, stats + 2);
        else  /* a NaN or an infinity: a norm not finite, which certifies nothing */
            screen_rows_of_x(s->x, 1, d, s->xq, stats, stats + 1, stats + 2);
        s->active = 0;
    }
    split(ff, 4, t, threads, &lo, &hi);
    float *acc = t == 0 ? s->y : s->partial + (int64_t)(t - 1) * out;
    if (f->int4) {
        struct q4_ctx c = {s->x8, s->xp, s->xs, s->x, stats[2], in_float};
        n_active = units_pass(f, &c, gates4_q4, units4_q4, q4_row_bytes(d), q4_row_bytes(out), lo, hi, d, s->g,
                              s->units + lo, acc);
    } else if (f->int8) {
        struct i8_ctx c = {s->x, s->xq, stats[2], in_float};
        n_active = units_pass(f, &c, gates4_i8, units4_i8_ctx, d, out, lo, hi, d, s->g, s->units + lo, acc);
    } else {
        struct screen_ctx screen = {f->gate_q, f->gate_s, f->gate_b, f->gate_r, f->gate_n, s->xq, stats, stats + 1,
                                    stats + 2, s->g, 1, d, ff};
        struct screened_ctx ctx = {s->x, f->gate, f->gate_b, f->up, f->up_b, f->down_t, s->g, 1, d, ff, out,
                                   f->stride};
        n_active = screened_rows(&ctx, acc, s->units + lo, screen_units(&screen, lo, hi, s->units + lo));
    }
    #pragma omp atomic
    s->active += n_active;
    #pragma omp barrier
    add_partials(s->y, s->partial, f->int8 ? f->down_s : NULL, f->down_b, out, out, t, threads);
    #pragma omp barrier
    #pragma omp single
    {
        if (f->post_w)
            lg_rms_norm_f32(s->y, f->post_w, s->y, out, f->post_eps, f->post_plus_one);
        if (f->scale != 1.0)
            for (int64_t j = 0; j < out; j++)
                s->y[j] *= (float)f->scale;
        if (add)
            for (int64_t j = 0; j < out; j++)
                h[j] += s->y[j];
    }
}

int lg_ffn_scratch(int64_t d, int64_t ff, int64_t out, int threads, struct lg_ffn_scratch *s) {
    d = d > 0 ? d : 1, ff = ff > 0 ? ff : 1, out = out > 0 ? out : 1;
    s->x = malloc((size_t)(d + ff + (threads > 1 ? threads - 1 : 0) * out + out) * sizeof *s->x);
    s->xq = malloc((size_t)(d + d / Q4_BLOCK + 1) * sizeof *s->xq + 2 * (size_t)d);
    s->units = malloc((size_t)ff * sizeof *s->units);
    s->stats = malloc(3 * sizeof *s->stats);
    if (!s->x || !s->xq || !s->units || !s->stats) {
        lg_ffn_scratch_free(s);
        return -1;
    }
    s->g = s->x + d, s->partial = s->g + ff, s->y = s->partial + (threads > 1 ? threads - 1 : 0) * out;
    s->xs = s->xq + d, s->x8 = (int8_t *)(s->xs + d / Q4_BLOCK + 1), s->xp = s->x8 + d;
    return 0;
}

void lg_ffn_scratch_free(struct lg_ffn_scratch *s) {  /* g, partial and y lie in x's block; xs, x8, xp in xq's */
    free(s->x);
    free(s->xq);
    free(s->units);
    free(s->stats);
}

/* One row x (d) through f in a team of nt threads of its own, into the caller's g (ff; NULL: a buffer) and y (out);
 * returns the units active, or −1 if buffers could not be allocated. */
static int64_t one_row(const struct lg_ffn *f, const float *x, float *g, float *y, int64_t d, int nt) {
    struct lg_ffn_scratch s;
    if (lg_ffn_scratch(d, f->ff, f->out, nt, &s) != 0)
        return -1;
    s.y = y, s.g = g ? g : s.g;
    #pragma omp parallel num_threads(nt) if (nt > 1)
    lg_ffn_team(f, (float *)x, 0, d, &s);  /* add = 0: x only read */
    lg_ffn_scratch_free(&s);
    return s.active;
}

/* The sparse gated FFN over 4-bit rows (lambda_gelu.inference.gated, SparseGatedMLP(int4=True)) for the n rows of x,
 * one after the other, each as a decoded token's (lg_ffn_team): the gates into g (n, ff), the block into y (n, out).
 * The rows and scales as struct lg_ffn holds them; in_float: x summed as it is, in float, not rounded to int8.
 * Returns the units active in the last row, or −1 if buffers could not be allocated. */
int64_t lg_sparse_gated_q4(const float *x, const uint8_t *gate_q, const float *gate_s, const float *gate_b,
                           const uint8_t *up_q, const float *up_s, const float *up_b, const uint8_t *down_q,
                           const float *down_s, const float *down_b, float *g, float *y, int64_t n, int64_t d,
                           int64_t ff, int64_t out, int64_t stride, int in_float, int max_threads, int64_t grain) {
    struct lg_ffn f = {.eps = -1.0, .scale = 1.0, .int4 = in_float ? 2 : 1, .gate_q = (const int8_t *)gate_q,
                       .up_q = (const int8_t *)up_q, .down_q = (const int8_t *)down_q, .gate_s = gate_s, .up_s = up_s,
                       .down_s = down_s, .gate_b = gate_b, .up_b = up_b, .down_b = down_b, .ff = ff, .out = out,
                       .stride = stride};
    int nt = gate_threads(1, d, ff, max_threads, grain);
    int64_t active = 0;
    for (int64_t r = 0; r < n && active >= 0; r++)
        active = one_row(&f, x + r * d, g + r * ff, y + r * out, d, nt);
    return active;
}
