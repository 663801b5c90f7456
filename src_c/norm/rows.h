/*
 * The portable row kernels, written once per (element type, ISA)
 * (isa/type_begin.h): forward and backward over a range of rows, a row swept
 * while it is hot in L1/L2:
 *   forward:  sum(x - x0)  |  sum((x - x0 - dm)^2)  |  write y
 *             (rows of up to ROWS4_H elements four at a time, phase by phase)
 *   backward: sum(d), sum(g), sum(g*d)  |  write dx, add dweight/dbias partials
 *             (sweep 2 over groups of GROUP rows)
 * Shape legend: x, y, dy, dx, residual, s (N, H) row-major contiguous;
 * mean, rstd (N); weight, bias, dweight, dbias (H). weight/bias may be NULL.
 * The AVX-512 float path has its own forwards (norm/avx512/) and calls these
 * for the rows their fallbacks take.
 */
#if AVX512_F32
#include "norm/avx512/avx512.h"
#endif
#include "isa/simd.h"

/* ---- forward row ranges ------------------------------------------------ */

/* Streaming: with buf != NULL (the dispatcher asked for non-temporal stores
 * and the driver gave each thread H elements of scratch per output), a row is
 * computed into buf while it is in L1 and then streamed out. */

/* Rows of up to ROWS4_H elements go ROWS at a time, phase by phase (sums,
 * then variances, then y), so that the latency of one row's reductions
 * overlaps with the other rows'; longer rows go one at a time, as grouping
 * them gains nothing once a row's sweeps are long. */
#define ROWS 4
#define ROWS4_H 256

static void SFX(ln_rows)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                         int64_t r0, int64_t r1, int64_t H, double eps, T *buf)
{
    int stream = buf != NULL, G = H <= ROWS4_H ? ROWS : 1;
    for (int64_t n = r0; n < r1; n += G) {
        int R = r1 - n < G ? (int)(r1 - n) : G;
        const T *xr[ROWS];
        T sh[ROWS], dm[ROWS];
        double s1[ROWS], var[ROWS];
        for (int k = 0; k < R; k++) {
            xr[k] = x + (n + k) * H;   /* row n+k of x */
            sh[k] = xr[k][0];
            s1[k] = SFX(sum_shifted)(xr[k], H, sh[k]);
        }
        for (int k = 0; k < R; k++) {
            dm[k] = (T)(s1[k] / (double)H);
            var[k] = SFX(sumsq_centered)(xr[k], H, sh[k], dm[k]) / (double)H;
        }
        for (int k = 0; k < R; k++) {
            T *yr = stream ? buf : y + (n + k) * H;
            SFX(ln_finish_row)(yr, mean ? mean + n + k : NULL, rstd ? rstd + n + k : NULL,
                               xr[k], w, b, H, eps, sh[k], s1[k], dm[k], var[k]);
            if (stream) stream_copy(y + (n + k) * H, yr, (size_t)H * sizeof(T));
        }
    }
    if (stream) stream_fence();
}

/* dst = (x + res) + bi (bi may be NULL), one row */
static inline void SFX(add_row)(T *dst, const T *x, const T *res, const T *bi, int64_t H)
{
    if (bi) {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) dst[i] = (x[i] + res[i]) + bi[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) dst[i] = x[i] + res[i];
    }
}

/* RMSNorm of one row from ss = sum(x^2) (redone in double where float
 * squares over- or underflowed) */
static inline void SFX(rms_finish_row)(T *yr, T *rstd, const T *xr, const T *w, int64_t H,
                                       double eps, double ss)
{
    if (SFX(stats_suspect)(ss / (double)H, xr, H, 0)) {   /* float squares over/underflowed */
        ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < H; i++) ss += (double)xr[i] * (double)xr[i];
    }
    double rd = 1.0 / sqrt(ss / (double)H + eps);
    T r = (T)rd;
    if (rstd) *rstd = r;
    if (isinf(r) && !isinf(rd)) {
        /* float rstd overflows (rms below ~3e-39 with eps = 0): y in double */
        for (int64_t i = 0; i < H; i++)
            yr[i] = (T)((double)xr[i] * rd * (w ? (double)w[i] : 1.0));
    } else if (w) {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) yr[i] = xr[i] * r * w[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) yr[i] = xr[i] * r;
    }
}

static void SFX(rms_rows)(T *y, T *rstd, const T *x, const T *w,
                          int64_t r0, int64_t r1, int64_t H, double eps, T *buf)
{
    int stream = buf != NULL;
    for (int64_t n = r0; n < r1; n++) {
        const T *xr = x + n * H;
        T *yr = stream ? buf : y + n * H;
        SFX(rms_finish_row)(yr, rstd ? rstd + n : NULL, xr, w, H, eps,
                            SFX(sumsq_centered)(xr, H, 0, 0));
        if (stream) stream_copy(y + n * H, yr, (size_t)H * sizeof(T));
    }
    if (stream) stream_fence();
}

#if !AVX512_F32   /* AVX-512 float: the fused kernels of norm/avx512/ */
/* add + LayerNorm of one row: sr = (x + res) (+ bi), yr = its LayerNorm,
 * bitwise ln_rows' on sr (the sum is formed first, then its statistics are
 * taken from L1 as a row's). mean, rstd: the row's, or NULL. */
static void SFX(add_ln_row)(T *yr, T *sr, T *mean, T *rstd, const T *xr, const T *rr,
                            const T *bi, const T *w, const T *b, int64_t H, double eps)
{
    SFX(add_row)(sr, xr, rr, bi, H);
    T shift = sr[0];
    double total = SFX(sum_shifted)(sr, H, shift);
    T dm = (T)(total / (double)H);
    SFX(ln_finish_row)(yr, mean, rstd, sr, w, b, H, eps, shift, total, dm,
                       SFX(sumsq_centered)(sr, H, shift, dm) / (double)H);
}

/* add + RMSNorm of one row: sr = (x + res) (+ bi), yr = its RMSNorm, bitwise
 * rms_rows' on sr */
static void SFX(add_rms_row)(T *yr, T *sr, T *rstd, const T *xr, const T *rr, const T *bi,
                             const T *w, int64_t H, double eps)
{
    SFX(add_row)(sr, xr, rr, bi, H);
    SFX(rms_finish_row)(yr, rstd, sr, w, H, eps, SFX(sumsq_centered)(sr, H, 0, 0));
}

/* add + LayerNorm, or with rms add + RMSNorm (mean, b unused), of rows
 * [r0, r1) one at a time: row n adds residual row n % R (R = r1: each row its
 * own) and bi (may be NULL). buf != NULL: streaming stores through buf (2H
 * elements). */
static void SFX(add_norm_each)(int rms, T *y, T *s, T *mean, T *rstd, const T *x, const T *res,
                               int64_t R, const T *bi, const T *w, const T *b, int64_t r0,
                               int64_t r1, int64_t H, double eps, T *buf)
{
    int stream = buf != NULL;
    for (int64_t n = r0; n < r1; n++) {
        const T *xr = x + n * H, *rr = res + n % R * H;
        T *sr = stream ? buf : s + n * H, *yr = stream ? buf + H : y + n * H;
        T *rs = rstd ? rstd + n : NULL;
        if (rms) SFX(add_rms_row)(yr, sr, rs, xr, rr, bi, w, H, eps);
        else SFX(add_ln_row)(yr, sr, mean ? mean + n : NULL, rs, xr, rr, bi, w, b, H, eps);
        if (stream) {
            stream_copy(s + n * H, sr, (size_t)H * sizeof(T));
            stream_copy(y + n * H, yr, (size_t)H * sizeof(T));
        }
    }
    if (stream) stream_fence();
}
#endif

#if AVX512_F32
/* The one-row code the AVX-512 forwards fall back to (norm/avx512/avx512.h) */
void fastln_avx512_ln_row(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int64_t H, double eps)
{
    SFX(ln_rows)(y, mean, rstd, x, w, b, 0, 1, H, eps, NULL);
}

void fastln_avx512_rms_row(float *y, float *rstd, const float *x, const float *w, int64_t H,
                           double eps)
{
    SFX(rms_rows)(y, rstd, x, w, 0, 1, H, eps, NULL);
}
#endif

/* ---- backward row ranges ----------------------------------------------- */

#define GROUP 4   /* rows per backward sweep 2 */

/* Sweep 2 over R rows at once: dx for each row, and one update of the
 * dweight/dbias partials for all R (R-fold less partial traffic). All loads
 * of a column come before its stores: dx may be x or dy, and arrays at equal
 * offsets modulo 4096 (as NumPy's large allocations are) would otherwise make
 * loads wait on unrelated stores (4K aliasing). R and has_b are constants
 * after inlining. */
static inline __attribute__((always_inline)) void SFX(bwd_sweep2)(
    int R, int has_b, T *const *dxr, const T *const *xr, const T *const *gr,
    const SFX(bwd_scalars) *sc, const T *w, T *pw, T *pb, int64_t H)
{
#pragma omp simd
    for (int64_t i = 0; i < H; i++) {
        T xv[GROUP], gv[GROUP], wi = w ? w[i] : (T)1;
        T sw = pw[i], sb = has_b ? pb[i] : 0;
        for (int k = 0; k < R; k++) {
            xv[k] = xr[k][i];
            gv[k] = gr[k][i];
        }
        T dxv[GROUP];
        for (int k = 0; k < R; k++) {
            T xh = ((xv[k] - sc[k].m) - sc[k].dm) * sc[k].r;
            sw = FMA(gv[k], xh, sw);
            sb += gv[k];
            dxv[k] = sc[k].r * FMA(-xh, sc[k].c2, gv[k] * wi - sc[k].c1);
        }
        pw[i] = sw;
        if (has_b) pb[i] = sb;
        for (int k = 0; k < R; k++) dxr[k][i] = dxv[k];
    }
}

/* Streamed rows of 129 to ROWS4_H elements in bwd_rows prefetch x and dy
 * this many rows on as they start a row's sums: those rows come from memory,
 * and the hardware prefetchers fall behind them (shorter and longer rows
 * run slower with it) */
#define BWD_PF_ROWS 4

/* Backward over rows [r0, r1): LayerNorm when pb != NULL (adds dy*xhat to pw,
 * dy to pb), RMSNorm when pb == NULL. Rows go in groups of GROUP from r0, the
 * rest one by one: the order of the partial sums depends on r0, r1 only. */
static void SFX(bwd_rows)(T *dx, T *pw, T *pb, const T *dy, const T *x, const T *mean,
                          const T *rstd, const T *w, int64_t r0, int64_t r1, int64_t H,
                          T *buf)
{
    /* With buf (GROUP*H elements), dx rows are computed there and streamed
     * out after the group with non-temporal stores, in one copy: fewer
     * partial lines than a copy a row. */
    int stream = buf != NULL, pf = stream && H > 128 && H <= ROWS4_H;
    for (int64_t n = r0; n < r1;) {
        int R = r1 - n >= GROUP ? GROUP : 1;
        T *dxr[GROUP];
        const T *xr[GROUP], *gr[GROUP];
        SFX(bwd_scalars) sc[GROUP];
        for (int k = 0; k < R; k++) {
            xr[k] = x + (n + k) * H;
            gr[k] = dy + (n + k) * H;
            dxr[k] = stream ? buf + k * H : dx + (n + k) * H;
            if (pf && n + k + BWD_PF_ROWS < r1)
                for (int64_t o = 0; o < H; o += 64 / (int64_t)sizeof(T)) {
                    __builtin_prefetch(xr[k] + BWD_PF_ROWS * H + o);
                    __builtin_prefetch(gr[k] + BWD_PF_ROWS * H + o);
                }
            sc[k] = pb ? SFX(ln_bwd_scalars)(xr[k], gr[k], w, mean[n + k], rstd[n + k], H)
                       : SFX(rms_bwd_scalars)(xr[k], gr[k], w, rstd[n + k], H);
        }
        if (R == GROUP && pb)
            SFX(bwd_sweep2)(GROUP, 1, dxr, xr, gr, sc, w, pw, pb, H);
        else if (R == GROUP)
            SFX(bwd_sweep2)(GROUP, 0, dxr, xr, gr, sc, w, pw, pb, H);
        else if (pb)
            SFX(bwd_sweep2)(1, 1, dxr, xr, gr, sc, w, pw, pb, H);
        else
            SFX(bwd_sweep2)(1, 0, dxr, xr, gr, sc, w, pw, pb, H);
        if (stream)   /* the group's rows, contiguous in buf, in one copy */
            stream_copy(dx + n * H, buf, (size_t)(R * H) * sizeof(T));
        n += R;
    }
    if (stream) stream_fence();
}


/* Backward over rows of one element, [r0, r1) (pb == NULL: RMSNorm): the
 * scalars of a row (its sums begun at +0, as ln_bwd_scalars/rms_bwd_scalars
 * begin them), and dx = r * ((g - xhat * c2) - c1) with g = dy * w rounded
 * by itself, as its sum is. A LayerNorm row of one element has xhat = 0 and
 * c1 = g, so its dx is exactly 0 (y = bias whatever x is). bwd_sweep2 and the
 * AVX-512 kernels form g * w - c1 in one rounding on FMA targets (contracted,
 * or FMSUB), which would leave g's rounding error times r; on rows of more
 * elements that form is as accurate, and stays. */
static void SFX(bwd_rows1)(T *dx, T *pw, T *pb, const T *dy, const T *x, const T *mean,
                           const T *rstd, const T *w, int64_t r0, int64_t r1)
{
    const T wi = w ? w[0] : (T)1;
    T sw = pw[0], sb = pb ? pb[0] : (T)0;
    for (int64_t n = r0; n < r1; n++) {
        const T m = pb ? mean[n] : (T)0, d = x[n] - m, g = dy[n] * wi;
        SFX(bwd_scalars) sc =
            pb ? SFX(ln_bwd_finish)(x + n, dy + n, w, m, rstd[n], 1, 0.0 + d, 0.0 + g, 0.0 + g * d)
               : SFX(rms_bwd_finish)(x + n, dy + n, w, rstd[n], 1, 0.0 + g * x[n]);
        const T xh = (d - sc.dm) * sc.r;
        sw = FMA(dy[n], xh, sw);
        sb += dy[n];
        dx[n] = sc.r * (FMA(-xh, sc.c2, g) - sc.c1);   /* g, an addend: never contracted */
    }
    pw[0] = sw;
    if (pb) pb[0] = sb;
}
