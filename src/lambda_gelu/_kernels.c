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
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#define INV_SQRT_2PI 0.3989422804014327f
#define P_OVER_SQRT2 0.2316419f /* A&S 7.1.26's p = 0.3275911, divided by √2: t = 1/(1 + p·|z|/√2) */

static inline float exp_neg(float t) { /* e^t for t ≤ 0, 0 below −87 (Cephes expf, rel. error ~1e-7) */
    float tc = t > -87.0f ? t : -87.0f;
    float n = rintf(tc * 1.4426950408889634f);
    float r = fmaf(n, -0.693359375f, tc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return t < -87.0f ? 0.0f : p * scale;
}

/* Φ(z) given e = exp(−z²/2). */
static inline float gate(float z, float e) {
    float t = 1.0f / fmaf(P_OVER_SQRT2, fabsf(z), 1.0f);
    float r = 1.061405429f;
    r = fmaf(r, t, -1.453152027f);
    r = fmaf(r, t, 1.421413741f);
    r = fmaf(r, t, -0.284496736f);
    r = fmaf(r, t, 0.254829592f);
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

static void fwd_run(const float *restrict x, float *restrict y, int64_t n, float lam) {
    for (int64_t i = 0; i < n; i++) y[i] = fwd1(x[i], lam);
}

static double bwd_run(const float *restrict g, const float *restrict x, float *restrict gx, int64_t n,
                      float lam, int need_lam) {
    double total = 0.0;
    for (int64_t start = 0; start < n; start += 1024) { /* float sums over short blocks, then double */
        int64_t end = start + 1024 < n ? start + 1024 : n;
        float s = 0.0f;
        if (need_lam) {
#pragma omp simd reduction(+ : s)
            for (int64_t i = start; i < end; i++) {
                float xu;
                gx[i] = bwd1(g[i], x[i], lam, &xu);
                s += g[i] * xu;
            }
        } else {
#pragma omp simd
            for (int64_t i = start; i < end; i++) {
                float xu;
                gx[i] = bwd1(g[i], x[i], lam, &xu);
            }
        }
        total += s;
    }
    return total;
}

/* The element range [lo, hi) of thread `tid` among `nt`, in whole multiples of `align`. */
static void split(int64_t n, int64_t align, int tid, int nt, int64_t *lo, int64_t *hi) {
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

/* Walk thread tid's share of a `runs` tensor: calls visit(offset, length, c) on each piece. */
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

void lg_forward_runs(const float *x, float *y, const float *lam, int64_t outer, int64_t C, int64_t inner,
                     int nt) {
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), n_threads = omp_get_num_threads();
        FOR_EACH_RUN(outer, C, inner, tid, n_threads, fwd_run(x + off, y + off, len, lam[c]));
    }
}

void lg_backward_runs(const float *g, const float *x, float *gx, const float *lam, double *glam,
                      int64_t outer, int64_t C, int64_t inner, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num(), n_threads = omp_get_num_threads();
        FOR_EACH_RUN(outer, C, inner, tid, n_threads, {
            double s = bwd_run(g + off, x + off, gx + off, len, lam[c], glam != 0);
            if (glam) glam[(int64_t)tid * C + c] += s;
        });
    }
}

void lg_forward_last(const float *x, float *y, const float *lam, int64_t outer, int64_t C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        split(outer, 1, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        for (int64_t o = lo; o < hi; o++) {
            const float *restrict xr = x + o * C;
            float *restrict yr = y + o * C;
            for (int64_t c = 0; c < C; c++) yr[c] = fwd1(xr[c], lam[c]);
        }
    }
}

void lg_backward_last(const float *g, const float *x, float *gx, const float *lam, double *glam,
                      int64_t outer, int64_t C, int nt) {
#pragma omp parallel num_threads(nt)
    {
        int tid = omp_get_thread_num();
        int64_t lo, hi;
        split(outer, 1, tid, omp_get_num_threads(), &lo, &hi);
        double *restrict acc = glam ? glam + (int64_t)tid * C : 0;
        for (int64_t o = lo; o < hi; o++) {
            const float *restrict gr = g + o * C, *restrict xr = x + o * C;
            float *restrict gxr = gx + o * C;
            float xu;
            if (acc)
                for (int64_t c = 0; c < C; c++) {
                    gxr[c] = bwd1(gr[c], xr[c], lam[c], &xu);
                    acc[c] += (double)(gr[c] * xu);
                }
            else
                for (int64_t c = 0; c < C; c++) gxr[c] = bwd1(gr[c], xr[c], lam[c], &xu);
        }
    }
}
