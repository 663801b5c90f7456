/*
 * The row ranges of half storage (float16 and bfloat16: FASTLN_F16,
 * FASTLN_BF16; compiled for float only), written once per ISA: half the
 * bytes of float32 in and out, the same float math. On AVX-512 the kernels
 * of norm/avx512/ convert in registers. Elsewhere rows go in blocks of about
 * 8192 elements (cache_block, add.h),
 * widened into float scratch that stays in L1/L2 (F16C/AVX-512 conversions),
 * run through the float row kernels, and rounded back (nearest even) on the
 * way out. Blocks are a multiple of 16 rows where more than 16 fit; rows
 * never depend on their block, so neither do results. */
#if AVX512_F32
#include "norm/avx512/avx512.h"
#endif
#include "isa/simd.h"
#include "norm/norm.h"

/* x, dy, dx of a backward in half storage elem (FASTLN_F16 or FASTLN_BF16);
 * declared for double too, whose backward passes NULL */
typedef struct {
    int elem, stream;
    uint16_t *dx;
    const uint16_t *dy, *x;
} SFX(half_bwd_args);

#if IS_F32
/* floats of per-thread scratch: two float blocks and a half-storage staging block */
static int64_t SFX(half_scratch)(int64_t H)
{
    int64_t e = SFX(cache_block)(H) * H;
    return 2 * e + (e + 1) / 2;
}

/* dst = src (n values) rounded to elem; with stream through stage and
 * non-temporal stores (the caller fences). */
static void SFX(half_put)(int elem, uint16_t *dst, const float *src, int64_t n, uint16_t *stage,
                        int stream)
{
    if (!stream) {
        narrow_half(elem, dst, src, n);
        return;
    }
    narrow_half(elem, stage, src, n);
    stream_copy(dst, stage, (size_t)n * sizeof(uint16_t));
}

/* Backward rows [r0, r1) in half storage (prefetching up to row re, as
 * bwd_range): converted in registers on AVX-512 (norm/avx512/avx512.h); elsewhere, and
 * rows of one element everywhere (bwd_range's bwd_rows1), bwd_range on
 * widened blocks. */
static void SFX(half_bwd_rows)(const SFX(half_bwd_args) *a, float *pw, float *pb, const float *mean,
                             const float *rstd, const float *w, int64_t r0, int64_t r1,
                             int64_t re, int64_t H, float *buf)
{
#if AVX512_F32
    if (H > BWD16_MAX_H) {
        fastln_avx512_long_bwd(a->elem, a->dx, pw, pb, a->dy, a->x, mean, rstd, w, r0, r1, H, buf,
                               a->stream);
        return;
    }
    if (H > 1) {
        fastln_avx512_bwd_rows16(a->elem, a->dx, pw, pb, a->dy, a->x, mean, rstd, w, r0, r1, re, H,
                                 a->stream);
        return;
    }
#endif
    (void)re;
    const int64_t m = SFX(cache_block)(H);
    float *xb = buf, *gb = buf + m * H;
    uint16_t *stage = (uint16_t *)(gb + m * H);
    for (int64_t r = r0; r < r1; r += m) {
        int64_t n = r1 - r < m ? r1 - r : m, e = n * H;
        widen_half(a->elem, xb, a->x + r * H, e);
        widen_half(a->elem, gb, a->dy + r * H, e);
        SFX(bwd_range)(gb, pw, pb, gb, xb, mean ? mean + r : NULL, rstd + r, w, 0, n, n, H, NULL,
                       1);
        SFX(half_put)(a->elem, a->dx + r * H, gb, e, stage, a->stream);
    }
    if (a->stream) stream_fence();
}

/* Forward in half storage: op FASTLN_OP_LN (y = LN(x)), FASTLN_OP_RMS, or
 * FASTLN_OP_ADD (s = x + res and y = LN(s) in float, both stored rounded, as
 * the float32 kernels do). */
typedef struct {
    fastln_norm_op op;
    int elem, stream;
    uint16_t *y, *s;
    float *mean, *rstd;
    const uint16_t *x, *res;
    const float *w, *b;
    int64_t H;
    double eps;
} SFX(half_fwd_args);

static void SFX(half_fwd_rows)(const SFX(half_fwd_args) *a, int64_t r0, int64_t r1, float *buf)
{
    const int64_t H = a->H;
#if AVX512_F32   /* converted in registers, sixteen rows at a time or long rows */
    const uint16_t *res = a->op == FASTLN_OP_ADD ? a->res : NULL;
    if (H <= FWD16_MAX_H)   /* buf: at least 17H floats */
        fastln_avx512_fwd_rows16_half(a->op == FASTLN_OP_RMS, a->elem, a->y, a->s, a->mean,
                                      a->rstd, a->x, res, a->w, a->b, r0, r1, H, a->eps,
                                      a->stream, buf);
    else
        fastln_avx512_long_fwd(a->elem, a->op == FASTLN_OP_RMS, a->y, a->s, a->mean, a->rstd,
                               a->x, res, a->w, a->b, r0, r1, H, a->eps, buf, a->stream);
#else
    const int64_t m = SFX(cache_block)(H);
    float *xb = buf, *rb = buf + m * H;
    uint16_t *stage = (uint16_t *)(rb + m * H);
    for (int64_t r = r0; r < r1; r += m) {
        int64_t n = r1 - r < m ? r1 - r : m, e = n * H;
        float *mean = a->mean ? a->mean + r : NULL, *rstd = a->rstd ? a->rstd + r : NULL;
        widen_half(a->elem, xb, a->x + r * H, e);
        if (a->op == FASTLN_OP_ADD) {   /* s over x, y over res */
            widen_half(a->elem, rb, a->res + r * H, e);
            SFX(add_ln_range)(rb, xb, mean, rstd, xb, rb, a->w, a->b, 0, n, H, a->eps, NULL);
            SFX(half_put)(a->elem, a->s + r * H, xb, e, stage, a->stream);
            SFX(half_put)(a->elem, a->y + r * H, rb, e, stage, a->stream);
            continue;
        }
        if (a->op == FASTLN_OP_RMS) SFX(rms_range)(xb, rstd, xb, a->w, 0, n, H, a->eps, NULL);
        else SFX(ln_range)(xb, mean, rstd, xb, a->w, a->b, 0, n, H, a->eps, NULL);
        SFX(half_put)(a->elem, a->y + r * H, xb, e, stage, a->stream);
    }
    if (a->stream) stream_fence();
#endif
}

/* dst (n) = src (n) converted between float and half storage elem: with
 * widen, uint16_t to float, else float to uint16_t (nearest even), in nt
 * contiguous parts (64-value bounds) on nt threads. */
static int SFX(half_convert)(int elem, int widen, void *dst, const void *src, int64_t n,
                             int nt)
{
    (void)nt;   /* without OpenMP */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
        int64_t i0 = (n * t / p) & ~(int64_t)63;
        int64_t i1 = t + 1 == p ? n : (n * (t + 1) / p) & ~(int64_t)63;
        if (widen) widen_half(elem, (float *)dst + i0, (const uint16_t *)src + i0, i1 - i0);
        else narrow_half(elem, (uint16_t *)dst + i0, (const float *)src + i0, i1 - i0);
    }
    return FASTLN_OK;
}
#endif   /* IS_F32 */
