/* The sparse-input linear layer (lambda_gelu.inference.sparse): only the weight rows of non-zero inputs read. */
#include "common.h"

/* The inputs (columns of x (n, in)) that are non-zero in some row, in increasing order, written to
 * `active` (room for `in`); returns how many. NaN counts as non-zero, −0 as zero, as `x != 0` does.
 * The same list as lambda_gelu.inference.sparse.active_inputs, without its three tensors and the sync of
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

/* Sparse-input linear layer, float32 (lambda_gelu.inference.sparse): y = x · Wt + b for x (n, in) with mostly
 * zero entries, Wt the transposed weight (in, out). Only the rows of Wt whose input is non-zero in some
 * row of x (the batch's union of active inputs) are read, each once for the whole batch: the memory
 * traffic is that fraction of a dense layer's. Threads split the active rows (whole rows: long
 * sequential reads, requested a few rows ahead) into partial sums that are added at the end. The
 * same sum as the dense layer up to float rounding (zeros contribute exactly nothing to a sum of finite
 * products; the order of the terms differs). */
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
        if (parallel_rows(linear_rows, &ctx, y, NULL, bias, active, n_active, n, out, nt) != 0)
            n_active = -1;
    }
    free(active);
    return n_active;
}
