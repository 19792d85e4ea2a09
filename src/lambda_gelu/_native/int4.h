/* 4-bit rows (lambda_gelu.inference.int4): blocks of 32 weights, block b's q_j in 0..15 standing for
 * s·a_b·(q_j − z_b), its 32 codes in 16 bytes (byte i: q_i low nibble, q_{i+16} high), the row's step codes a_b
 * (uint8) and zero codes z_b (uint8, 0..15) after all its codes. Summed against x rounded to int8 (x ≈ t·x̂, one scale
 * a row: round_row_i8) in integers, exactly:
 *     w·x ≈ t·s·(Σ_b a_b·S_b − Σ_b a_b·z_b·X_b),   S_b = q_b·x̂_b,   X_b = Σ x̂ over block b (block_sums_i8),
 * each |a_b·S_b| ≤ 255·15·127·32 < 2²⁴ and the sums over a row in 64 bits, so that the value is the float32
 * product of the dequantized row with t·x̂ but for its roundings in double and the last one to float. Codes
 * (unsigned) times x̂ (signed) is what the vector unit's u8 × s8 multiply-add takes, 32 products an instruction (int8
 * rows against int16 x take 16): 4-bit rows read half the bytes of int8 ones, and this keeps their arithmetic from
 * costing what the bytes save. The plain C loops are the reference; an AVX2 loop beside them gives the same
 * integers. */
#pragma once
#include "int8.h"

#define Q4_BLOCK 32

static inline int64_t q4_row_bytes(int64_t d) { return d / 2 + 2 * (d / Q4_BLOCK); }

/* x (d) as int8 x̂ = x / t rounded to nearest, t = max|x| / 127 (0 for a row of zeros, x̂ then 0). Returns 1 if x holds
 * a NaN or an infinity (x̂ is then meaningless: its sums go to float), else 0. */
static inline int round_row_i8(const float *x, int64_t d, int8_t *xq, double *t) {
    float largest = 0.0f, nonfinite = 0.0f;
    #pragma omp simd reduction(max:largest) reduction(+:nonfinite)
    for (int64_t j = 0; j < d; j++) {
        largest = fabsf(x[j]) > largest ? fabsf(x[j]) : largest;
        nonfinite += x[j] * 0.0f;
    }
    double tr = *t = (double)largest / 127.0;
    int bad = nonfinite != 0.0f || nonfinite != nonfinite;
    if (bad || !(tr > 0.0)) {
        memset(xq, 0, (size_t)d);
        return bad;
    }
    for (int64_t j = 0; j < d; j++) {  /* rint: to nearest, ties to even, as torch.round */
        double v = rint((double)x[j] / tr);
        xq[j] = (int8_t)(v > 127.0 ? 127.0 : v < -127.0 ? -127.0 : v);
    }
    return 0;
}

/* X_b = Σ x̂ over each block of x̂ (d): |X_b| ≤ 32·127, an int16. */
static inline void block_sums_i8(const int8_t *xq, int64_t d, int16_t *xs) {
    for (int64_t b = 0; b < d / Q4_BLOCK; b++) {
        int32_t sum = 0;
        for (int j = 0; j < Q4_BLOCK; j++)
            sum += xq[b * Q4_BLOCK + j];
        xs[b] = (int16_t)sum;
    }
}

#if defined(__AVX2__)
static inline int64_t hsum_i32x8(__m256i v) {  /* in 64 bits: each lane is below 2³¹, their sum need not be */
    __m256i lo = _mm256_cvtepi32_epi64(_mm256_castsi256_si128(v)), hi = _mm256_cvtepi32_epi64(
        _mm256_extracti128_si256(v, 1));
    __m256i s = _mm256_add_epi64(lo, hi);
    __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1);
}
#endif

/* Σ_b a_b·z_b·X_b over the nb step codes a and zero codes z of a row (|a_b·z_b| ≤ 255·15 = 3825, an int16, and
 * |a_b·z_b·X_b| ≤ 3825·32·127: exact in the AVX2 loop's int32 lanes for rows of fewer than 1000 blocks, as in
 * q4_steps). */
static inline int64_t q4_offsets(const uint8_t *a, const uint8_t *z, const int16_t *xs, int64_t nb) {
    int64_t sum = 0, b = 0;
#if defined(__AVX2__)
    if (nb < 1000) {
        __m256i lanes = _mm256_setzero_si256();
        for (; b + 16 <= nb; b += 16)
            lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(_mm256_mullo_epi16(
                _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(a + b))),
                _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(z + b)))),
                _mm256_loadu_si256((const __m256i *)(xs + b))));
        sum = hsum_i32x8(lanes);
    }
#endif
    for (; b < nb; b++)
        sum += (int32_t)a[b] * z[b] * xs[b];
    return sum;
}

/* Σ_b a_b·S_b for one row r of nb blocks, in plain C. */
static inline int64_t q4_steps_plain(const uint8_t *r, const int8_t *xq, int64_t nb) {
    const uint8_t *a = r + nb * Q4_BLOCK / 2;
    int64_t sum = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = r + b * Q4_BLOCK / 2;
        const int8_t *x = xq + b * Q4_BLOCK;
        int32_t s = 0;
        for (int i = 0; i < Q4_BLOCK / 2; i++)
            s += (q[i] & 15) * x[i] + (q[i] >> 4) * x[i + Q4_BLOCK / 2];
        sum += (int64_t)a[b] * s;
    }
    return sum;
}

#if defined(__AVX2__)
/* The eight int32 lanes of a_b·S_b for one block: codes (32 bytes, unpacked) times x̂ in u8 × s8 pairs (|pair| ≤
 * 2·15·127, no saturation), then those pairs times a_b, in pairs again, into int32. */
static inline __m256i q4_block(const uint8_t *q, __m256i x, __m256i a) {
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m256i codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), a);
}

/* The eight int32 lanes of a_b·S_b + a_{b+1}·S_{b+1} for two blocks b, b + 1 (q4_steps' AVX2 step): their 32 bytes
 * of codes q unpacked into low nibbles and high, u8 × s8 pairs of each against x̂ in pair order (x0: both blocks'
 * first halves, x1: their second halves), the two added in int16, then times their steps a[0] (low half) and a[1]
 * (high half), in pairs again, into int32. */
static inline __m256i q4_pair(const uint8_t *q, const uint8_t *a, __m256i x0, __m256i x1) {
    const __m256i low = _mm256_set1_epi8(15), spread = _mm256_setr_epi8(  /* a_b: lanes 0..7, a_{b+1}: 8..15 */
        0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, -1,
        1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1);
    __m256i codes = _mm256_loadu_si256((const __m256i *)q);
    __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(codes, low), x0),
                                     _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(codes, 4), low), x1));
    uint16_t ab;  /* a_b and a_{b+1} */
    memcpy(&ab, a, 2);
    return _mm256_madd_epi16(pairs, _mm256_shuffle_epi8(_mm256_set1_epi16((short)ab), spread));
}
#endif

/* x̂ (d) in the order the AVX2 loop of q4_steps reads it, two blocks b, b + 1 at a time: their first halves, then
 * their second halves (x̂_b[0:16], x̂_{b+1}[0:16], x̂_b[16:32], x̂_{b+1}[16:32]), as one register of two blocks' codes
 * unpacks into (low nibbles, then high); a last odd block as it is. */
static inline void q4_pair_order(const int8_t *xq, int64_t d, int8_t *xp) {
    int64_t nb = d / Q4_BLOCK, b = 0, h = Q4_BLOCK / 2;
    for (; b + 2 <= nb; b += 2) {
        const int8_t *x0 = xq + b * Q4_BLOCK, *x1 = x0 + Q4_BLOCK;
        int8_t *o = xp + b * Q4_BLOCK;
        memcpy(o, x0, h), memcpy(o + h, x1, h), memcpy(o + 2 * h, x0 + h, h), memcpy(o + 3 * h, x1 + h, h);
    }
    memcpy(xp + b * Q4_BLOCK, xq + b * Q4_BLOCK, (size_t)(d - b * Q4_BLOCK));
}

/* Σ_b a_b·S_b for one row r of nb blocks, from x̂ (xq) or the same in pair order (xp: q4_pair_order). The AVX2 loop
 * takes two blocks a step (q4_pair: |int16 lane| ≤ 2·2·15·127 = 7620); each int32 lane holds at most
 * nb/2·2·7620·255 < 2³¹: rows of fewer than 1000 blocks (the plain loop takes longer ones). */
static inline int64_t q4_steps(const uint8_t *r, const int8_t *xq, const int8_t *xp, int64_t nb) {
#if defined(__AVX2__)
    if (nb < 1000) {
        const uint8_t *a = r + nb * Q4_BLOCK / 2;
        __m256i s = _mm256_setzero_si256();
        int64_t b = 0;
        for (; b + 2 <= nb; b += 2) {
            const int8_t *x = xp + b * Q4_BLOCK;
            s = _mm256_add_epi32(s, q4_pair(r + b * Q4_BLOCK / 2, a + b, _mm256_loadu_si256((const __m256i *)x),
                                            _mm256_loadu_si256((const __m256i *)(x + Q4_BLOCK))));
        }
        if (b < nb) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xq + b * Q4_BLOCK));
            s = _mm256_add_epi32(s, q4_block(r + b * Q4_BLOCK / 2, x, _mm256_set1_epi16(a[b])));
        }
        return hsum_i32x8(s);
    }
#endif
    (void)xp;
    return q4_steps_plain(r, xq, nb);
}

/* A row's value from its two integer sums: t·s·(steps − offsets), the difference exact, in double, rounded once to
 * float. */
static inline float q4_value(float s, double t, int64_t steps, int64_t offsets) {
    return (float)(t * ((double)s * (double)(steps - offsets)));
}

#if defined(__AVX2__)
/* q4_steps of four rows side by side, x̂ read once for them: the same integer sums (rows of an even number of fewer
 * than 1000 blocks). A gate's four rows from four runs (runs_step) are four streams the hardware prefetcher follows
 * together, as the int8 rows are summed (int8.h); one row after another, each row's last lines were waited for. (Four
 * active units' up rows, near each other, measured the same either way.) */
static inline void q4_steps4(const uint8_t *const *r, const int8_t *xp, int64_t nb, int64_t *steps) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int64_t b = 0; b + 2 <= nb; b += 2) {
        const int8_t *x = xp + b * Q4_BLOCK;
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + Q4_BLOCK));
        for (int i = 0; i < 4; i++)
            s[i] = _mm256_add_epi32(s[i], q4_pair(r[i] + b * Q4_BLOCK / 2, r[i] + nb * Q4_BLOCK / 2 + b, x0, x1));
    }
    for (int i = 0; i < 4; i++)
        steps[i] = hsum_i32x8(s[i]);
}
#endif

/* The values w_i·x of the m ≤ 4 rows r[0..m) (scales s[i]) into v[0..m), from x̂ (scale t) and its block sums xs:
 * four rows side by side (q4_steps4), fewer one after another. What the dequantized rows give against t·x̂, but for
 * the last rounding. */
static inline void q4_rows(const uint8_t *const *r, int m, const float *s, const int8_t *xq, const int8_t *xp,
                           const int16_t *xs, double t, int64_t d, float *v) {
    int64_t nb = d / Q4_BLOCK, steps[4];
    int summed = 0;
#if defined(__AVX2__)
    if (m == 4 && nb % 2 == 0 && nb < 1000)
        q4_steps4(r, xp, nb, steps), summed = 4;
#endif
    for (int i = summed; i < m; i++)
        steps[i] = q4_steps(r[i], xq, xp, nb);
    for (int i = 0; i < m; i++) {
        const uint8_t *a = r[i] + nb * Q4_BLOCK / 2;
        v[i] = q4_value(s[i], t, steps[i], q4_offsets(a, a + nb, xs, nb));
    }
}

/* The same row in float over x itself (an x with a NaN or an infinity, which no x̂ stands for). */
static inline float q4_row_f32(const uint8_t *r, float s, const float *x, int64_t d) {
    int64_t nb = d / Q4_BLOCK;
    const uint8_t *a = r + d / 2, *z = a + nb;
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *q = r + b * Q4_BLOCK / 2;
        const float *xb = x + b * Q4_BLOCK;
        float step = s * a[b], zero = (float)z[b];
        for (int i = 0; i < Q4_BLOCK / 2; i++)
            sum += step * ((float)(q[i] & 15) - zero) * xb[i]
                   + step * ((float)(q[i] >> 4) - zero) * xb[i + Q4_BLOCK / 2];
    }
    return sum;
}

/* acc (out) += Σ_u h[u]·w_u for the m ≤ 4 4-bit rows w_u at rows[u] (out weights, scales s[u]): per block, each code
 * times h·s·a_b, less the rows' h·s·a_b·z_b summed once for the block; acc read and written once for the m rows. */
static inline void q4_add(const uint8_t *const *rows, int m, const float *s, const float *h, int64_t out,
                          float *restrict acc) {
    int64_t nb = out / Q4_BLOCK;
    for (int64_t b = 0; b < nb; b++) {
        float step[4] = {0.0f, 0.0f, 0.0f, 0.0f}, offset = 0.0f, *y = acc + b * Q4_BLOCK;
        const uint8_t *q[4];
        for (int u = 0; u < 4; u++) {
            const uint8_t *r = rows[u < m ? u : 0], *a = r + out / 2, *z = a + nb;
            q[u] = r + b * Q4_BLOCK / 2;
            if (u < m) {
                step[u] = h[u] * s[u] * a[b];
                offset -= step[u] * z[b];
            }
        }
        int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
        __m256 vo = _mm256_set1_ps(offset), vs[4];
        __m128i lo[4], hi[4], low = _mm_set1_epi8(15);
        for (int u = 0; u < 4; u++) {
            __m128i v = _mm_loadu_si128((const __m128i *)q[u]);
            vs[u] = _mm256_set1_ps(step[u]);
            lo[u] = _mm_and_si128(v, low), hi[u] = _mm_and_si128(_mm_srli_epi16(v, 4), low);
        }
        for (int p = 0; p < 4; p++) {  /* outputs 8p .. 8p + 7 of the block */
            __m256 a = _mm256_add_ps(_mm256_loadu_ps(y + 8 * p), vo);
            for (int u = 0; u < 4; u++) {
                __m128i codes = p < 2 ? lo[u] : hi[u];
                codes = p & 1 ? _mm_srli_si128(codes, 8) : codes;
                a = _mm256_fmadd_ps(vs[u], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), a);
            }
            _mm256_storeu_ps(y + 8 * p, a);
        }
        i = Q4_BLOCK / 2;
#endif
        for (; i < Q4_BLOCK / 2; i++) {
            float lo_sum = y[i] + offset, hi_sum = y[i + Q4_BLOCK / 2] + offset;
            for (int u = 0; u < 4; u++) {
                lo_sum = FMA(step[u], (float)(q[u][i] & 15), lo_sum);
                hi_sum = FMA(step[u], (float)(q[u][i] >> 4), hi_sum);
            }
            y[i] = lo_sum, y[i + Q4_BLOCK / 2] = hi_sum;
        }
    }
}
