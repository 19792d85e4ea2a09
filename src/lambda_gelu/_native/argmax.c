/* The screened argmax (lambda_gelu.inference.screened_argmax): a greedy decoder's next token through int8 rows. */
#include "int8.h"

/* The row k of w (rows, d) with the largest y_k = w[k]·x + b[k] for one x (d), the first of them if several are: a
 * greedy decoder's next token from its output layer (lambda_gelu.inference.screened_argmax), reading the rows as int8 q
 * with scales s and radii r, nq (screen_rows), a quarter of their bytes. Each y_k is within screen_margin m_k of
 * a_k = s·t·(q·x̃) + b[k], as a gate is in lg_sparse_gated_screened_f32, so the largest y_k is at least
 * L = max_j (a_j − m_j), and only a row with a_k + m_k ≥ L can hold it: those alone are read in float32, their y_k
 * summed in double. A row whose bounds are NaN is read too. Each thread screens its share of the rows (read as RUNS
 * runs side by side, common.h) and keeps a row only if a_k + m_k reaches the L of the rows it has screened so far (no
 * lower than the final L): a list of a few rows, where bounds for all would be two more streams of writes. Writes
 * the rows read to *n_read; returns k, −1 if buffers could not be allocated, or −2 if x or some y_k read is not
 * finite (the caller then computes every row, to treat them as it treats them). */
int64_t lg_screened_argmax_f32(const float *x, const float *w, const float *b, const int8_t *q, const float *s,
                               const float *r, const float *nq, int64_t rows, int64_t d, int max_threads,
                               int64_t grain, int64_t *n_read) {
    int nt = gate_threads(1, d, rows, max_threads, grain);
    size_t n = (size_t)(rows > 0 ? rows : 1);
    int64_t *kept = malloc(n * sizeof *kept), *shares = calloc(2 * (size_t)nt, sizeof *shares);
    double *kept_hi = malloc(n * sizeof *kept_hi);  /* a_k + m_k of the rows kept */
    int16_t *xq = malloc((size_t)(d > 0 ? d : 1) * sizeof *xq);
    double norm = NAN, residual, scale, floor = -INFINITY;
    *n_read = 0;
    if (kept && shares && kept_hi && xq)
        screen_rows_of_x(x, 1, d, xq, &norm, &residual, &scale);
    if (!isfinite(norm)) {  /* not allocated, or x not finite */
        int64_t code = kept && shares && kept_hi && xq ? -2 : -1;
        free(kept), free(shares), free(kept_hi), free(xq);
        return code;
    }
    #pragma omp parallel num_threads(nt) if (nt > 1) reduction(max : floor)
    {
        int t = omp_get_thread_num();
        int64_t first, last, count = 0;  /* the thread's rows; its list from kept + first */
        split(rows, 4, t, omp_get_num_threads(), &first, &last);
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
                floor = a - e > floor ? a - e : floor;  /* a NaN bound leaves it */
                if (!(a + e < floor))
                    kept[first + count] = k, kept_hi[first + count++] = a + e;
            }
        }
        shares[2 * t] = first, shares[2 * t + 1] = count;
    }
    free(xq);
    int64_t best = -1, read = 0;
    double top = -INFINITY;
    for (int t = 0; t < nt && best != -2; t++) {
        for (int64_t c = shares[2 * t]; c < shares[2 * t] + shares[2 * t + 1] && best != -2; c++) {
            int64_t k = kept[c];
            if (kept_hi[c] < floor)
                continue;
            const float *row = w + k * d;
            double y = b ? b[k] : 0.0;
            for (int64_t j = 0; j < d; j++)
                y += (double)row[j] * x[j];
            read++;
            if (!isfinite(y))
                best = -2;
            else if (best < 0 || y > top || (y == top && k < best))  /* the first of equals, whatever the order */
                best = k, top = y;
        }
    }
    free(kept), free(shares), free(kept_hi);
    *n_read = read;
    return best;
}
