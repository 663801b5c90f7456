/*
 * The sixteen-row backward on AVX-512: LayerNorm and RMSNorm backward of
 * float or float16/bfloat16 rows of up to BWD16_MAX_H elements (avx512.h).
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
#include "norm/avx512/rows16.h"


/* ln_bwd_scalars (LN) or rms_bwd_scalars of a row of half storage elem,
 * widened (a row whose float sums overflowed; a function of its own, so
 * that its buffers stay out of the group kernels' frames) */
static SFX(bwd_scalars) bwd_scalars16(int elem, const void *x, const void *g, const float *w,
                                      float m, float r, int64_t H, int LN)
{
    float xf[BWD16_MAX_H], gf[BWD16_MAX_H];
    widen_half(elem, xf, (const uint16_t *)x, H);
    widen_half(elem, gf, (const uint16_t *)g, H);
    return LN ? SFX(ln_bwd_scalars)(xf, gf, w, m, r, H) : SFX(rms_bwd_scalars)(xf, gf, w, r, H);
}

/* Rows [n, n + 16) of the rows at p (rowb bytes each, r1 of them) for
 * bwd_group16, which takes sixteen rows one after another: where all are
 * real, in place; else copied to tile, the spare rows (from r1 on)
 * repeating row r1 - 1. Arrays of sixteen row pointers instead, which the
 * caller builds and the group kernel loads back from the stack, are slower. */
static inline const void *group_rows16(const void *p, int64_t n, int64_t r1, int64_t rowb,
                                       char *tile)
{
    const char *q = (const char *)p + n * rowb;
    if (n + 16 <= r1) return q;
    const int R = (int)(r1 - n);
    memcpy(tile, q, (size_t)(R * rowb));
    for (int k = R; k < 16; k++) memcpy(tile + k * rowb, q + (R - 1) * rowb, (size_t)rowb);
    return tile;
}

/* In the group kernels below (E, NV, tail, rowb theirs): row k of the rows
 * at p, and vector v of that row as floats (MASK: rows16.h). */
#define ROW(p, k) ((const char *)(p) + (k) * rowb)
#define LDB(p, k, v) (E ? ld_half(E, (const uint16_t *)ROW(p, k) + 16 * (v), MASK(v)) \
                        : _mm512_maskz_loadu_ps(MASK(v), (const float *)ROW(p, k) + 16 * (v)))

/* Sweep 1 of a group of sixteen rows (bwd_group16): S[0], S[1], S[2] get, lane
 * k, row k's sum of d = x - m, of g = dy * w and of g * d (RMSNorm: only
 * S[2], the sum of g * x). Rows of several vectors keep each row's sums
 * (sd, sg, sgd[k]) for reduce16. Rows of one vector put them into
 * reduce16's tree as they come, the same bits: each pair of rows (sd2..
 * [k & 1] -> bd..), then each four (-> qd..). With their loop unrolled, all
 * of it stays in registers, where the sixteen rows' 48 sums would spill to
 * the stack. For rows of 2-8 vectors the pairwise form is slower, rolled or
 * unrolled. px, pg: as bwd_group16's. */
static inline __attribute__((always_inline)) void bwd16_sums(
    __m512 *S, const void *x0, const void *g0, const float *m, const __m512 *wv, int NV, int LN,
    int64_t H, __mmask16 tail, const char *px, const char *pg, int E)
{
    const int64_t rowb = H * elem_bytes(E);
    __m512 sd[16], sg[16], sgd[16];
    __m512 sd2[2], sg2[2], sgd2[2], bd[2], bg[2], bgd[2], qd[4], qg[4], qgd[4];
#define SWEEP1(k)                                                                      \
    do {                                                                               \
        __m512 mk = _mm512_set1_ps(m[k]), ad = _mm512_setzero_ps(), ag = ad, agd = ad; \
        if (px && NV == 1) {                                                           \
            _mm_prefetch(px + (k) * rowb, _MM_HINT_T0);                                \
            _mm_prefetch(pg + (k) * rowb, _MM_HINT_T0);                                \
        } else if (px) {                                                               \
            pf_row(px, k, rowb);                                                       \
            pf_row(pg, k, rowb);                                                       \
        }                                                                              \
        for (int v = 0; v < NV; v++) {                                                 \
            __m512 xv = LDB(x0, k, v);                                                 \
            __m512 g = _mm512_mul_ps(LDB(g0, k, v), wv[v]);                            \
            if (LN) {                                                                  \
                __m512 d = _mm512_maskz_sub_ps(MASK(v), xv, mk);                       \
                ad = v ? _mm512_add_ps(ad, d) : d;                                     \
                ag = v ? _mm512_add_ps(ag, g) : g;                                     \
                agd = v ? _mm512_fmadd_ps(g, d, agd) : _mm512_mul_ps(g, d);            \
            } else {                                                                   \
                agd = v ? _mm512_fmadd_ps(g, xv, agd) : _mm512_mul_ps(g, xv);          \
            }                                                                          \
        }                                                                              \
        if (NV > 1) {                                                                  \
            sd[k] = ad;                                                                \
            sg[k] = ag;                                                                \
            sgd[k] = agd;                                                              \
        } else {                                                                       \
            sd2[(k) & 1] = ad;                                                         \
            sg2[(k) & 1] = ag;                                                         \
            sgd2[(k) & 1] = agd;                                                       \
        }                                                                              \
        if (NV == 1 && ((k) & 1)) {                                                    \
            const int j_ = ((k) >> 1) & 1;                                             \
            bd[j_] = red_pair(sd2[0], sd2[1]);                                         \
            bg[j_] = red_pair(sg2[0], sg2[1]);                                         \
            bgd[j_] = red_pair(sgd2[0], sgd2[1]);                                      \
        }                                                                              \
        if (NV == 1 && ((k) & 3) == 3) {                                               \
            qd[(k) >> 2] = red_quad(bd[0], bd[1]);                                     \
            qg[(k) >> 2] = red_quad(bg[0], bg[1]);                                     \
            qgd[(k) >> 2] = red_quad(bgd[0], bgd[1]);                                  \
        }                                                                              \
    } while (0)
    /* Rows of one vector: the loop unrolled, a prefetch of x and dy each a
     * row. Longer rows run slower unrolled. */
    if (NV == 1) {
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) SWEEP1(k);
    } else {
        for (int k = 0; k < 16; k++) SWEEP1(k);
    }
#undef SWEEP1
    /* + 0: a row's sums began at the first vector's values, not at 0 + them
     * (three adds fewer a row). Such a sum differs
     * only where it is -0 and the other +0, and adding +0 makes it +0. */
    const __m512 z = _mm512_setzero_ps();
    __m512 S_gd = _mm512_add_ps(NV == 1 ? red_final(qgd) : reduce16(sgd), z);
    __m512 S_d = !LN ? z : _mm512_add_ps(NV == 1 ? red_final(qd) : reduce16(sd), z);
    __m512 S_g = !LN ? z : _mm512_add_ps(NV == 1 ? red_final(qg) : reduce16(sg), z);
    S[0] = S_d;
    S[1] = S_g;
    S[2] = S_gd;
}

/* The scalars of a group's rows from their sums S (bwd16_sums): dm, c1, c2,
 * lane k row k's, as ln_bwd_scalars/rms_bwd_scalars compute them, in double
 * lanes; a row whose float sums are not finite gets them from that one-row
 * code (its double fallback). m, r: the rows' mean and rstd. */
static inline __attribute__((always_inline)) void bwd16_scalars(
    float *dm, float *c1, float *c2, const __m512 *S, const float *m, const float *r,
    const void *x0, const void *g0, const float *w, int R, int LN, int64_t H, int E)
{
    const int64_t rowb = H * elem_bytes(E);
    const __m512 S_d = S[0], S_g = S[1], S_gd = S[2];
    __m512 big = _mm512_set1_ps(FLT_MAX);
    __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(S_gd), big, _CMP_LE_OQ);
    if (LN)
        ok &= _mm512_cmp_ps_mask(_mm512_abs_ps(S_d), big, _CMP_LE_OQ) &
              _mm512_cmp_ps_mask(_mm512_abs_ps(S_g), big, _CMP_LE_OQ);
    /* the scalars in double lanes, eight rows at a time (for H a power of
     * two, multiplied by 1 / H: the same bits without the divider) */
    for (int h = 0; h < 2; h++) {
#define HALF(v) _mm512_cvtps_pd(h ? _mm512_extractf32x8_ps((v), 1) : _mm512_castps512_ps256(v))
        __m512d sd_ = HALF(S_d), sg_ = HALF(S_g), sgd_ = HALF(S_gd);
        __m512d rd = HALF(_mm512_loadu_ps(r));
#undef HALF
        __m512d dmd = div_hd(sd_, H);
        __m512d c2d = div_hd(_mm512_mul_pd(rd, _mm512_fnmadd_pd(dmd, sg_, sgd_)), H);
        _mm256_store_ps(dm + 8 * h, _mm512_cvtpd_ps(dmd));
        _mm256_store_ps(c1 + 8 * h, _mm512_cvtpd_ps(div_hd(sg_, H)));
        _mm256_store_ps(c2 + 8 * h, _mm512_cvtpd_ps(c2d));
    }
    /* rows whose float sums overflowed: in double (a loop over their bits;
     * a loop over all rows testing each one's bit keeps its counters on the
     * stack, which costs rows of one vector noticeably) */
    for (uint32_t bad = ~(uint32_t)ok & ((1u << R) - 1); bad; bad &= bad - 1) {
        const int k = __builtin_ctz(bad);
        SFX(bwd_scalars) sc =
            E ? bwd_scalars16(E, ROW(x0, k), ROW(g0, k), w, LN ? m[k] : 0.0f, r[k],
                                      H, LN)
            : LN ? SFX(ln_bwd_scalars)((const float *)ROW(x0, k), (const float *)ROW(g0, k), w,
                                       m[k], r[k], H)
                 : SFX(rms_bwd_scalars)((const float *)ROW(x0, k), (const float *)ROW(g0, k), w,
                                        r[k], H);
        dm[k] = sc.dm;
        c1[k] = sc.c1;
        c2[k] = sc.c2;
    }
}

/* Sweep 2 of a group's R real rows (bwd_group16), a row at a time, its five
 * scalars broadcast once, with the dweight/dbias partials pw, pb held in
 * registers: each column adds the rows in order, as bwd_sweep2 does. A row's
 * dx is stored after that row's loads (dx may be x or dy), to dx0 or with ow
 * to that writer. */
static inline __attribute__((always_inline)) void bwd16_sweep2(
    void *dx0, float *pw, float *pb, const void *x0, const void *g0, const float *m,
    const float *r, const float *dm, const float *c1, const float *c2, const __m512 *wv, int R,
    int NV, int LN, int64_t H, __mmask16 tail, ntw *ow, int E)
{
    const int64_t rowb = H * elem_bytes(E);
#define DXROW(k) ((char *)dx0 + (k) * rowb)
    __m512 sw[NV16], sb[NV16];   /* sweep 2, a row at a time: its scalars broadcast once */
    ntw wl;   /* ow's copy (see PUT_OR_ST) */
    if (ow) wl = *ow;
    for (int v = 0; v < NV; v++) {
        sw[v] = _mm512_maskz_loadu_ps(MASK(v), pw + 16 * v);
        sb[v] = LN ? _mm512_maskz_loadu_ps(MASK(v), pb + 16 * v) : sw[v];
    }
    /* the rows' loop, with dx to ow (W = 1) or stored: two loops, which GCC
     * had made of one only as long as the function stayed small */
#define SWEEP2(W)                                                                    \
    for (int k = 0; k < R; k++) {                                                    \
        const __m512 mk = _mm512_set1_ps(m[k]), dk = _mm512_set1_ps(dm[k]);          \
        const __m512 rk = _mm512_set1_ps(r[k]), c1k = _mm512_set1_ps(c1[k]);         \
        const __m512 c2k = _mm512_set1_ps(c2[k]);                                    \
        for (int v = 0; v < NV; v++) {                                               \
            __m512 xv = LDB(x0, k, v);                                               \
            __m512 g = LDB(g0, k, v);                                                \
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(xv, mk), dk), rk); \
            sw[v] = _mm512_fmadd_ps(g, xh, sw[v]);                                   \
            if (LN) sb[v] = _mm512_add_ps(sb[v], g);                                 \
            __m512 t = _mm512_fmsub_ps(g, wv[v], c1k);                               \
            __m512 d = _mm512_mul_ps(rk, _mm512_fnmadd_ps(xh, c2k, t));              \
            if (W) ntw_put(&wl, d);                                                  \
            else if (E) st_half(E, 0, (uint16_t *)DXROW(k) + 16 * v, d, MASK(v), 0); \
            else _mm512_mask_storeu_ps((float *)DXROW(k) + 16 * v, MASK(v), d);      \
        }                                                                            \
    }
    if (ow) {
        SWEEP2(1)
    } else {
        SWEEP2(0)
    }
#undef SWEEP2
    for (int v = 0; v < NV; v++) {
        _mm512_mask_storeu_ps(pw + 16 * v, MASK(v), sw[v]);
        if (LN) _mm512_mask_storeu_ps(pb + 16 * v, MASK(v), sb[v]);
    }
    if (ow) *ow = wl;
#undef DXROW
}

/* Backward of one group of 16 rows (R real), rows of NV vectors, LayerNorm
 * (LN = 1: sums of d = x - mean, g = dy*w and g*d) or RMSNorm (LN = 0: the
 * sum of g*x): sweep 1 (bwd16_sums), the scalars (bwd16_scalars), sweep 2
 * (bwd16_sweep2). The rows lie one after another, H values each: x0, g0
 * (x, dy) hold all sixteen (group_rows16), dx0 the R real ones of dx, or
 * with ow dx goes to that writer. px, pg: NULL, or rows of x and dy to
 * prefetch, one of each with each row of sweep 1. */
static inline __attribute__((always_inline)) void bwd_group16(
    void *dx0, float *pw, float *pb, const void *x0, const void *g0,
    const float *mean, const float *rstd, const float *w, int R, int NV, int LN, int64_t H,
    __mmask16 tail, const char *px, const char *pg, ntw *ow, int E)
{
    float mt[16] __attribute__((aligned(64))), rt[16] __attribute__((aligned(64)));
    float dm[16] __attribute__((aligned(64))), c1[16] __attribute__((aligned(64)));
    float c2[16] __attribute__((aligned(64)));
    /* m, r: the rows' mean (0 for RMSNorm) and rstd, read where they lie;
     * a group of fewer than 16 rows repeats row R - 1. (r's vector load, from
     * sixteen scalar stores, would wait for them to leave the store queue.) */
    const float *m = mean, *r = rstd;
    if (R < 16 || !LN) {
        for (int k = 0; k < 16; k++) mt[k] = LN ? mean[k < R ? k : R - 1] : 0.0f;
        m = mt;
    }
    if (R < 16) {
        for (int k = 0; k < 16; k++) rt[k] = rstd[k < R ? k : R - 1];
        r = rt;
    }
    __m512 wv[NV16];
    for (int v = 0; v < NV; v++)
        wv[v] = w ? _mm512_maskz_loadu_ps(MASK(v), w + 16 * v)
                  : _mm512_maskz_mov_ps(MASK(v), _mm512_set1_ps(1.0f));
    __m512 S[3];
    bwd16_sums(S, x0, g0, m, wv, NV, LN, H, tail, px, pg, E);
    bwd16_scalars(dm, c1, c2, S, m, r, x0, g0, w, R, LN, H, E);
    bwd16_sweep2(dx0, pw, pb, x0, g0, m, r, dm, c1, c2, wv, R, NV, LN, H, tail, ow, E);
}
#undef LDB
#undef ROW

/* The backward over rows [r0, r1) of rows of NV vectors (pb == NULL:
 * RMSNorm), H <= BWD16_MAX_H, sixteen rows at a time; rows of E (a
 * constant): float, or half storage converted in registers (dx rounded as
 * st_half does; faster than widening blocks of rows for the float kernel).
 * It prefetches rows up to re (>= r1). Streamed: float dx through an ntw
 * writer where it can, else dx staged a group at a time; staged as well,
 * the last group of fewer than 16 rows (group_rows16). Float and half rows
 * share this loop: a loop of float's own is no faster. */
static inline __attribute__((always_inline)) void bwd_rows16_nv(
    int E, int NV, int LN, void *dx, float *pw, float *pb, const void *dy, const void *x,
    const float *mean, const float *rstd, const float *w, int64_t r0, int64_t r1, int64_t re,
    int64_t H, int stream)
{
    const __mmask16 tail = tail16(H);
    const int64_t rowb = H * elem_bytes(E);
    float stage[16 * BWD16_MAX_H] __attribute__((aligned(64)));
    float xt[16 * BWD16_MAX_H] __attribute__((aligned(64)));
    float gt[16 * BWD16_MAX_H] __attribute__((aligned(64)));
    ntw w_;
    ntw *const ow = !E && stream && ntw_ok((float *)dx, H) ? &w_ : NULL;
    if (ow) ntw_init(ow, (float *)dx + r0 * H);
    for (int64_t n = r0; n < r1; n += 16) {
        const int R = r1 - n < 16 ? (int)(r1 - n) : 16;
        const void *x0 = group_rows16(x, n, r1, rowb, (char *)xt);
        const void *g0 = group_rows16(dy, n, r1, rowb, (char *)gt);
        char *dxn = (char *)dx + n * rowb;
        void *dx0 = stream || R < 16 ? (void *)stage : (void *)dxn;
        /* prefetch the rows ahead, a row of x and dy with each row of sweep 1:
         * 16 rows and at least 512 values ahead (nearer or farther is slower;
         * a burst of a few KiB a group falls behind). Up to re, across the end
         * of the caller's block of rows, so that the last group of each block
         * has its rows fetched too. */
        const int64_t ahead = 16 * H < 512 ? 512 : 16 * H;   /* values */
        const int64_t pfo = n * rowb + ahead * elem_bytes(E);
        const char *px = n + 16 + ahead / H <= re ? (const char *)x + pfo : NULL;
        const char *pg = px ? (const char *)dy + pfo : NULL;
        bwd_group16(dx0, pw, pb, x0, g0, LN ? mean + n : NULL, rstd + n, w, R, NV, LN, H,
                    tail, px, pg, ow, E);
        if (stream && !ow) stream_copy(dxn, stage, (size_t)(R * rowb));
        else if (!stream && R < 16) memcpy(dxn, stage, (size_t)(R * rowb));
    }
    if (ow) ntw_finish(ow);
    if (stream) stream_fence();
}

/* bwd_rows16_nv for each (NV, LN) a function of its own, for the three
 * storages: float, float16, bfloat16. As one function a storage, with the
 * switch over (NV, LN) inside the loop over groups, GCC keeps more of each
 * instance's pointers, the half-storage loads and the streaming writer on
 * the stack, which is slower. bfloat16 dx takes the integer rounding on
 * every CPU (bf16i 0): VCVTNEPS2BF16 gives the same bits no faster, and
 * its instances of bwd_group16 would cost compile time. */
#define BWD16_FN(NV, LN)                                                                    \
    static __attribute__((noinline)) void CAT3(bwd16_, NV, LN)(                             \
        int elem, void *dx, float *pw, float *pb, const void *dy, const void *x,            \
        const float *mean, const float *rstd, const float *w, int64_t r0, int64_t r1,       \
        int64_t re, int64_t H, int stream)                                                  \
    {                                                                                       \
        if (elem == ELEM_F32)                                                               \
            bwd_rows16_nv(ELEM_F32, NV, LN, dx, pw, pb, dy, x, mean, rstd, w, r0, r1,       \
                               re, H, stream);                                              \
        else if (elem == FASTLN_F16)                                                        \
            bwd_rows16_nv(FASTLN_F16, NV, LN, dx, pw, pb, dy, x, mean, rstd, w, r0, r1,     \
                               re, H, stream);                                              \
        else                                                                                \
            bwd_rows16_nv(FASTLN_BF16, NV, LN, dx, pw, pb, dy, x, mean, rstd, w, r0,        \
                               r1, re, H, stream);                                          \
    }
#define BWD16_FNS(NV) BWD16_FN(NV, 0) BWD16_FN(NV, 1)
BWD16_FNS(1) BWD16_FNS(2) BWD16_FNS(3) BWD16_FNS(4)
BWD16_FNS(5) BWD16_FNS(6) BWD16_FNS(7) BWD16_FNS(8)
#undef BWD16_FNS
#undef BWD16_FN

/* The backward over rows [r0, r1) as bwd_rows (pb == NULL: RMSNorm), H <=
 * BWD16_MAX_H, rows of elem: ELEM_F32, FASTLN_F16 or FASTLN_BF16. */
void fastln_avx512_bwd_rows16(int elem, void *dx, float *pw, float *pb, const void *dy,
                            const void *x, const float *mean, const float *rstd, const float *w,
                            int64_t r0, int64_t r1, int64_t re, int64_t H, int stream)
{
#define G16(NV, LN) \
    CAT3(bwd16_, NV, LN)(elem, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, re, H, stream)
#define CASE(NV)                    \
    case 2 * NV: G16(NV, 0); break; \
    case 2 * NV + 1: G16(NV, 1); break;
    switch ((int)((H + 15) / 16) * 2 + (pb != NULL)) {   /* rows of 1 to NV16 vectors */
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    }
#undef CASE
#undef G16
}

#include "isa/type_end.h"
#include "isa/end.h"
#endif
