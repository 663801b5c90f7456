/*
 * The row ranges of the fused residual ops, written once per (element type,
 * ISA) (isa/type_begin.h): the general add + norm (a residual that repeats every
 * R rows, an input bias, LayerNorm or RMSNorm) and the backward that adds an
 * incoming gradient of the sum.
 *
 * Each form leaves y bitwise the norm of s, as layer_norm(s) or rms_norm(s)
 * would give it, and reads x and the residual and writes s and y once:
 * rows go in blocks of cache_block(H) rows, which stay in L1/L2, whose sums
 * the path's own row kernels then normalize (rows.h and, on AVX-512,
 * norm/avx512/); or one at a time (add_ln_row, add_rms_row), summed and then
 * normalized from L1; or, for add + RMSNorm of long float rows on AVX-512,
 * through the long-row kernel itself. Shape legend: x, y, s, dy, ds, dsum (N, H); residual
 * (R, H) with N a multiple of R, row n adding residual row n % R; input_bias,
 * weight, bias (H); mean, rstd (N).
 */
#if AVX512_F32
#include "norm/avx512/avx512.h"
#endif

/* Rows per block: about 8192 elements, a multiple of 16 rows (the AVX-512
 * kernels' groups) where more than 16 fit. */
static int64_t SFX(cache_block)(int64_t H)
{
    int64_t m = 8192 / H;
    return m >= 16 ? m / 16 * 16 : m > 0 ? m : 1;
}

/* A fused add + norm: fastln_add_args with the kernel's types */
typedef struct {
    int rms, elem, stream;   /* elem 0: rows of T; FASTLN_F16, FASTLN_BF16: half storage */
    void *y, *s;
    T *mean, *rstd;
    const void *x, *res;
    const T *bi, *w, *b;
    int64_t N, R, H;
    double eps;
} SFX(add_args);

/* Elements of per-thread scratch that add_norm_rows needs */
static int64_t SFX(add_scratch)(int64_t H)
{
    int64_t e = SFX(cache_block)(H) * H;
    return 2 * e + 2 * H + (e + 1) / 2;
}


/* Rows [r0, r1) of a fused add + norm; buf: add_scratch(H) elements. On
 * AVX-512, add + RMSNorm of long rows without a broadcast or an input bias
 * goes through the long-row kernel, whose sweeps sum the next row while
 * they write this one; other float rows go in blocks, summed first and
 * then normalized by the sixteen-row and long-row kernels. Elsewhere rows
 * of T go one at a time (add_norm_each) and half storage in blocks. */
static void SFX(add_norm_rows)(const SFX(add_args) *a, int64_t r0, int64_t r1, T *buf)
{
    const int64_t H = a->H, m = SFX(cache_block)(H);
    const int half = a->elem != 0;
#if AVX512_F32
    if (a->rms && H > FWD16_MAX_H && !a->bi && a->R == a->N) {
        fastln_avx512_long_fwd(a->elem, 1, a->y, a->s, NULL, a->rstd, a->x, a->res, a->w, NULL,
                               r0, r1, H, a->eps, buf, a->stream);
        if (a->stream) stream_fence();
        return;
    }
#else
    if (!half) {
        SFX(add_norm_each)(a->rms, (T *)a->y, (T *)a->s, a->mean, a->rstd, (const T *)a->x,
                           (const T *)a->res, a->R, a->bi, a->w, a->b, r0, r1, H, a->eps,
                           a->stream ? buf : NULL);
        return;
    }
#endif
    T *const sb = buf, *const yb = buf + m * H, *const rb = yb + m * H, *const stage = rb + H;
    for (int64_t r = r0; r < r1; r += m) {
        const int64_t n = r1 - r < m ? r1 - r : m, e = n * H;
        /* the block's sums: in s itself when it goes out as it is, else in sb */
        T *sum = half || a->stream ? sb : (T *)a->s + r * H;
        for (int64_t k = 0; k < n; k++) {
            const int64_t q = (r + k) % a->R;
            T *d = sum + k * H;
#if IS_F32
            if (half) {
                widen_half(a->elem, d, (const uint16_t *)a->x + (r + k) * H, H);
                widen_half(a->elem, rb, (const uint16_t *)a->res + q * H, H);
                SFX(add_row)(d, d, rb, a->bi, H);
                continue;
            }
#endif
            SFX(add_row)(d, (const T *)a->x + (r + k) * H, (const T *)a->res + q * H, a->bi, H);
        }
        T *mean = a->mean ? a->mean + r : NULL, *rstd = a->rstd ? a->rstd + r : NULL;
        T *y = half ? yb : (T *)a->y + r * H, *st = a->stream && !half ? stage : NULL;
        if (a->rms) SFX(rms_range)(y, rstd, sum, a->w, 0, n, H, a->eps, st);
        else SFX(ln_range)(y, mean, rstd, sum, a->w, a->b, 0, n, H, a->eps, st);
#if IS_F32
        if (half) {   /* both outputs rounded, through stage when streamed */
            uint16_t *hs = (uint16_t *)stage, *ys = (uint16_t *)a->y + r * H,
                     *ss = (uint16_t *)a->s + r * H;
            narrow_half(a->elem, a->stream ? hs : ys, yb, e);
            if (a->stream) stream_copy(ys, hs, (size_t)e * 2);
            narrow_half(a->elem, a->stream ? hs : ss, sb, e);
            if (a->stream) stream_copy(ss, hs, (size_t)e * 2);
            continue;
        }
#endif
        if (a->stream) stream_copy((T *)a->s + r * H, sb, (size_t)e * sizeof(T));
    }
    if (a->stream) stream_fence();
}

/* Backward rows [r0, r1) of a fused add: the norm's dx (bwd_range, with
 * pw, pb as there) of a block of rows goes into buf (cache_block(H) * H
 * elements), gets ds added (ds may be NULL), is added into pi (the column
 * sums of dsum, when pi) and is stored as dsum, streamed with stream. dsum
 * may be dy, x or ds. */
static void SFX(bwd_add_rows)(T *dsum, T *pw, T *pb, T *pi, const T *dy, const T *x,
                              const T *ds, const T *mean, const T *rstd, const T *w,
                              int64_t r0, int64_t r1, int64_t H, T *buf, int stream, int hot)
{
    const int64_t m = SFX(cache_block)(H);
    for (int64_t r = r0; r < r1; r += m) {
        const int64_t n = r1 - r < m ? r1 - r : m;
        SFX(bwd_range)(buf, pw, pb, dy + r * H, x + r * H, mean ? mean + r : NULL, rstd + r, w,
                       0, n, n, H, NULL, hot);
        for (int64_t k = 0; k < n; k++) {
            T *d = buf + k * H;
            if (ds) {
                const T *g = ds + (r + k) * H;
#pragma omp simd
                for (int64_t i = 0; i < H; i++) d[i] += g[i];
            }
            if (pi) {
#pragma omp simd
                for (int64_t i = 0; i < H; i++) pi[i] += d[i];
            }
        }
        if (stream) stream_copy(dsum + r * H, buf, (size_t)(n * H) * sizeof(T));
        else memcpy(dsum + r * H, buf, (size_t)(n * H) * sizeof(T));
    }
    if (stream) stream_fence();
}
