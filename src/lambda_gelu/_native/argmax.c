/* The screened argmax (lambda_gelu.inference.screened_argmax): a greedy decoder's next token through int8 rows. */
#include "int8.h"

/* The row k of w (rows, d) with the largest y_k = w[k]·x + b[k] for one x (d), the first of them if several are: a
 * greedy decoder's next token from its output layer (lambda_gelu.inference.screened_argmax), reading the rows as int8 q with
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
    #pragma omp parallel num_threads(nt) if (nt > 1) reduction(max : floor)
    {
        int64_t first, last;  /* the thread's rows, read as RUNS runs side by side (common.h) */
        split(rows, 4, omp_get_thread_num(), omp_get_num_threads(), &first, &last);
        for (int64_t step = 0; step < runs_steps(first, last); step++) {
            int64_t ks[RUNS];
            int m = runs_step(first, last, step, ks);
            const int8_t *qs[RUNS];
            int32_t sums[RUNS];
            rows_i8(q, ks, m, d, qs);
            sums_i8_i16(qs, m, d, xq, sums);
            for (int i = 0; i < m; i++) {
                int64_t k = ks[i];
                double bk = b ? b[k] : 0.0, product = (double)s[k] * scale * sums[i], a = product + bk;
                double e = screen_margin(product, bk, r[k], nq[k], norm, residual);
                e += 0x1p-50 * (fabs(a) + e);  /* what double rounds in a − e and a + e */
                lo[k] = a - e;
                hi[k] = a + e;
                floor = lo[k] > floor ? lo[k] : floor;  /* a NaN bound leaves it */
            }
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
