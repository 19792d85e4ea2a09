/* What every kernel file shares: the headers, FMA, a thread's share of a range, row prefetching, the parallel
 * sum of rows over threads, and float32 dot products. Kernels are plain C for the compiler's auto-vectorizer;
 * threads via OpenMP (the runtime PyTorch already loaded). */
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

/* fmaf where the CPU has it (one rounding, vectorized); elsewhere, as on baseline x86-64, fmaf would
 * be a slow library call, so a multiply and an add (two roundings: the tests' bounds allow for both). */
#ifdef FP_FAST_FMAF
#define FMA(a, b, c) fmaf(a, b, c)
#else
#define FMA(a, b, c) ((a) * (b) + (c))
#endif

/* The element range [lo, hi) of thread `tid` among `nt`, in whole multiples of `align`. */
static inline void split(int64_t n, int64_t align, int tid, int nt, int64_t *lo, int64_t *hi) {
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * tid / nt, b1 = blocks * (tid + 1) / nt;
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

/* A thread's rows [lo, hi) are read as RUNS runs side by side, a row of each in turn: step i of runs_steps(lo, hi)
 * takes the rows runs_step gives, the i-th of each run (the last step: the few rows the runs leave, at most RUNS − 1).
 * The hardware prefetcher follows a few streams at once far better than one, which stops at every 4 KiB page: an
 * int8 matrix-vector product of 26 MB on this project's 2-core EPYC read 13 GB/s one row after another, 19.6 a row
 * of each of four runs in turn, 22.5 with the four summed side by side (sums_i8_i16), and 14.5 with eight runs. */
#define RUNS 4
static inline int64_t runs_steps(int64_t lo, int64_t hi) {
    int64_t n = hi - lo;
    return n / RUNS + (n % RUNS != 0);
}

static inline int runs_step(int64_t lo, int64_t hi, int64_t i, int64_t *rows) {
    int64_t n = hi - lo, per = n / RUNS;
    if (i < per) {
        for (int r = 0; r < RUNS; r++)
            rows[r] = lo + r * per + i;
        return RUNS;
    }
    int m = (int)(n - RUNS * per);
    for (int r = 0; r < m; r++)
        rows[r] = lo + RUNS * per + r;
    return m;
}

/* Rows are scattered, so the hardware prefetcher, which follows one stream at a time and stops at
 * page boundaries, starts cold on each; requesting them a few rows ahead, into L2, keeps enough
 * reads in flight. In a cold-cache test (batch 1, the 3072 → 768 layer at 10% density, one core)
 * this took 86 µs where one row ahead into L1 took 150. */
#define PREFETCH_ROWS 4
static inline void prefetch_row(const float *row, int64_t n) {
    for (int64_t j = 0; j < n; j += 16)  /* one 64-byte line per 16 floats */
        __builtin_prefetch(row + j, 0, 2);
}


/* What a thread sums over the active units [a0, a1) into acc (n, out): one of the two kernels below, with its
 * operands in `ctx`. */
typedef void (*rows_fn)(const void *ctx, float *acc, const int64_t *active, int64_t a0, int64_t a1);

/* Inside a parallel region, once every thread has summed its share into y (thread 0) or its partial (thread t into
 * partial + (t − 1)·size): thread t of `threads` adds up its slice of the `size` sums, times scale[k % out] if given
 * (int8 rows with one scale per output), plus bias[k % out] if given. */
static inline void add_partials(float *y, const float *partial, const float *scale, const float *bias, int64_t size,
                                int64_t out, int t, int threads) {
    int64_t per = (size + threads - 1) / threads;
    int64_t k0 = t * per < size ? t * per : size, k1 = k0 + per < size ? k0 + per : size;
    for (int64_t k = k0; k < k1; k++) {
        float sum = y[k];
        for (int u = 1; u < threads; u++)
            sum += partial[(int64_t)(u - 1) * size + k];
        y[k] = (scale ? sum * scale[k % out] : sum) + (bias ? bias[k % out] : 0.0f);
    }
}

/* y (n, out) = Σ over the active units of what `rows` sums for each, on nt threads (each sums a share of the units
 * into a partial, added at the end), times scale and plus bias where given (add_partials); −1 if the partial sums
 * could not be allocated, else 0. */
static inline int parallel_rows(rows_fn rows, const void *ctx, float *y, const float *scale, const float *bias,
                                const int64_t *active, int64_t n_active, int64_t n, int64_t out, int nt) {
    if (nt <= 1) {  /* no parallel region: entering one, even for one thread, costs as much as a small layer */
        rows(ctx, y, active, 0, n_active);
        add_partials(y, NULL, scale, bias, n * out, out, 0, 1);
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
        add_partials(y, partial, scale, bias, n * out, out, t, threads);
    }
    free(partial);
    return 0;
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

/* s[i] = w · x_i for the m ≤ 4 rows x_0..x_3 (of a batch, given apart: where a unit is active), side by side where
 * there are two or more: each of w's vectors read once for them, and four chains of multiply-adds in flight, where
 * one dot_f32 after another waits on each one's chain (at 8 rows a gated block's loop was bound by those chains, not
 * by reading its rows). The chains past m repeat x_0 and are dropped; one row is dot_f32's sum. */
static inline void dots4p_f32(const float *w, const float *x0, const float *x1, const float *x2, const float *x3,
                              int m, int64_t d, float *s) {
    if (m == 1) {
        s[0] = dot_f32(w, x0, d);
        return;
    }
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

/* dots4p_f32 over the m ≤ 4 rows of x (m, d) in a row. */
static inline void dots4_f32(const float *w, const float *x, int m, int64_t d, float *s) {
    dots4p_f32(w, x, m > 1 ? x + d : x, m > 2 ? x + 2 * d : x, m > 3 ? x + 3 * d : x, m, d, s);
}

/* s[i] = w[i] · x for the m ≤ 4 rows w[0..m) of a runs_step: four rows from four runs side by side, x read once for
 * them (dots4p_f32 with the roles of w and x swapped: the products are the same), each summed as dot_f32 sums it;
 * fewer one after another. */
static inline void rows4_f32(const float *const *w, const float *x, int m, int64_t d, float *s) {
    if (m < 4) {
        for (int i = 0; i < m; i++)
            s[i] = dot_f32(w[i], x, d);
        return;
    }
    dots4p_f32(x, w[0], w[1], w[2], w[3], 4, d, s);
}

/* Threads for a gate's n·ff·d multiply-adds: one per `grain`, at least one, at most max_threads. */
static inline int gate_threads(int64_t n, int64_t d, int64_t ff, int max_threads, int64_t grain) {
    int64_t work = n * ff * d / grain;
    return work < 1 ? 1 : work < max_threads ? (int)work : max_threads;
}

/* The inputs of x (n, in) non-zero in some row, in increasing order (sparse.c). */
int64_t lg_active_union_f32(const float *x, int64_t n, int64_t in, int64_t *active);
