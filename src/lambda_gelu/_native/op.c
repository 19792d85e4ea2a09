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
 * Each kernel exists for float32 (suffix _f32) and bfloat16 (_bf16): see op_body.h.
 *
 * λ-SiLU (suffix _silu_f32, _silu_bf16) is the same walk with the logistic gate σ in place of Φ:
 *   forward   y  = x · σ(z)
 *   backward  gx = g · (σ(z) + λ·u),         u = x·σ'(z) = x·σ(z)(1 − σ(z))
 *             gλ = Σ g · x · u
 * with one exponential per element, e = exp(−|z|): σ(|z|) = 1/(1 + e), σ' = e/(1 + e)².
 */
#include "common.h"

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
#include "op_types.h"
#undef GATE

/* ... and λ-SiLU's: the same loops with the logistic gate (_silu_f32, _silu_bf16) */
#define fwd1 silu_fwd1
#define bwd1 silu_bwd1
#define GATE _silu
#include "op_types.h"
#undef GATE
#undef fwd1
#undef bwd1
