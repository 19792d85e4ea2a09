/* The kernels of op.c for one element type; included once per type, with
 *   T       the element type in memory      LD(v)  T → float      ST(f)  float → T
 *   NAME(f) f with the type's suffix.
 * λ is float32 and the arithmetic float32 for every T, as in the eager path. */
static void NAME(fwd_run)(const T *restrict x, T *restrict y, int64_t n, float lam) {
    for (int64_t i = 0; i < n; i++) y[i] = ST(fwd1(LD(x[i]), lam));
}

static double NAME(bwd_run)(const T *restrict g, const T *restrict x, T *restrict gx, int64_t n,
                      float lam, int need_lam) {
    double total = 0.0;
    for (int64_t start = 0; start < n; start += 1024) { /* float sums over short blocks, then double */
        int64_t end = start + 1024 < n ? start + 1024 : n;
        float s = 0.0f;
        if (need_lam) {
#pragma omp simd reduction(+ : s)
            for (int64_t i = start; i < end; i++) {
                float xu, gi = LD(g[i]);
                gx[i] = ST(bwd1(gi, LD(x[i]), lam, &xu));
                s += gi * xu;
            }
        } else {
#pragma omp simd
            for (int64_t i = start; i < end; i++) {
                float xu;
                gx[i] = ST(bwd1(LD(g[i]), LD(x[i]), lam, &xu));
            }
        }
        total += s;
    }
    return total;
}

void NAME(lg_forward_runs)(const T *x, T *y, const float *lam, int64_t outer, int64_t C, int64_t inner,
                     int nt) {
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), n_threads = omp_get_num_threads();
        FOR_EACH_RUN(outer, C, inner, tid, n_threads, NAME(fwd_run)(x + off, y + off, len, lam[c]));
    }
}

void NAME(lg_backward_runs)(const T *g, const T *x, T *gx, const float *lam, double *glam,
                      int64_t outer, int64_t C, int64_t inner, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), n_threads = omp_get_num_threads();
        FOR_EACH_RUN(outer, C, inner, tid, n_threads, {
            double s = NAME(bwd_run)(g + off, x + off, gx + off, len, lam[c], glam != 0);
            if (glam) glam[(int64_t)tid * C + c] += s;
        });
    }
}

void NAME(lg_forward_last)(const T *x, T *y, const float *lam, int64_t outer, int64_t C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        split(outer, 1, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        for (int64_t o = lo; o < hi; o++) {
            const T *restrict xr = x + o * C;
            T *restrict yr = y + o * C;
            for (int64_t c = 0; c < C; c++) yr[c] = ST(fwd1(LD(xr[c]), lam[c]));
        }
    }
}

void NAME(lg_backward_last)(const T *g, const T *x, T *gx, const float *lam, double *glam,
                      int64_t outer, int64_t C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num();
        int64_t lo, hi;
        split(outer, 1, tid, omp_get_num_threads(), &lo, &hi);
        double *restrict acc = glam ? glam + (int64_t)tid * C : 0;
        for (int64_t o = lo; o < hi; o++) {
            const T *restrict gr = g + o * C, *restrict xr = x + o * C;
            T *restrict gxr = gx + o * C;
            float xu;
            if (acc)
                for (int64_t c = 0; c < C; c++) {
                    float gc = LD(gr[c]);
                    gxr[c] = ST(bwd1(gc, LD(xr[c]), lam[c], &xu));
                    acc[c] += (double)(gc * xu);
                }
            else
                for (int64_t c = 0; c < C; c++) gxr[c] = ST(bwd1(LD(gr[c]), LD(xr[c]), lam[c], &xu));
        }
    }
}
