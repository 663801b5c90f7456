/*
 * The group kernels of the sixteen-row forwards of AVX-512 (rows16_fwd.c,
 * rows16_fwd_half.c): the LayerNorm and RMSNorm of one group of
 * sixteen or thirty-two rows, float or float16/bfloat16 storage.
 */
#include "isa/simd.h"

/* In the group kernels below (XE, YE, YI, NV, tail, xr, yr, nt theirs):
 * vector v of row k (float, or half storage XE widened), and y to vector v
 * of row k (float, or half storage YE narrowed with bf16i YI; nt as
 * st_half); MASK: rows16.h. */
#define LD(k, v) (XE ? ld_half(XE, (const uint16_t *)xr[k] + 16 * (v), MASK(v))    \
                       : _mm512_maskz_loadu_ps(MASK(v), (const float *)xr[k] + 16 * (v)))
#define ST(k, v, y)                                                                       \
    do {                                                                                  \
        if (YE) st_half(YE, YI, (uint16_t *)yr[k] + 16 * (v), (y), MASK(v), nt);          \
        else _mm512_mask_storeu_ps((float *)yr[k] + 16 * (v), MASK(v), (y));              \
    } while (0)
/* y to vector v of row k, or with put to the writer wl (the group kernel's
 * copy of ow: a local the streaming stores cannot alias stays in registers) */
#define PUT_OR_ST(k, v, y)                                                                \
    do {                                                                                  \
        if (put) ntw_put(&wl, (y));                                                       \
        else ST(k, v, (y));                                                               \
    } while (0)
/* Vectors v and v + 1 of a half-storage y row, narrowed together and put to
 * wl as one line's worth. The group kernels do this in a sweep of its own:
 * with the float rows' loop taking it too, GCC unrolled neither loop. */
#define PUT16(a, b) ntw_put(&wl, _mm512_castsi512_ps(narrow32(YE, YI, (a), (b))))
/* One group of 16 * NG rows (R of them real; NG 1 or 2) of the LayerNorm
 * forward, rows of NV vectors (NV and NG constants after inlining: the loops
 * unroll, w and b stay in registers). Each sixteen rows' sums reduce on their
 * own (reduce16), and rows are the same bits whatever NG. Rows of float,
 * or with XE (a constant too) of half storage converted in registers; y
 * rows likewise of float or, with YE (a constant), half storage narrowed
 * with bf16i YI (nt: non-temporal stores where aligned). pf: NULL, or rows
 * (of x's storage) to prefetch, one with each row of the first sweep (rows
 * of more than 8 vectors: of the second). pfw: the y rows are prefetched for
 * writing, one with each row of the second sweep (float rows past the cache;
 * in cache it only costs time).
 * ow: NULL, or the writer of y's rows (float rows of whole vectors, or
 * half-storage rows of an even number): the rows go to it when all of them
 * are finished (nothing to redo), else to yr.
 * Returns the mask of the rows it did not finish: their float statistics are
 * suspect, and the caller redoes them with the one-row code. */
static inline __attribute__((always_inline)) uint32_t ln_group16(
    void *const *yr, float *mean, float *rstd, const void *const *xr, const __m512 *wv,
    const __m512 *bv, int R, int NV, int64_t H, __mmask16 tail, double eps, int XE, int YE,
    int YI, int nt, const char *pf, int pfw, int NG, ntw *ow)
{
#define X0(k) (!XE ? ((const float *)xr[k])[0]                                             \
               : XE == FASTLN_F16 ? f16_to_f32(((const uint16_t *)xr[k])[0])               \
                                    : bf16_to_f32(((const uint16_t *)xr[k])[0]))
    float sh[32] __attribute__((aligned(64))), dm[32] __attribute__((aligned(64)));
    float r[32] __attribute__((aligned(64)));
    /* half-storage rows: widened once, by the first sweep, for the other two */
    float xw[XE ? 16 * 16 * NG * NV : 1] __attribute__((aligned(64)));
#define LDW(k, v) (XE ? _mm512_load_ps(xw + 16 * ((k) * NV + (v))) : LD(k, v))
    const char *pf1 = NV <= 8 ? pf : NULL, *pf2 = NV <= 8 ? NULL : pf;
    __m512 acc[32];
    for (int k = 0; k < 16 * NG; k++) {   /* sum(x - x0) */
        sh[k] = X0(k);
        __m512 s = _mm512_set1_ps(sh[k]), a = _mm512_setzero_ps();
        if (pf1) pf_row(pf1, k, H * elem_bytes(XE));
        for (int v = 0; v < NV; v++) {
            __m512 xv = LD(k, v);
            if (XE) _mm512_store_ps(xw + 16 * (k * NV + v), xv);
            a = _mm512_add_ps(a, _mm512_maskz_sub_ps(MASK(v), xv, s));
        }
        acc[k] = a;
    }
    __m512 s1[2], dmv[2];
    for (int g = 0; g < NG; g++) {
        s1[g] = reduce16(acc + 16 * g);
        dmv[g] = div_h16(s1[g], H);
        _mm512_store_ps(dm + 16 * g, dmv[g]);
    }
    for (int k = 0; k < 16 * NG; k++) {   /* sum((x - x0 - dm)^2) */
        __m512 s = _mm512_set1_ps(sh[k]), d = _mm512_set1_ps(dm[k]), a = _mm512_setzero_ps();
        if (pf2) pf_row(pf2, k, H * elem_bytes(XE));
        if (pfw && k < R) pfw_row(yr[k], H * 4);
        for (int v = 0; v < NV; v++) {
            __m512 c = _mm512_maskz_sub_ps(MASK(v), _mm512_maskz_sub_ps(MASK(v), LDW(k, v), s), d);
            a = _mm512_fmadd_ps(c, c, a);
        }
        acc[k] = a;
    }
    uint32_t ok = 0;   /* bit k: row k's float statistics hold */
    for (int g = 0; g < NG; g++) {
        __mmask16 okg;
        __m512 rv = rstd16(div_h16(reduce16(acc + 16 * g), H), eps, &okg);
        okg &= _mm512_cmp_ps_mask(_mm512_abs_ps(s1[g]), _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ);
        _mm512_store_ps(r + 16 * g, rv);
        const __mmask16 done = okg & real16(R, g);
        if (mean) {   /* x0 + dm, rounded once */
            __m512 shv = _mm512_load_ps(sh + 16 * g);
            __m512d lo = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(shv)),
                                       _mm512_cvtps_pd(_mm512_castps512_ps256(dmv[g])));
            __m512d hi = _mm512_add_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(shv, 1)),
                                       _mm512_cvtps_pd(_mm512_extractf32x8_ps(dmv[g], 1)));
            _mm512_mask_storeu_ps(mean + 16 * g, done, _mm512_insertf32x8(
                _mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1));
        }
        if (rstd) _mm512_mask_storeu_ps(rstd + 16 * g, done, rv);
        ok |= (uint32_t)okg << (16 * g);
    }
    const uint32_t redo = ~ok & (uint32_t)((1ull << R) - 1);
    const int put = ow && !redo;
    ntw wl;
    if (put) wl = *ow;
#define Y(v) _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(LDW(k, v), s), d), rk), \
                             wv[v], bv[v])
    if (YE && put) {   /* half-storage rows to the writer (put: every row is finished) */
        for (int k = 0; k < R; k++) {
            __m512 s = _mm512_set1_ps(sh[k]), d = _mm512_set1_ps(dm[k]), rk = _mm512_set1_ps(r[k]);
            for (int v = 0; v + 1 < NV; v += 2) PUT16(Y(v), Y(v + 1));
        }
    } else
    for (int k = 0; k < R; k++) {   /* y = (x - x0 - dm) * r * w + b */
        if (!((ok >> k) & 1)) continue;
        __m512 s = _mm512_set1_ps(sh[k]), d = _mm512_set1_ps(dm[k]), rk = _mm512_set1_ps(r[k]);
        for (int v = 0; v < NV; v++) {
            __m512 c = _mm512_sub_ps(_mm512_sub_ps(LDW(k, v), s), d);
            PUT_OR_ST(k, v, _mm512_fmadd_ps(_mm512_mul_ps(c, rk), wv[v], bv[v]));
        }
    }
#undef Y
    if (put) *ow = wl;
#undef LDW
#undef X0
    return redo;
}

/* RMSNorm forward of one group of 16 * NG rows (R real; NG 1 or 2), rows of
 * NV vectors (NV and NG constants), as rms_rows computes it: r = 1 /
 * sqrt(mean(x^2) + eps) in double from the float mean square, y = x * r * w.
 * Each row's squares add in one vector, reduce16 adds the sixteen rows'; wv
 * holds ones where there is no weight (x * r * 1 is x * r); XE, YI and nt as
 * ln_group16 (y has x's storage; half-storage rows are read twice, converted
 * each time); pf (each NV) and pfw as ln_group16, in the first sweep. Returns
 * the mask of the rows whose mean square lies outside [1e-30, 1e30] (or is
 * not finite), which the caller redoes with rms_rows and its double
 * fallback. */
static inline __attribute__((always_inline)) uint32_t rms_group16(
    void *const *yr, float *rstd, const void *const *xr, const __m512 *wv, int R, int NV,
    int64_t H, __mmask16 tail, double eps, int XE, int YI, int nt, const char *pf, int pfw,
    int NG, ntw *ow)
{
    const int YE = XE;   /* y of the same storage as x */
    float r[32] __attribute__((aligned(64)));
    __m512 acc[32];
    for (int k = 0; k < 16 * NG; k++) {
        __m512 a = _mm512_setzero_ps();
        if (pf) pf_row(pf, k, H * elem_bytes(XE));
        if (pfw && k < R) pfw_row(yr[k], H * 4);
        for (int v = 0; v < NV; v++) {
            __m512 xv = LD(k, v);
            a = _mm512_fmadd_ps(xv, xv, a);
        }
        acc[k] = a;
    }
    uint32_t ok = 0;   /* bit k: row k's mean square is in range */
    for (int g = 0; g < NG; g++) {
        __mmask16 okg;
        __m512 rv = rstd16(div_h16(reduce16(acc + 16 * g), H), eps, &okg);
        _mm512_store_ps(r + 16 * g, rv);
        if (rstd) _mm512_mask_storeu_ps(rstd + 16 * g, okg & real16(R, g), rv);
        ok |= (uint32_t)okg << (16 * g);
    }
    const uint32_t redo = ~ok & (uint32_t)((1ull << R) - 1);
    const int put = ow && !redo;
    ntw wl;
    if (put) wl = *ow;
#define Y(v) _mm512_mul_ps(_mm512_mul_ps(LD(k, v), rk), wv[v])
    if (YE && put) {   /* as ln_group16 */
        for (int k = 0; k < R; k++) {
            __m512 rk = _mm512_set1_ps(r[k]);
            for (int v = 0; v + 1 < NV; v += 2) PUT16(Y(v), Y(v + 1));
        }
    } else
    for (int k = 0; k < R; k++) {
        if (!((ok >> k) & 1)) continue;
        __m512 rk = _mm512_set1_ps(r[k]);
        for (int v = 0; v < NV; v++) PUT_OR_ST(k, v, _mm512_mul_ps(_mm512_mul_ps(LD(k, v), rk), wv[v]));
    }
#undef Y
    if (put) *ow = wl;
    return redo;
}
#undef PUT16
#undef PUT_OR_ST
#undef ST
#undef LD
