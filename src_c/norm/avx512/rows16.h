/*
 * The pieces shared by the sixteen-row kernels of AVX-512 (rows16_*.c).
 * One row's vector is at most FWD16_MAX_H / 16 registers, so per-row
 * horizontal sums and scalar statistics would dominate. Each row's sums stay
 * in one vector accumulator, a transposing reduction tree (reduce16, isa/simd.h)
 * turns sixteen of them into one vector holding the sixteen row sums, and
 * the statistics are computed for the sixteen rows in vector lanes. A group
 * short of sixteen rows repeats its last row in the spare lanes (their
 * results are dropped), so a row's arithmetic does not depend on its group:
 * results are bitwise the same for any split of the rows over threads.
 *
 * The statistics follow the one-row code of norm/stats.h: shifted two-pass
 * forward (x - x0, then the centred squares), rstd in double, and for float
 * sums that may have lost the row (not finite, or a variance outside
 * [1e-30, 1e30]) the row is redone by the one-row code with its double
 * fallback.
 */
#include "isa/simd.h"

/* The forwards go sixteen rows at a time up to rows of FWD16_MAX_H, where
 * that beats four rows at a time (norm/rows.h) and the long-row forward; the
 * backward beats the others only up to BWD16_MAX_H. The half-storage
 * forwards take some row lengths thirty-two at a time (fwd16h_nv). */
#define NV16 (BWD16_MAX_H / 16)   /* vectors in a row of the backward, at most */
#define NVF16 (FWD16_MAX_H / 16)   /* vectors in a row of the forwards, at most */
/* M(NV) for each row length of the sixteen-row forwards, 1 to NVF16 vectors */
#define FOR_NVF16(M)                                                                 \
    M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) M(16)
/* The forwards' switch over NV * 3 + op (op 0 LayerNorm, 1 RMSNorm, 2 add +
 * LayerNorm): the three cases of rows of NV vectors, each a call of the
 * F(NV, op) its user defines */
#define OP_CASES(NV)                  \
    case 3 * NV: F(NV, 0); break;     \
    case 3 * NV + 1: F(NV, 1); break; \
    case 3 * NV + 2: F(NV, 2); break;

/* f(a) lane by lane in double: the lanes of a widened, f applied to both halves, narrowed. */
#define IN_DOUBLE(a, f)                                                             \
    _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(f(_mm512_cvtps_pd(    \
                           _mm512_castps512_ps256(a))))),                           \
                       _mm512_cvtpd_ps(f(_mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1)))), 1)

/* The mask of the real rows among sixteen rows g of a group of R real rows */
static inline __mmask16 real16(int R, int g)
{
    const int n = R <= 16 * g ? 0 : R - 16 * g >= 16 ? 16 : R - 16 * g;
    return (__mmask16)((1u << n) - 1);
}

/* The mask of the last vector of a row of H elements. */
static inline __mmask16 tail16(int64_t H)
{
    return H % 16 ? (__mmask16)((1u << (H % 16)) - 1) : (__mmask16)0xFFFF;
}

/* In the group kernels (NV and tail theirs: a row's vectors, and the mask of
 * its last): the mask of vector v of a row */
#define MASK(v) ((v) == NV - 1 ? tail : (__mmask16)0xFFFF)

/* w and b (NULL: ones, zeros) as nv vectors, the last one masked by tail */
static inline void load_wb16(__m512 *wv, __m512 *bv, const float *w, const float *b,
                             int nv, __mmask16 tail)
{
    for (int v = 0; v < nv; v++) {
        __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xFFFF;
        wv[v] = w ? _mm512_maskz_loadu_ps(m, w + 16 * v) : _mm512_set1_ps(1.0f);
        bv[v] = b ? _mm512_maskz_loadu_ps(m, b + 16 * v) : _mm512_setzero_ps();
    }
}

/* Rows [n, n + 16) of x, the spare ones (from r1 on) repeating row r1 - 1. */
static inline void rows16(const float **xr, const float *x, int64_t n, int64_t r1, int64_t H)
{
    for (int k = 0; k < 16; k++) xr[k] = x + (n + k < r1 ? n + k : r1 - 1) * H;
}

/* The forwards' prefetch: shorter rows and add + LayerNorm fetch
 * PF_GROUP_FWD bytes of x ahead a group at a time; rows of SPREAD_NV vectors
 * or more fetch the next group's row k with their row k (group kernels). */
#define PF_GROUP_FWD 4096
#define SPREAD_NV 3

/* v / H lane by lane; for H a power of two the same bits as v * (1 / H),
 * which spares the divider */
static inline __attribute__((always_inline)) __m512 div_h16(__m512 v, int64_t H)
{
    return !(H & (H - 1)) ? _mm512_mul_ps(v, _mm512_set1_ps(1.0f / (float)H))
                          : _mm512_div_ps(v, _mm512_set1_ps((float)H));
}

/* div_h16 in double lanes */
static inline __attribute__((always_inline)) __m512d div_hd(__m512d v, int64_t H)
{
    return !(H & (H - 1)) ? _mm512_mul_pd(v, _mm512_set1_pd(1.0 / (double)H))
                          : _mm512_div_pd(v, _mm512_set1_pd((double)H));
}

/* 1 / sqrt(var + eps) lane by lane in double, rounded to float; *ok: the lanes
 * whose var lies in [1e-30, 1e30], where the float statistics hold */
static inline __attribute__((always_inline)) __m512 rstd16(__m512 var, double eps,
                                                           __mmask16 *ok)
{
    *ok = _mm512_cmp_ps_mask(var, _mm512_set1_ps(1e-30f), _CMP_GE_OQ) &
          _mm512_cmp_ps_mask(var, _mm512_set1_ps(1e30f), _CMP_LE_OQ);
    __m512d e = _mm512_set1_pd(eps), one = _mm512_set1_pd(1.0);
#define RSTD(v) _mm512_div_pd(one, _mm512_sqrt_pd(_mm512_add_pd((v), e)))
    __m512 rv = IN_DOUBLE(var, RSTD);
#undef RSTD
    return rv;
}
