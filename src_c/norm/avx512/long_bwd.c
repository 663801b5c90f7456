/*
 * The long-row backward on AVX-512: LayerNorm (LN) and RMSNorm backward of
 * rows longer than BWD16_MAX_H, float or half storage (avx512.h), converted
 * in registers; HW: a weight. One sweep a row: dx and the dweight/dbias
 * partials of this row (bwd_sweep2's arithmetic one row at a time, so the
 * partials add in the same order), and the sums of the next row
 * (ln_bwd_scalars/rms_bwd_scalars lane for lane), whose loads from memory
 * overlap this row's arithmetic. With nt, dx goes out by non-temporal stores
 * after a masked head up to the store alignment.
 */
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include "isa/target_avx512.h"
#include "isa/begin.h"
#include "isa/simd.h"
#include "norm/avx512/avx512.h"
#define IS_F32 1
#include "isa/type_begin.h"
#include "norm/sums.h"
#include "norm/bwd_stats.h"
#include "norm/avx512/long.h"

#define PF_LONG_BWD 4096   /* the prefetch distance of the sums, bytes */


/* Adds lanes m at element i of a row to its sums: LN sum(d), sum(g), sum(g*d)
 * (d = x - mean, g = dy * w); RMSNorm sum(g*x) in agd. */
static inline __attribute__((always_inline)) void bsum16(
    int elem, int LN, int HW, const void *x, const void *dy, const float *w, int64_t i,
    __mmask16 m, __m512 mv, __m512 *ad, __m512 *ag, __m512 *agd)
{
    __m512 xv = ld_k(elem, x, i, m), g = ld_k(elem, dy, i, m);
    if (HW) g = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, w + i));
    if (LN) {
        __m512 d = _mm512_sub_ps(xv, mv);
        *ad = _mm512_mask_add_ps(*ad, m, *ad, d);
        *ag = _mm512_mask_add_ps(*ag, m, *ag, g);
        *agd = _mm512_mask3_fmadd_ps(g, d, *agd, m);
    } else {
        *agd = _mm512_mask3_fmadd_ps(g, xv, *agd, m);
    }
}

/* Lanes m at element j of a row: dx, and the partials pw (+= dy * xhat) and,
 * with LN, pb (+= dy). s: the row's scalars m, dm, r, c1, c2 as vectors.
 * Every load comes before the stores (4K aliasing; dx may be x or dy). */
static inline __attribute__((always_inline)) void bdx16(
    int elem, int bf16i, int LN, int HW, void *dx, float *pw, float *pb, const void *x,
    const void *dy,
    const float *w, int64_t j, __mmask16 m, const __m512 *s, int nt)
{
    __m512 xv = ld_k(elem, x, j, m), g = ld_k(elem, dy, j, m);
    __m512 wv = HW ? _mm512_maskz_loadu_ps(m, w + j) : _mm512_set1_ps(1.0f);
    __m512 sw = _mm512_maskz_loadu_ps(m, pw + j);
    __m512 sb = LN ? _mm512_maskz_loadu_ps(m, pb + j) : sw;
    __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(xv, s[0]), s[1]), s[2]);
    __m512 t = _mm512_fmsub_ps(g, wv, s[3]);                     /* g * w - c1 */
    st_k(ELEM_F32, 0, pw, j, _mm512_fmadd_ps(g, xh, sw), m, 0);
    if (LN) st_k(ELEM_F32, 0, pb, j, _mm512_add_ps(sb, g), m, 0);
    st_k(elem, bf16i, dx, j, _mm512_mul_ps(s[2], _mm512_fnmadd_ps(xh, s[4], t)), m, nt);
}

/* One sweep: with xa, dx of row a (dy ga, scalars s) into dxa and the
 * partials; with xb, the sums of row b (dy gb, mean mb) into S. */
static inline __attribute__((always_inline)) void bwd_pass(
    int elem, int bf16i, int LN, int HW, void *dxa, float *pw, float *pb, const void *xa,
    const void *ga, const __m512 *s, const void *xb, const void *gb, float mb, const float *w,
    int64_t H, int nt, double *S, int pf, const char *xend, const char *gend)
{
    const int64_t esz = elem_bytes(elem);
    int64_t j = H;
    if (xa) {
        j = (uintptr_t)dxa % esz ? 0 : (int64_t)((-(uintptr_t)dxa & (16 * esz - 1)) / esz);
        if (j > H) j = H;
        if (j)
            bdx16(elem, bf16i, LN, HW, dxa, pw, pb, xa, ga, w, 0, (__mmask16)((1u << j) - 1), s,
                  nt);
    }
#define DX16()                                                                             \
    do {                                                                                   \
        __mmask16 m_ = H - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - j)) - 1); \
        bdx16(elem, bf16i, LN, HW, dxa, pw, pb, xa, ga, w, j, m_, s, nt);                  \
        j += 16;                                                                           \
    } while (0)
    if (xb) {
        const __m512 mv = _mm512_set1_ps(mb);
        S[0] = S[1] = S[2] = 0;
        for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
            int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK, i = 0;
            __m512 ad[4], ag[4], agd[4];
            for (int q = 0; q < 4; q++) ad[q] = ag[q] = agd[q] = _mm512_setzero_ps();
            for (; i + 64 <= n; i += 64) {   /* lanes as ln_bwd_scalars' ad[64] */
                if (pf) {
                    const char *xo = (const char *)xb + (c0 + i) * esz;
                    const char *go = (const char *)gb + (c0 + i) * esz;
                    pf_ahead(xo, 64 * esz, PF_LONG_BWD, xend);
                    pf_ahead(go, 64 * esz, PF_LONG_BWD, gend);
                }
                for (int q = 0; q < 4; q++)
                    bsum16(elem, LN, HW, xb, gb, w, c0 + i + 16 * q, (__mmask16)0xFFFF, mv,
                           &ad[q], &ag[q], &agd[q]);
                for (int k = 0; k < 4 && j < H; k++) DX16();
            }
            if (i < n)
                for (int q = 0; q < 4; q++)
                    bsum16(elem, LN, HW, xb, gb, w, c0 + i + 16 * q, TAILMASK(n, i, q), mv,
                           &ad[q], &ag[q], &agd[q]);
            if (LN) {
                S[0] += hsum4(ad);
                S[1] += hsum4(ag);
            }
            S[2] += hsum4(agd);
        }
    }
    while (j < H) DX16();
#undef DX16
}

/* The scalars of row n from its sums S, as vectors (half-storage rows whose sums
 * are not finite are widened into buf for the double fallback). */
static inline __attribute__((always_inline)) void bwd_vscalars(
    int elem, int LN, __m512 *s, const double *S, const void *xr, const void *gr,
    const float *w, const float *mean, const float *rstd, int64_t n, int64_t H, float *buf)
{
    const float *xf = (const float *)xr, *gf = (const float *)gr;
    int finite = LN ? isfinite(S[0]) && isfinite(S[1]) && isfinite(S[2]) : isfinite(S[2]);
    if (elem != ELEM_F32 && !finite) {
        widen_half(elem, buf, (const uint16_t *)xr, H);
        widen_half(elem, buf + H, (const uint16_t *)gr, H);
        xf = buf;
        gf = buf + H;
    }
    SFX(bwd_scalars) sc = LN ? SFX(ln_bwd_finish)(xf, gf, w, mean[n], rstd[n], H, S[0], S[1], S[2])
                             : SFX(rms_bwd_finish)(xf, gf, w, rstd[n], H, S[2]);
    s[0] = _mm512_set1_ps(sc.m);
    s[1] = _mm512_set1_ps(sc.dm);
    s[2] = _mm512_set1_ps(sc.r);
    s[3] = _mm512_set1_ps(sc.c1);
    s[4] = _mm512_set1_ps(sc.c2);
}

/* Backward rows [r0, r1): LayerNorm when pb != NULL, else RMSNorm (as
 * bwd_rows). buf: 2H floats of scratch for half-storage rows; bf16i: see
 * isa/simd.h; nt: non-temporal dx
 * (fenced here), from the sweep, or with stg (as long_rows_k's) staged;
 * pf (a constant): prefetch x and dy PF_LONG_BWD bytes ahead of the sums,
 * short of r1. */
static inline __attribute__((always_inline)) void long_bwd_k(
    int elem, int bf16i, int LN, int HW, int pf, void *dx, float *pw, float *pb, const void *dy,
    const void *x, const float *mean, const float *rstd, const float *w, int64_t r0, int64_t r1,
    int64_t H, float *buf, int nt, char *stg)
{
    const int64_t rowb = H * elem_bytes(elem);
    const char *xc = (const char *)x, *gc = (const char *)dy;
    double S[3] = {0, 0, 0};
    __m512 s[5];
    if (r0 >= r1) return;
    const char *xend = xc + r1 * rowb, *gend = gc + r1 * rowb;
    bwd_pass(elem, bf16i, LN, HW, NULL, pw, pb, NULL, NULL, NULL, xc + r0 * rowb, gc + r0 * rowb,
             LN ? mean[r0] : 0, w, H, nt, S, pf, xend, gend);
    bwd_vscalars(elem, LN, s, S, xc + r0 * rowb, gc + r0 * rowb, w, mean, rstd, r0, H, buf);
    for (int64_t n = r0; n < r1; n++) {
        const char *xb = n + 1 < r1 ? xc + (n + 1) * rowb : NULL, *gb = gc + (n + 1) * rowb;
        char *dxr = stg ? stg : (char *)dx + n * rowb;
        bwd_pass(elem, bf16i, LN, HW, dxr, pw, pb, xc + n * rowb, gc + n * rowb, s, xb, gb,
                 xb && LN ? mean[n + 1] : 0, w, H, nt && !stg, S, pf, xend, gend);
        if (stg) stream_copy((char *)dx + n * rowb, stg, (size_t)rowb);   /* row n read */
        if (xb) bwd_vscalars(elem, LN, s, S, xb, gb, w, mean, rstd, n + 1, H, buf);
    }
    if (nt) stream_fence();
}

void fastln_avx512_long_bwd(int elem, void *dx, float *pw, float *pb, const void *dy,
                            const void *x, const float *mean, const float *rstd, const float *w,
                            int64_t r0, int64_t r1, int64_t H, float *buf, int nt)
{
    /* pf: rows longer than 4 KiB, and streamed ones, prefetch PF_LONG_BWD
     * bytes ahead of the sums in x and dy (a constant for each instance: a
     * test in the loop is slower); shorter rows in cache only lose time
     * to it. */
    const int64_t rowb = H * elem_bytes(elem);
    const int pf = nt || rowb > 4096;
    /* stg: streamed rows shorter than STAGE_ROW_BYTES stage dx (their own
     * non-temporal stores would start and end on partial lines); rows of
     * 4 KiB are slower that way, at any offset of the staging row. */
    char stg_[STAGE_ROW_BYTES] __attribute__((aligned(64)));
    char *stg = nt && rowb < STAGE_ROW_BYTES ? stg_ : NULL;
#define K_(E, BI, LN, HW, PF) \
    long_bwd_k(E, BI, LN, HW, PF, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, H, buf, nt, stg)
#define CASE(E, BI, LN, HW)           \
    case LN * 2 + HW:                 \
        if (pf) K_(E, BI, LN, HW, 1); \
        else K_(E, BI, LN, HW, 0);    \
        break;
#define CASES(E, BI)                                                                      \
    switch ((pb != NULL) * 2 + (w != NULL)) {                                             \
        CASE(E, BI, 0, 0) CASE(E, BI, 0, 1) CASE(E, BI, 1, 0) CASE(E, BI, 1, 1)           \
    }
    if (elem == ELEM_F32) CASES(ELEM_F32, 0)
    else if (elem == FASTLN_F16) CASES(FASTLN_F16, 0)
    else if (bf16_insn_for(elem)) CASES(FASTLN_BF16, 1)
    else CASES(FASTLN_BF16, 0)
#undef CASES
#undef CASE
#undef K_
}
#undef TAILMASK

#include "isa/type_end.h"
#include "isa/end.h"
#endif
