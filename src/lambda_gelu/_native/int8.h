/* Exact int8 × int16 dot products and the screen built on them: int8 rows with a bound on how far their sum can
 * be from the float32 one, so that only the rows that can matter are read in float32 (gated.c, argmax.c). */
#pragma once
#include "common.h"

/* Σ q[j]·b[j] for an int8 row q and an int16 vector b: an exact integer sum, as long as d·127·max|b| < 2³¹
 * (screen_scale); in plain C (the reference, and the AVX2 loops' last entries: dot_i8_i16 below). Products of int16
 * operands, written so, become the vector unit's multiply-adds of 16-bit pairs
 * (several times faster than int8 rows converted to float, which at batch 1 left the screen waiting on its own
 * arithmetic, not on memory); an OpenMP simd reduction here, or the products taken in 32 bits, vectorized three to
 * four times slower. */
static inline int32_t dot_i8_i16_plain(const int8_t *q, const int16_t *b, int64_t d) {
    int32_t s = 0;
    for (int64_t j = 0; j < d; j++)
        s += (int16_t)q[j] * (int16_t)b[j];
    return s;
}

#if defined(__AVX2__)
/* The AVX2 loops below: 32 entries of a row a step, each half of them widened to int16 straight from memory and
 * multiplied-added with b in 16-bit pairs into eight int32 lanes (the same products and exact sums as the plain
 * loops). The compiler's vectorization of those loaded the 32 bytes and took the upper half out of the register in
 * one more shuffle, on the ports the widenings wait on: 44 cycles a row of 576 against 35 (hot, one core). Decoding,
 * bound by memory, did not move; a prompt through the one call's rows, bound by these sums, took 1.06-1.075 times
 * less (int8, SmolLM2-135M). */
static inline __m256i dot32_i8_i16(const int8_t *q, __m256i b0, __m256i b1, __m256i lanes) {
    lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)), b0));
    return _mm256_add_epi32(lanes, _mm256_madd_epi16(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16))), b1));
}

/* The eight lanes' sum, exact where the sum is below 2³¹ (int4.h's hsum_i32x8 sums in 64 bits, for sums that need
 * not fit: here that cost a prompt's int8 first token 1.6-5% in three A/B runs). */
static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_srli_si128(s, 8));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_srli_si128(s, 4)));
}
#endif

static inline int32_t dot_i8_i16(const int8_t *q, const int16_t *b, int64_t d) {
    int64_t j = 0;
    int32_t s = 0;
#if defined(__AVX2__)
    __m256i lanes = _mm256_setzero_si256();
    for (; j + 32 <= d; j += 32)
        lanes = dot32_i8_i16(q + j, _mm256_loadu_si256((const __m256i *)(b + j)),
                             _mm256_loadu_si256((const __m256i *)(b + j + 16)), lanes);
    s = hsum_i32(lanes);
#endif
    return s + dot_i8_i16_plain(q + j, b + j, d - j);
}

/* The sums of the m ≤ 4 int8 rows q[0..m) with b into s[0..m): four rows from four runs (runs_step) side by side,
 * b read once for them; fewer one after another. Rows next to each other are better read one after another: summed
 * side by side they are four streams a row apart, which the hardware prefetcher follows worse than one (a token's
 * int8 step ran 17% slower so). */
static inline void sums_i8_i16(const int8_t *const *q, int m, int64_t d, const int16_t *b, int32_t *s) {
    if (m < 4) {
        for (int i = 0; i < m; i++)
            s[i] = dot_i8_i16(q[i], b, d);
        return;
    }
    const int8_t *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t j = 0;
#if defined(__AVX2__)
    __m256i l0 = _mm256_setzero_si256(), l1 = l0, l2 = l0, l3 = l0;
    for (; j + 32 <= d; j += 32) {
        __m256i b0 = _mm256_loadu_si256((const __m256i *)(b + j));
        __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + j + 16));
        l0 = dot32_i8_i16(q0 + j, b0, b1, l0), l1 = dot32_i8_i16(q1 + j, b0, b1, l1);
        l2 = dot32_i8_i16(q2 + j, b0, b1, l2), l3 = dot32_i8_i16(q3 + j, b0, b1, l3);
    }
    s0 = hsum_i32(l0), s1 = hsum_i32(l1), s2 = hsum_i32(l2), s3 = hsum_i32(l3);
#endif
    for (; j < d; j++) {
        s0 += (int16_t)q0[j] * (int16_t)b[j];
        s1 += (int16_t)q1[j] * (int16_t)b[j];
        s2 += (int16_t)q2[j] * (int16_t)b[j];
        s3 += (int16_t)q3[j] * (int16_t)b[j];
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* The int8 rows q + rows[i]·d of a runs_step. */
static inline void rows_i8(const int8_t *q, const int64_t *rows, int m, int64_t d, const int8_t **out) {
    for (int i = 0; i < m; i++)
        out[i] = q + rows[i] * d;
}

/* The sums of one int8 row q with four int16 vectors b0..b3 (four rows of x, a prompt's): q read and widened once
 * for the four. */
static inline void dot4x_i8_i16(const int8_t *q, const int16_t *b0, const int16_t *b1, const int16_t *b2,
                                const int16_t *b3, int64_t d, int32_t *s) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t j = 0; j < d; j++) {
        int32_t qj = (int16_t)q[j];
        s0 += qj * b0[j];
        s1 += qj * b1[j];
        s2 += qj * b2[j];
        s3 += qj * b3[j];
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

/* An int8 row's value s·(q·x) from its exact sum S = q·x̃ (x taken as t·x̃): s·t·S in double, rounded once to float. */
static inline float scaled_i8(float s, double t, int32_t sum) {
    return (float)((double)s * t * sum);
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
        int16_t *out = xq + r * d;
        float largest = 0.0f, nonfinite = 0.0f;  /* max |x|, exact in float; x·0 is 0 but for a NaN or an infinity */
        #pragma omp simd reduction(max:largest) reduction(+:nonfinite)
        for (int64_t j = 0; j < d; j++) {
            largest = fabsf(xr[j]) > largest ? fabsf(xr[j]) : largest;
            nonfinite += xr[j] * 0.0f;
        }
        bad |= nonfinite != 0.0f || nonfinite != nonfinite;
        double tr = t[r] = (double)largest / top;
        if (!(tr > 0.0 && isfinite(tr))) {
            memset(out, 0, (size_t)d * sizeof *out);
            continue;
        }
        for (int64_t j = 0; j < d; j++) {  /* rint: to nearest, ties to even, as nearbyint and torch.round */
            double v = rint((double)xr[j] / tr);
            v = v > top ? top : v < -top ? -top : v;
            out[j] = (int16_t)(v == v ? v : 0.0);
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
 * and radii r ≥ ‖w − s·q‖₂, nq ≥ s·‖q‖₂ (lambda_gelu.inference.gated.screen_rows) and x's norm and residual from
 * screen_rows_of_x: r·‖x‖₂ + nq·‖x − t·x̃‖₂ by Cauchy–Schwarz on x·(w − s·q) + s·q·(x − t·x̃), plus double's
 * roundings of the product and the sum; SCREEN_SAFETY covers the roundings of the margin's own products and sums. */
#define SCREEN_SAFETY (1.0 + 1.0 / 65536)
static inline double screen_margin(double product, double b, float r, float nq, double norm, double residual) {
    return ((double)r * norm + (double)nq * residual + 0x1p-48 * (fabs(product) + fabs(b))) * SCREEN_SAFETY;
}

/* Requests n bytes from row on, a cache line at a time: for rows gathered out of order (the active units'), which the
 * hardware prefetcher cannot foresee. */
static inline void prefetch_bytes(const int8_t *row, int64_t n) {
    for (int64_t j = 0; j < n; j += 64)
        __builtin_prefetch(row + j, 0, 2);
}

/* Requests the first SHARE_START rows of the calling thread's share of `rows` rows of `width` bytes from base, split
 * in fours (SHARE_START / RUNS from the start of each of its runs), before the thread waits at a barrier or on a
 * serial step: its first reads then start from cache, and the hardware prefetcher, which follows a stream read in
 * order, takes over from there. */
#define SHARE_START 20
static inline void prefetch_share(const void *base, int64_t rows, int64_t width) {
    int64_t lo, hi;
    split(rows, 4, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
    for (int64_t i = 0; i < SHARE_START / RUNS && i < runs_steps(lo, hi); i++) {
        int64_t r[RUNS];
        int m = runs_step(lo, hi, i, r);
        for (int k = 0; k < m; k++)
            prefetch_bytes((const int8_t *)base + r[k] * width, width);
    }
}
