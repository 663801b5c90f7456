/*
 * The long-row forwards on AVX-512: LayerNorm, RMSNorm and add + LayerNorm
 * of rows longer than FWD16_MAX_H, float or half storage (avx512.h),
 * widened and narrowed in registers.
 *
 * One sweep a row: y, which also sums the next row, so that the next row's
 * loads from memory overlap this row's arithmetic in cache. RMSNorm sums the
 * squares. LayerNorm sums x - t and (x - t)^2 around t, the mean of the
 * row's first 16 values, and takes var = mean((x - t)^2) - mean(x - t)^2
 * where (mean - t)^2 <= var / 2 (a row with a head far from its mean, or a
 * bad sum, gets the centred squares in a second sweep). With a residual,
 * every sweep reads x + res (the same float sum each time) and the y sweep
 * stores it as s, or (sf) the first sweep stores s and the others read it.
 * With nt, y (and s) go out by non-temporal stores from a 64-byte boundary
 * (the row's first vectors masked up to it), or for rows of up to
 * STAGE_ROW_BYTES through an L1 staging row, and the y sweep prefetches the
 * rows ahead into L1. The sums follow the lanes of norm/sums.h (four
 * vectors, chunks of CHUNK added in double), so a row's results do not
 * depend on where its range starts, and half-storage rows get those of the
 * float kernels on the widened row, rounded once. Rows whose statistics need
 * the fallbacks go through the one-row float code (half-storage ones widened
 * into scratch). RMSNorm's streamed float rows of whole vectors up to
 * STAGE_ROW_BYTES go through an ntw writer instead of the staging row;
 * LayerNorm's keep the staging row (its y sweep also sums the next row, and
 * gains nothing from the writer).
 */
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include "isa/target_avx512.h"
#include "isa/begin.h"
#include "isa/simd.h"
#include "norm/avx512/avx512.h"
#define IS_F32 1
#include "isa/type_begin.h"
#include "norm/sums.h"
#include "norm/stats.h"
#include "norm/avx512/long.h"

#define PF_AHEAD 4096   /* the y sweep's prefetch distance, bytes */

/* a, b to elements i..i+31 of p (half storage elem) in one 64-byte store;
 * non-temporal with nt where aligned (two 32-byte halves of a line stored
 * non-temporally are slower than cached stores). bfloat16 with bf16i: one
 * VCVTNE2PS2BF16 whatever the values, and the lanes of a or b that hold a
 * subnormal set to all ones in *sub, for the caller to store again
 * (norm_row; a vector, as a mask it went through general registers). */
static inline __attribute__((always_inline)) void st_pair(
    int elem, int bf16i, void *p, int64_t i, __m512 a, __m512 b, int nt, __m512i *sub)
{
    __m512i h;
    if (elem == FASTLN_BF16 && bf16i) {
        const __m512i ones = _mm512_set1_epi32(-1);
        *sub = _mm512_mask_mov_epi32(*sub, _mm512_fpclass_ps_mask(a, 0x20), ones);
        *sub = _mm512_mask_mov_epi32(*sub, _mm512_fpclass_ps_mask(b, 0x20), ones);
        h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    } else {
        h = narrow32(elem, bf16i, a, b);
    }
    uint16_t *q = (uint16_t *)p + i;
    if (nt && !((uintptr_t)q & 63)) _mm512_stream_si512((__m512i *)q, h);
    else _mm512_storeu_si512(q, h);
}

/* x, or with res x + res, at element i (lanes m) */
static inline __attribute__((always_inline)) __m512 ld_in(
    int elem, const void *x, const void *res, int64_t i, __mmask16 m)
{
    __m512 v = ld_k(elem, x, i, m);
    return res ? _mm512_add_ps(v, ld_k(elem, res, i, m)) : v;
}

/* The shift of a row's LayerNorm sums (x + res with res): the mean of its
 * first min(H, 16) values, a value near the row's mean */
static inline float row_shift(int elem, const void *x, const void *res, int64_t H)
{
    const int k = H < 16 ? (int)H : 16;
    __m512 v = ld_in(elem, x, res, 0, (__mmask16)((1u << k) - 1));
    return _mm512_reduce_add_ps(v) / (float)k;
}

/* Prefetches into L1 the part of pf that goes with elements [e, e + 64) of
 * a sweep (elements of esz bytes); always_inline as pf_ahead. Into L1, not
 * L2: the sweep reaches it soon, and L2 is slower. */
static inline __attribute__((always_inline)) void pf_step(const char *pf, int64_t e,
                                                          int64_t esz)
{
    for (int64_t k = 0; k < 64 * esz; k += 64) _mm_prefetch(pf + e * esz + k, _MM_HINT_T0);
}

/* Elements i..i+63 of the chunk at c0 (n elements; full: all 64 in it) of
 * x (x + res with res) into a[0..3], lanes as sum_shifted's acc[64], for
 * v = x - sh: with sq 0, v; with sq 1, (v - d)^2, d NULL meaning 0; with sq
 * 2 (SQ_BOTH), v into a[0..3] and v^2 into a[4..7]. With so (float elem),
 * x (x + res) is also stored there. */

#define SQ_BOTH 2
static inline __attribute__((always_inline)) void acc64(
    int elem, const void *x, const void *res, float *so, int64_t c0, int64_t i, int64_t n,
    int full, __m512 sh, const __m512 *d, int sq, __m512 *a)
{
    for (int q = 0; q < 4; q++) {
        __mmask16 m = full ? (__mmask16)0xFFFF : TAILMASK(n, i, q);
        __m512 v = ld_in(elem, x, res, c0 + i + 16 * q, m);
        if (so) st_k(ELEM_F32, 0, so, c0 + i + 16 * q, v, m, 0);
        v = _mm512_sub_ps(v, sh);
        if (sq == 1 && d) v = _mm512_sub_ps(v, *d);
        if (sq == 1) {
            a[q] = _mm512_mask3_fmadd_ps(v, v, a[q], m);
            continue;
        }
        a[q] = _mm512_mask_add_ps(a[q], m, a[q], v);
        if (sq == SQ_BOTH) a[4 + q] = _mm512_mask3_fmadd_ps(v, v, a[4 + q], m);
    }
}

/* Over a row (x + res with res): sum((x - shift) - dm)^2 with sq 1, else
 * sum(x - shift), and with sq SQ_BOTH also sum((x - shift)^2) into *s2;
 * with so, x (x + res) stored there as acc64 */
static inline __attribute__((always_inline)) double row_sum(
    int elem, const void *x, const void *res, float *so, int64_t H, float shift, float dm,
    int sq, double *s2)
{
    const __m512 sh = _mm512_set1_ps(shift), d = _mm512_set1_ps(dm);
    double total = 0;
    if (sq == SQ_BOTH) *s2 = 0;
    for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
        int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK;
        __m512 a[8];
        for (int q = 0; q < 8; q++) a[q] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 64 <= n; i += 64) acc64(elem, x, res, so, c0, i, n, 1, sh, &d, sq, a);
        if (i < n) acc64(elem, x, res, so, c0, i, n, 0, sh, &d, sq, a);
        total += hsum4(a);
        if (sq == SQ_BOTH) *s2 += hsum4(a + 4);
    }
    return total;
}

/* Lanes m of y at element j from xv = x there, as normalize_row computes it
 * (w, b NULL or not: WB = 2 * !!w + !!b); c = (x - shift) - dm. */
static inline __attribute__((always_inline)) __m512 norm16(
    int WB, __m512 xv, const float *w, const float *b, int64_t j, __mmask16 m, __m512 sh,
    __m512 d, __m512 rv)
{
    __m512 c = _mm512_sub_ps(_mm512_sub_ps(xv, sh), d);
    if (WB == 3)
        return _mm512_fmadd_ps(_mm512_mul_ps(c, rv), _mm512_maskz_loadu_ps(m, w + j),
                               _mm512_maskz_loadu_ps(m, b + j));
    if (WB == 2) return _mm512_mul_ps(_mm512_mul_ps(c, rv), _mm512_maskz_loadu_ps(m, w + j));
    if (WB == 1) return _mm512_fmadd_ps(c, rv, _mm512_maskz_loadu_ps(m, b + j));
    return _mm512_mul_ps(c, rv);
}

/* The y sweep of a row (with res, of x + res, also stored to s); with xn, in
 * the same sweep row_sum(xn, rn, sn, shn, 0, sq, s2) of the next row, returned
 * (else 0), and with pf (pfr) pf_step(pf, ..) (pf_step(pfr, ..)) for each
 * 64 of those elements.
 * y's first vectors end at a 64-byte boundary, so that with nt the others
 * are non-temporal (half-storage values two vectors to a store). A bfloat16
 * row narrowed with bf16i with a subnormal in s or y is stored again at the
 * end (see st_pair). */
static inline __attribute__((always_inline)) double norm_row(
    int elem, int bf16i, int WB, void *y, void *s, const void *x, const void *res, const float *w,
    const float *b, int64_t H, float shift, float dm, float r, int nt, const void *xn,
    const void *rn, float *sn, float shn, int sq, double *s2, const char *pf, const char *pfr,
    ntw *ow)
{
    const __m512 sh = _mm512_set1_ps(shift), d = _mm512_set1_ps(dm), rv = _mm512_set1_ps(r);
    const int64_t esz = elem_bytes(elem);
    const int nt16 = elem == ELEM_F32 && nt;   /* non-temporal one vector at a time */
    /* y's vectors from its first line boundary on, or with ow (float rows of
     * whole vectors, no res) from the row's start, in order, to ow's copy wl
     * (see PUT_OR_ST) */
    int64_t j = ow || (uintptr_t)y % esz ? 0 : (int64_t)((-(uintptr_t)y & 63) / esz);
    if (j > H) j = H;
    ntw wl;
    if (ow) wl = *ow;
    __m512i sub = _mm512_setzero_si512();   /* Y32's subnormal lanes (see st_pair) */
#define FULL16 ((__mmask16)0xFFFF)
#define Y16(I, M)                                                                         \
    do {                                                                                  \
        __mmask16 m_ = (M);                                                               \
        __m512 xv_ = ld_in(elem, x, res, (I), m_);                                        \
        __m512 yv_ = norm16(WB, xv_, w, b, (I), m_, sh, d, rv);                           \
        if (res) st_k(elem, bf16i, s, (I), xv_, m_, nt16);                                \
        if (ow) ntw_put(&wl, yv_);                                                        \
        else st_k(elem, bf16i, y, (I), yv_, m_, nt16);                                    \
    } while (0)
#define Y32(I)   /* elements I..I+31, half storage */                                \
    do {                                                                             \
        __m512 xa_ = ld_in(elem, x, res, (I), FULL16);                               \
        __m512 xb_ = ld_in(elem, x, res, (I) + 16, FULL16);                          \
        if (res) st_pair(elem, bf16i, s, (I), xa_, xb_, nt, &sub);                   \
        st_pair(elem, bf16i, y, (I), norm16(WB, xa_, w, b, (I), FULL16, sh, d, rv),  \
                     norm16(WB, xb_, w, b, (I) + 16, FULL16, sh, d, rv), nt, &sub);  \
    } while (0)
    for (int64_t h = 0; h < j; h += 16)
        Y16(h, j - h >= 16 ? FULL16 : (__mmask16)((1u << (j - h)) - 1));
    double total = 0;
    if (xn) {
        const __m512 shv = _mm512_set1_ps(shn);
        if (sq == SQ_BOTH) *s2 = 0;
        for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
            int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK;
            __m512 a[8];
            for (int q = 0; q < 8; q++) a[q] = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 64 <= n; i += 64) {
                if (pf) pf_step(pf, c0 + i, esz);
                if (pfr) pf_step(pfr, c0 + i, esz);
                acc64(elem, xn, rn, sn, c0, i, n, 1, shv, NULL, sq, a);
                if (j + 64 <= H) {   /* four whole vectors of y: constant masks */
                    if (elem == ELEM_F32) {
                        Y16(j, FULL16);
                        Y16(j + 16, FULL16);
                        Y16(j + 32, FULL16);
                        Y16(j + 48, FULL16);
                    } else {
                        Y32(j);
                        Y32(j + 32);
                    }
                    j += 64;
                }
            }
            if (i < n) acc64(elem, xn, rn, sn, c0, i, n, 0, shv, NULL, sq, a);
            total += hsum4(a);
            if (sq == SQ_BOTH) *s2 += hsum4(a + 4);
        }
    }
    for (; elem != ELEM_F32 && j + 32 <= H; j += 32) Y32(j);
    for (; j + 16 <= H; j += 16) Y16(j, FULL16);
    if (j < H) Y16(j, (__mmask16)((1u << (H - j)) - 1));
    if (elem == FASTLN_BF16 && bf16i && _mm512_test_epi32_mask(sub, sub)) {
        /* a subnormal in s or y, which VCVTNE2PS2BF16 flushed: the row again
         * by Y16, whose stores take the integer rounding for such vectors */
        if (nt) stream_fence();
        for (j = 0; j < H; j += 16) Y16(j, H - j >= 16 ? FULL16 : (__mmask16)((1u << (H - j)) - 1));
    }
    if (ow) *ow = wl;
#undef FULL16
#undef Y32
#undef Y16
    return total;
}

/* Rows [r0, r1) of elem (a constant after inlining); rms: RMSNorm (mean
 * unused, b NULL); res: add + LayerNorm (s = x + res, y = LN(s)). sf (a
 * constant; float with res, not nt): a row's s is stored by the sweep that
 * first sums it, and its later sweeps read s instead of x + res (one load
 * and add fewer); not with nt, where the y sweep streams s out, nor for
 * half-storage s, whose rounded values are not the float sums. bf16i: see
 * isa/simd.h. buf: 2H floats of scratch for half-storage rows that take the
 * fallbacks; nt: non-temporal stores (the caller fences), straight from the
 * y sweep, or with stg (STAGE_ROW_BYTES, 64-byte aligned; not with res) a
 * row's y stored there and then streamed out. */
static inline __attribute__((always_inline)) void long_rows_k(
    int elem, int bf16i, int rms, int sf, void *y, void *s, float *mean, float *rstd,
    const void *x, const void *res, const float *w, const float *b, int64_t r0, int64_t r1,
    int64_t H, double eps, float *buf, int nt, char *stg)
{
    const int64_t rowb = H * elem_bytes(elem);   /* bytes a row */
    /* RMSNorm: stg's float rows of whole vectors go to a writer instead */
    ntw w_;
    ntw *const ow = rms && stg && elem == ELEM_F32 && ntw_ok((float *)y, H) ? &w_ : NULL;
    if (ow) {
        stg = NULL;
        ntw_init(ow, (float *)y + r0 * H);
    }
    const int ntd = nt && !stg && !ow;   /* non-temporal stores in the sweeps */
    const char *xc = (const char *)x, *rc = (const char *)res;
    const int sq = rms ? 1 : SQ_BOTH;   /* the sums a y sweep takes of the next row */
    /* The y sweep prefetches PF_AHEAD bytes ahead of the next row's sums
     * with nt, and LayerNorm also where this thread's rows exceed
     * FASTLN_PF_RANGE_BYTES (in cache it only costs time, and RMSNorm's lighter
     * sweep keeps up without it). With res, x and res both. */
    const int pf_on = nt || (!rms && (r1 - r0) * rowb > FASTLN_PF_RANGE_BYTES);
#define SHIFT(row) (rms ? 0.0f : row_shift(elem, xc + (row) * rowb,               \
                                                res ? rc + (row) * rowb : NULL, H))
    /* s1: the row's sum(x - shift), for RMSNorm sum(x^2) (shift 0); s2 (LN):
     * sum((x - shift)^2) */
    float shift = 0;
    double s1 = 0, s2 = 0;
    if (r0 < r1) {
        shift = SHIFT(r0);
        s1 = row_sum(elem, xc + r0 * rowb, res ? rc + r0 * rowb : NULL,
                     sf ? (float *)s + r0 * H : NULL, H, shift, 0, sq, &s2);
    }
    for (int64_t n = r0; n < r1; n++) {
        const void *xr = xc + n * rowb, *xn = n + 1 < r1 ? xc + (n + 1) * rowb : NULL;
        const void *rr_ = res ? rc + n * rowb : NULL, *rn = res && xn ? rc + (n + 1) * rowb : NULL;
        void *yr = stg ? (void *)stg : (char *)y + n * rowb;
        void *sr = res ? (char *)s + n * rowb : NULL;
        float *sn = sf && xn ? (float *)sr + H : NULL;   /* the next row's s */
        /* where the sweeps below read this row: s once it holds x + res */
        const void *xs = sf ? sr : xr, *rs = sf ? NULL : rr_;
        float *mr = mean ? mean + n : NULL, *rr = rstd ? rstd + n : NULL;
        float shn = xn ? SHIFT(n + 1) : 0;
        const char *pf = xn && pf_on ? (const char *)xn + PF_AHEAD : NULL;
        const char *pfr = rn && pf_on ? (const char *)rn + PF_AHEAD : NULL;
        float dm = rms ? 0 : (float)(s1 / (double)H);
        double var = s1 / (double)H;   /* RMSNorm: the mean square */
        if (!rms) {
            /* the one-sweep variance where the shift lies near the mean:
             * (mean - shift)^2 <= var / 2 bounds its cancellation to a third
             * of the result; else the centred squares, a second sweep */
            double d = s1 / (double)H;
            var = s2 / (double)H - d * d;
            if (!(d * d <= 0.5 * var))
                var = row_sum(elem, xs, rs, NULL, H, shift, dm, 1, NULL) / (double)H;
        }
        double rd = 1.0 / sqrt(var + eps);
        float r = (float)rd;
        if (!(var >= 1e-30 && var <= 1e30) || !isfinite(s1) || isinf(r)) {
            /* the one-row float code, with its fallbacks, on x (or s = x + res
             * in float, stored first); around it the writer ends its block and
             * starts the next one after this row */
            if (ow) ntw_finish(ow);
            float *xf = elem != ELEM_F32 ? buf : res ? (float *)sr : (float *)xr;
            float *yf = elem == ELEM_F32 ? (float *)yr : buf + H;
            for (int64_t i = 0; (elem != ELEM_F32 || (res && !sf)) && i < H; i += 16) {
                __mmask16 m = H - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - i)) - 1);
                __m512 v = ld_in(elem, xr, rr_, i, m);
                _mm512_mask_storeu_ps(xf + i, m, v);
                if (res && elem != ELEM_F32) st_k(elem, bf16i, sr, i, v, m, 0);
            }
            if (rms) fastln_avx512_rms_row(yf, rr, xf, w, H, eps);
            else SFX(ln_finish_row)(yf, mr, rr, xf, w, b, H, eps, shift, s1, dm, var);
            if (elem != ELEM_F32) narrow_half(elem, (uint16_t *)yr, yf, H);
            if (ow) ntw_init(ow, (float *)y + (n + 1) * H);
            s1 = xn ? row_sum(elem, xn, rn, sn, H, shn, 0, sq, &s2) : 0;
        } else {
            if (mr) *mr = (float)((double)shift + (double)dm);
            if (rr) *rr = r;
#define NORM(WB) norm_row(elem, bf16i, WB, yr, sf ? NULL : sr, xs, rs, w, b, H, shift, dm, r, \
                               ntd, xn, rn, sn, shn, sq, &s2, pf, pfr, ow)
            switch (2 * (w != NULL) + (b != NULL)) {   /* RMSNorm: WB 2 or 0, shift = dm = 0 */
            case 3: s1 = NORM(3); break;
            case 2: s1 = NORM(2); break;
            case 1: s1 = NORM(1); break;
            default: s1 = NORM(0); break;
            }
#undef NORM
        }
        if (stg) stream_copy((char *)y + n * rowb, yr, (size_t)rowb);
        shift = shn;
    }
#undef SHIFT
    if (ow) ntw_finish(ow);
    if (nt) stream_fence();
}

/* long_rows_k for each storage (bfloat16 twice: bf16i 1 and 0) and variant
 * (LayerNorm, RMSNorm, add + LayerNorm, add + RMSNorm), a function of each, as the
 * sixteen-row kernels have: in one function for all of them, GCC keeps the
 * weight pointers on the stack and reloads them for each vector. */
#define LONG_FN(KN, V, E, BI, RMS, ADD)                                                     \
    static __attribute__((noinline)) void CAT3(long_, KN, V)(                               \
        void *y, void *s, float *mean, float *rstd, const void *x, const void *res,         \
        const float *w, const float *b, int64_t r0, int64_t r1, int64_t H, double eps,      \
        float *buf, int nt, char *stg)                                                      \
    {                                                                                       \
        long_rows_k(E, BI, RMS, ADD && E == ELEM_F32 && !nt, y, ADD ? s : NULL, mean, rstd, \
                    x, ADD ? res : NULL, w, b, r0, r1, H, eps, buf, nt, stg);               \
    }
#define LONG_FNS(KN, E, BI)           \
    LONG_FN(KN, _ln, E, BI, 0, 0)     \
    LONG_FN(KN, _rms, E, BI, 1, 0)    \
    LONG_FN(KN, _add, E, BI, 0, 1)    \
    LONG_FN(KN, _addrms, E, BI, 1, 1)
LONG_FNS(f32, ELEM_F32, 0)
LONG_FNS(f16, FASTLN_F16, 0)
LONG_FNS(bf16i, FASTLN_BF16, 1)
LONG_FNS(bf16, FASTLN_BF16, 0)
#undef LONG_FNS
#undef LONG_FN

/* The float LayerNorm and add + LayerNorm of rows streamed from the y sweep
 * (longer than STAGE_ROW_BYTES, or with res) in a function of its own, which
 * takes nt and stg at run time: there the functions above are slower, for a
 * reason not found. noipa: compiled for no caller in particular. */
static __attribute__((noipa)) void long_f32_ln_nt(
    void *y, void *s, float *mean, float *rstd, const void *x, const void *res, const float *w,
    const float *b, int64_t r0, int64_t r1, int64_t H, double eps, float *buf, int nt, char *stg)
{
    if (res)
        long_rows_k(ELEM_F32, 0, 0, 0, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf, nt,
                    stg);
    else
        long_rows_k(ELEM_F32, 0, 0, 0, y, NULL, mean, rstd, x, NULL, w, b, r0, r1, H, eps, buf,
                    nt, stg);
}

/* long_rows_k for elem; with res add + LayerNorm (add + RMSNorm with rms) into y and s */
void fastln_avx512_long_fwd(int elem, int rms, void *y, void *s, float *mean, float *rstd,
                            const void *x, const void *res, const float *w, const float *b,
                            int64_t r0, int64_t r1, int64_t H, double eps, float *buf, int nt)
{
    char stg_[STAGE_ROW_BYTES] __attribute__((aligned(64)));
    char *stg = nt && !res && H * elem_bytes(elem) <= STAGE_ROW_BYTES ? stg_ : NULL;
    if (nt && elem == ELEM_F32 && !rms && !stg) {
        long_f32_ln_nt(y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf, nt, stg);
        return;
    }
#define F_(KN, V) CAT3(long_, KN, V)(y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf, nt, stg)
#define VARIANT(KN)                          \
    do {                                     \
        if (rms && res) F_(KN, _addrms);     \
        else if (rms) F_(KN, _rms);          \
        else if (res) F_(KN, _add);          \
        else F_(KN, _ln);                    \
    } while (0)
    if (elem == ELEM_F32) VARIANT(f32);
    else if (elem == FASTLN_F16) VARIANT(f16);
    else if (bf16_insn_for(elem)) VARIANT(bf16i);
    else VARIANT(bf16);
#undef VARIANT
#undef F_
}

#include "isa/type_end.h"
#include "isa/end.h"
#endif
