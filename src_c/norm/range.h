/*
 * The row ranges of a path, written once per (element type, ISA)
 * (isa/type_begin.h): the row kernels a call's rows go through. AVX-512 in
 * float: the forwards go sixteen rows at a time up to rows of FWD16_MAX_H
 * (avx512/rows16_fwd.c), longer rows through the long-row forward
 * (avx512/long_fwd.c); elsewhere through the portable kernels (rows.h).
 * buf != NULL: streaming stores.
 */
#if AVX512_F32
#include "norm/avx512/avx512.h"
#endif

static void SFX(ln_range)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                          int64_t r0, int64_t r1, int64_t H, double eps, T *buf)
{
#if AVX512_F32
    if (H <= FWD16_MAX_H)
        fastln_avx512_fwd_rows16(0, y, NULL, mean, rstd, x, NULL, w, b, r0, r1, H, eps,
                                 buf != NULL);
    else
        fastln_avx512_long_fwd(ELEM_F32, 0, y, NULL, mean, rstd, x, NULL, w, b, r0, r1, H, eps,
                               NULL, buf != NULL);
#else
    SFX(ln_rows)(y, mean, rstd, x, w, b, r0, r1, H, eps, buf);
#endif
}

static void SFX(rms_range)(T *y, T *rstd, const T *x, const T *w, int64_t r0, int64_t r1,
                           int64_t H, double eps, T *buf)
{
#if AVX512_F32
    if (H <= FWD16_MAX_H)
        fastln_avx512_fwd_rows16(1, y, NULL, NULL, rstd, x, NULL, w, NULL, r0, r1, H, eps,
                                 buf != NULL);
    else
        fastln_avx512_long_fwd(ELEM_F32, 1, y, NULL, NULL, rstd, x, NULL, w, NULL, r0, r1, H,
                               eps, NULL, buf != NULL);
#else
    SFX(rms_rows)(y, rstd, x, w, r0, r1, H, eps, buf);
#endif
}

static void SFX(add_ln_range)(T *y, T *s, T *mean, T *rstd, const T *x, const T *res,
                              const T *w, const T *b, int64_t r0, int64_t r1, int64_t H,
                              double eps, T *buf)
{
#if AVX512_F32
    if (H <= FWD16_MAX_H)
        fastln_avx512_fwd_rows16(0, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf != NULL);
    else
        fastln_avx512_long_fwd(ELEM_F32, 0, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, NULL,
                               buf != NULL);
#else
    SFX(add_norm_each)(0, y, s, mean, rstd, x, res, r1, NULL, w, b, r0, r1, H, eps, buf);
#endif
}

/* Backward rows [r0, r1) (buf != NULL: streaming stores; hot: the call's
 * data fits the cache; rows up to re >= r1 may be prefetched: the rows the
 * calling thread does next). On AVX-512 in float, rows of up to
 * BWD16_MAX_H go sixteen at a time (norm/avx512/rows16_bwd.c, which prefetches;
 * its staged dx also streams whole lines, where the long-row backward's rows
 * of a few lines each start and end on a partial one). Longer rows go
 * through the long-row backward (norm/avx512/long_bwd.c) where the data comes
 * from memory, and hot ones through bwd_rows (its groups of rows update the
 * partials less often, which wins when no load waits on memory), and so do
 * LayerNorm's streamed rows of up to ROWS4_H. Elsewhere bwd_rows. Rows of one
 * element, on every path, go through bwd_rows1. */
static void SFX(bwd_range)(T *dx, T *pw, T *pb, const T *dy, const T *x, const T *mean,
                           const T *rstd, const T *w, int64_t r0, int64_t r1, int64_t re,
                           int64_t H, T *buf, int hot)
{
    if (H == 1) {
        SFX(bwd_rows1)(dx, pw, pb, dy, x, mean, rstd, w, r0, r1);
        return;
    }
#if AVX512_F32
    if (H <= BWD16_MAX_H) {
        fastln_avx512_bwd_rows16(ELEM_F32, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, re, H,
                                 buf != NULL);
        return;
    }
    if (!hot && (H > ROWS4_H || !buf || !pb)) {
        fastln_avx512_long_bwd(ELEM_F32, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, H, NULL,
                               buf != NULL);
        return;
    }
#else
    (void)hot;
#endif
    (void)re;
    SFX(bwd_rows)(dx, pw, pb, dy, x, mean, rstd, w, r0, r1, H, buf);
}
