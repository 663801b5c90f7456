/*
 * Kernel bodies, written once and compiled once per (element type, ISA).
 * Included by kernels_isa.h with:
 *   T        float or double: the storage and vector-math type
 *   SFX(f)   name mangling, e.g. f##_f32_avx512
 *   FMA(a,b,c)  a*b + c, fused where the ISA has FMA
 *   HSUM(acc)   the horizontal sum of NACC accumulators, where the ISA has
 *               one (else HSUM_BY_COMPILER is defined)
 *   stream_copy(dst, src, nbytes), stream_fence()
 *               copies with non-temporal stores (kernels_isa.h)
 *
 * Shape legend: x, y, dy, dx, residual, s (N, H) row-major contiguous;
 * mean, rstd (N); weight, bias, dweight, dbias (H). weight/bias may be NULL.
 * Rows are independent; a row is swept while it is hot in L1/L2:
 *   forward:  sum(x - x0)  |  sum((x - x0 - dm)^2)  |  write y
 *             (rows of up to SHORT_H elements four at a time, phase by phase;
 *             AVX-512 float: short rows in short_rows.h, and long ones in one
 *             sweep there, y and the next row's sums of x - t and (x - t)^2)
 *   backward: sum(d), sum(g), sum(g*d)  |  write dx, add dweight/dbias partials
 *             (sweep 2 over groups of GROUP rows; AVX-512 float, data past the
 *             cache: one sweep a row in short_rows.h, with the next row's sums)
 * Threads take contiguous row ranges (forward) or row blocks (backward); the
 * dispatcher (dispatch.c) chooses their number and whether to stream.
 * x0 = x[0] is a shift: x - x0 is exact for values close to each other, so a
 * huge mean next to a small spread loses no precision (Sterbenz lemma).
 */

/* Sums are taken in NACC independent lanes (four vector registers of
 * VEC_BYTES), per chunk of CHUNK elements; chunk sums are added in double. */
#define NACC ((int)(4 * VEC_BYTES / sizeof(T)))
#define CHUNK 1024

/* AVX-512 in float: the sixteen-row and long-row kernels of short_rows.h */
#if IS_F32 && defined(FASTLN_X86) && VEC_BYTES == 64
#define HAVE_SHORT16 1
#else
#define HAVE_SHORT16 0
#endif

/* ---- one-row helpers --------------------------------------------------- */

/* Zeroes NACC accumulators. On AVX2 (128 bytes) GCC turns the plain loop,
 * in float, into a memset that it expands as rep stos, whose start-up cost
 * is near that of a short row's sums: four vector stores instead (2 threads,
 * rows of 1 MiB: H = 16 forward 262-273 -> 107-114 us, generic C 121;
 * backward 384 -> 134 us; H = 128 forward 49 -> 32 us). */
static inline void SFX(acc_zero)(T *acc)
{
#if defined(FASTLN_X86) && VEC_BYTES == 32
    __m256i z = _mm256_setzero_si256(), *a = (__m256i *)acc;
    _mm256_storeu_si256(a, z);
    _mm256_storeu_si256(a + 1, z);
    _mm256_storeu_si256(a + 2, z);
    _mm256_storeu_si256(a + 3, z);
#else
    for (int k = 0; k < NACC; k++) acc[k] = 0;
#endif
}

/* acc[0] + ... + acc[NACC-1] as a vector reduction, not a serial chain */
static inline T SFX(hsum)(const T *acc)
{
#ifdef HSUM_BY_COMPILER
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int k = 0; k < NACC; k++) s += acc[k];
    return s;
#else
    return HSUM(acc);
#endif
}

/* sum over the row of (x[i] - shift) */
static inline double SFX(sum_shifted)(const T *x, int64_t H, T shift)
{
    double total = 0;
    for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
        int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK, i = 0;
        const T *xc = x + c0;
        T acc[NACC];
        SFX(acc_zero)(acc);
        for (; i + NACC <= n; i += NACC)
            for (int k = 0; k < NACC; k++) acc[k] += xc[i + k] - shift;
        for (int k = 0; k < n - i; k++) acc[k] += xc[i + k] - shift;
        total += SFX(hsum)(acc);
    }
    return total;
}

/* sum over the row of ((x[i] - shift) - dm)^2 */
static inline double SFX(sumsq_centered)(const T *x, int64_t H, T shift, T dm)
{
    double total = 0;
    for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
        int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK, i = 0;
        const T *xc = x + c0;
        T acc[NACC];
        SFX(acc_zero)(acc);
        for (; i + NACC <= n; i += NACC)
            for (int k = 0; k < NACC; k++) {
                T d = (xc[i + k] - shift) - dm;
                acc[k] = FMA(d, d, acc[k]);
            }
        for (int k = 0; k < n - i; k++) {
            T d = (xc[i + k] - shift) - dm;
            acc[k] = FMA(d, d, acc[k]);
        }
        total += SFX(hsum)(acc);
    }
    return total;
}

/* y = ((x - shift) - dm) * r * weight + bias: the normalize sweep */
static inline void SFX(normalize_row)(T *y, const T *x, const T *w, const T *b,
                                      int64_t H, T shift, T dm, T r)
{
    if (w && b) {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) y[i] = FMA(((x[i] - shift) - dm) * r, w[i], b[i]);
    } else if (w) {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) y[i] = ((x[i] - shift) - dm) * r * w[i];
    } else if (b) {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) y[i] = ((x[i] - shift) - dm) * r + b[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < H; i++) y[i] = ((x[i] - shift) - dm) * r;
    }
}

/* The whole LayerNorm row in double, straight from x: for float rows whose
 * float statistics overflow or underflow (|x| beyond about 1e19 or below
 * about 1e-19), where the fast path would lose them. */
static void SFX(ln_row_double)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                               int64_t H, double eps)
{
    double s = 0, ss = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < H; i++) s += (double)x[i];
    double m = s / (double)H;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < H; i++) ss += ((double)x[i] - m) * ((double)x[i] - m);
    double r = 1.0 / sqrt(ss / (double)H + eps);
    if (mean) *mean = (T)m;
    if (rstd) *rstd = (T)r;
    for (int64_t i = 0; i < H; i++)
        y[i] = (T)(((double)x[i] - m) * r * (w ? (double)w[i] : 1.0) + (b ? (double)b[i] : 0.0));
}

/* 1 when some x[i] differs from c */
static inline int SFX(any_differs)(const T *x, int64_t H, T c)
{
    int d = 0;
#pragma omp simd reduction(| : d)
    for (int64_t i = 0; i < H; i++) d |= x[i] != c;
    return d;
}

/* Whether float statistics may have lost the row: a mean square m2 of the
 * values d_i = x_i - c that is not finite (overflow, or NaN/inf in x), tiny
 * enough for squares to underflow, or 0 although some d_i is not. */
static inline int SFX(stats_suspect)(double m2, const T *x, int64_t H, T c)
{
    if (sizeof(T) != 4 || (m2 >= 1e-30 && m2 <= 1e30)) return 0;
    return m2 != 0 || SFX(any_differs)(x, H, c);
}

/* Finishes one LayerNorm row from s1 = sum(x - shift), dm = s1/H and var,
 * the mean square of (x - shift) - dm: checks, stats, then the y sweep. */
static inline void SFX(ln_finish_row)(T *y, T *mean, T *rstd, const T *x,
                                      const T *w, const T *b, int64_t H, double eps,
                                      T shift, double s1, T dm, double var)
{
    if (SFX(stats_suspect)(var, x, H, shift) || !isfinite(s1)) {
        SFX(ln_row_double)(y, mean, rstd, x, w, b, H, eps);
        return;
    }
    T r = (T)(1.0 / sqrt(var + eps));
    if (mean) *mean = (T)((double)shift + (double)dm);
    if (rstd) *rstd = r;
    SFX(normalize_row)(y, x, w, b, H, shift, dm, r);
}

/* ---- forward row ranges ------------------------------------------------ */

/* Streaming: with buf != NULL (the dispatcher asked for non-temporal stores
 * and the driver gave each thread H elements of scratch per output), a row is
 * computed into buf while it is in L1 and then streamed out. */

/* Short rows go four at a time, phase by phase (sums, then variances, then
 * y), so that the latency of one row's reductions overlaps with the other
 * rows' (measured, H=64: 52 -> 38 ns a row); long rows go one at a time
 * (grouped, H=1024 measured slower: 350 -> 500 ns a row). */
#define ROWS 4
#define SHORT_H 256

static void SFX(ln_rows)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                         int64_t r0, int64_t r1, int64_t H, double eps, T *buf)
{
    int stream = buf != NULL, G = H <= SHORT_H ? ROWS : 1;
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

static void SFX(add_ln_rows)(T *y, T *s, T *mean, T *rstd, const T *x, const T *res,
                             const T *w, const T *b, int64_t r0, int64_t r1, int64_t H,
                             double eps, T *buf)
{
    int stream = buf != NULL;
    T *sbuf = buf, *ybuf = stream ? buf + H : NULL;
    for (int64_t n = r0; n < r1; n++) {
        const T *xr = x + n * H, *rr = res + n * H;
        T *sr = stream ? sbuf : s + n * H, *yr = stream ? ybuf : y + n * H;
        T shift = xr[0] + rr[0];
        /* sweep 1: s = x + residual, and sum(s - shift) on the fly */
        double total = 0;
        for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
            int64_t m = H - c0 < CHUNK ? H - c0 : CHUNK, i = c0;
            T acc[NACC];
            SFX(acc_zero)(acc);
            for (; i + NACC <= c0 + m; i += NACC)
                for (int k = 0; k < NACC; k++) {
                    T v = xr[i + k] + rr[i + k];
                    sr[i + k] = v;
                    acc[k] += v - shift;
                }
            for (int k = 0; k < c0 + m - i; k++) {
                T v = xr[i + k] + rr[i + k];
                sr[i + k] = v;
                acc[k] += v - shift;
            }
            total += SFX(hsum)(acc);
        }
        T dm = (T)(total / (double)H);
        SFX(ln_finish_row)(yr, mean ? mean + n : NULL, rstd ? rstd + n : NULL, sr, w, b, H,
                           eps, shift, total, dm,
                           SFX(sumsq_centered)(sr, H, shift, dm) / (double)H);
        if (stream) {
            stream_copy(s + n * H, sr, (size_t)H * sizeof(T));
            stream_copy(y + n * H, yr, (size_t)H * sizeof(T));
        }
    }
    if (stream) stream_fence();
}

static void SFX(rms_rows)(T *y, T *rstd, const T *x, const T *w,
                          int64_t r0, int64_t r1, int64_t H, double eps, T *buf)
{
    int stream = buf != NULL;
    for (int64_t n = r0; n < r1; n++) {
        const T *xr = x + n * H;
        T *yr = stream ? buf : y + n * H;
        double ss = SFX(sumsq_centered)(xr, H, 0, 0);
        if (SFX(stats_suspect)(ss / (double)H, xr, H, 0)) {   /* float squares over/underflowed */
            ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < H; i++) ss += (double)xr[i] * (double)xr[i];
        }
        double rd = 1.0 / sqrt(ss / (double)H + eps);
        T r = (T)rd;
        if (rstd) rstd[n] = r;
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
        if (stream) stream_copy(y + n * H, yr, (size_t)H * sizeof(T));
    }
    if (stream) stream_fence();
}

/* ---- backward row ranges ----------------------------------------------- */

#define GROUP 4   /* rows per backward sweep 2 */

/* The per-row scalars of a backward: xhat = ((x - m) - dm) * r and
 * dx = r * (g - c1 - xhat * c2), g = dy * weight. RMSNorm is m = dm = c1 = 0. */
typedef struct { T m, dm, r, c1, c2; } SFX(bwd_scalars);

/* The scalars from the sums of sweep 1; sums that are not finite are redone
 * in double from the row. */
static inline SFX(bwd_scalars) SFX(ln_bwd_finish)(const T *xr, const T *gr, const T *w, T m,
                                                  T r, int64_t H, double S_d, double S_g,
                                                  double S_gd)
{
    if (sizeof(T) == 4 && !(isfinite(S_d) && isfinite(S_g) && isfinite(S_gd))) {
        /* float lanes overflowed (|x - m| * |dy| near 1e38): the sums in double
         * (they stay non-finite where x or dy hold inf or NaN) */
        S_d = S_g = S_gd = 0;
        for (int64_t i = 0; i < H; i++) {
            double d = (double)xr[i] - (double)m, g = (double)gr[i] * (w ? (double)w[i] : 1.0);
            S_d += d;
            S_g += g;
            S_gd += g * d;
        }
    }
    double dm = S_d / (double)H;                     /* residual of the saved mean */
    SFX(bwd_scalars) sc = {m, (T)dm, r, (T)(S_g / (double)H),             /* c1 = mean(g) */
                           (T)((double)r * (S_gd - dm * S_g) / (double)H)};  /* c2 = mean(g*xhat) */
    return sc;
}

/* The scalars from the sum of sweep 1 (redone in double where not finite) */
static inline SFX(bwd_scalars) SFX(rms_bwd_finish)(const T *xr, const T *gr, const T *w, T r,
                                                   int64_t H, double S_gx)
{
    if (sizeof(T) == 4 && !isfinite(S_gx)) {   /* float lanes overflowed: in double */
        S_gx = 0;
        for (int64_t i = 0; i < H; i++)
            S_gx += (double)gr[i] * (w ? (double)w[i] : 1.0) * (double)xr[i];
    }
    SFX(bwd_scalars) sc = {0, 0, r, 0, (T)((double)r * S_gx / (double)H)};  /* c2 = mean(g*xhat) */
    return sc;
}

/* LayerNorm, sweep 1 over a row: S_d = sum(d), S_g = sum(g), S_gd = sum(g*d), d = x - m */
static inline SFX(bwd_scalars) SFX(ln_bwd_scalars)(const T *xr, const T *gr, const T *w,
                                                   T m, T r, int64_t H)
{
    double S_d = 0, S_g = 0, S_gd = 0;
    for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
        int64_t e = c0 + (H - c0 < CHUNK ? H - c0 : CHUNK), i = c0;
        T ad[NACC], ag[NACC], agd[NACC];
        SFX(acc_zero)(ad);
        SFX(acc_zero)(ag);
        SFX(acc_zero)(agd);
        for (; i + NACC <= e; i += NACC)
            for (int k = 0; k < NACC; k++) {
                T d = xr[i + k] - m, g = w ? gr[i + k] * w[i + k] : gr[i + k];
                ad[k] += d;
                ag[k] += g;
                agd[k] = FMA(g, d, agd[k]);
            }
        for (int k = 0; k < e - i; k++) {
            T d = xr[i + k] - m, g = w ? gr[i + k] * w[i + k] : gr[i + k];
            ad[k] += d;
            ag[k] += g;
            agd[k] = FMA(g, d, agd[k]);
        }
        S_d += SFX(hsum)(ad);
        S_g += SFX(hsum)(ag);
        S_gd += SFX(hsum)(agd);
    }
    return SFX(ln_bwd_finish)(xr, gr, w, m, r, H, S_d, S_g, S_gd);
}

/* RMSNorm, sweep 1 over a row: S_gx = sum(g*x) */
static inline SFX(bwd_scalars) SFX(rms_bwd_scalars)(const T *xr, const T *gr, const T *w,
                                                    T r, int64_t H)
{
    double S_gx = 0;
    for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
        int64_t e = c0 + (H - c0 < CHUNK ? H - c0 : CHUNK), i = c0;
        T a[NACC];
        SFX(acc_zero)(a);
        for (; i + NACC <= e; i += NACC)
            for (int k = 0; k < NACC; k++)
                a[k] = FMA(w ? gr[i + k] * w[i + k] : gr[i + k], xr[i + k], a[k]);
        for (int k = 0; k < e - i; k++)
            a[k] = FMA(w ? gr[i + k] * w[i + k] : gr[i + k], xr[i + k], a[k]);
        S_gx += SFX(hsum)(a);
    }
    return SFX(rms_bwd_finish)(xr, gr, w, r, H, S_gx);
}

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

/* Streamed rows of 129-256 in bwd_rows prefetch x and dy this many rows on
 * as they start a row's sums (2 threads, AVX-512 (LayerNorm's rows): (131072,
 * 160) 6.0 -> 5.1-5.3 ms, (65536, 256) 4.5-5.0 -> 4.3-4.4 ms, (16384, 256)
 * 1.06-1.08 -> 0.93-0.98 ms; AVX2: (131072, 160) 9.8 -> 9.1 ms, (65536, 256)
 * 7.0 -> 5.7 ms, but (65536, 64) 2% and (16384, 1024) 4% slower; 2, 3, 6 or
 * 8 rows on: about the same) */
#define BWD_PF_ROWS 4

/* Backward over rows [r0, r1): LayerNorm when pb != NULL (adds dy*xhat to pw,
 * dy to pb), RMSNorm when pb == NULL. Rows go in groups of GROUP from r0, the
 * rest one by one: the order of the partial sums depends on r0, r1 only. */
static void SFX(bwd_rows)(T *dx, T *pw, T *pb, const T *dy, const T *x, const T *mean,
                          const T *rstd, const T *w, int64_t r0, int64_t r1, int64_t H,
                          T *buf)
{
    /* With buf (GROUP*H elements), dx rows are computed there and streamed
     * out after the group with non-temporal stores, in one copy (2 threads,
     * against a copy a row: AVX-512 (131072, 160) 7.3 -> 6.3 ms, (65536,
     * 256) 5.2 -> 4.8 ms; float64 (65536, 128) 6.0 -> 5.2 ms). */
    int stream = buf != NULL, pf = stream && H > 128 && H <= SHORT_H;
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

#if HAVE_SHORT16
#include "short_rows.h"
#endif

/* Forward rows [r0, r1) (buf != NULL: streaming stores). On AVX-512 in
 * float: sixteen at a time up to rows of FWD16_H, longer rows with
 * long_rows. Elsewhere ln_rows. */
static void SFX(ln_range)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                          int64_t r0, int64_t r1, int64_t H, double eps, T *buf)
{
#if HAVE_SHORT16
    if (H <= FWD16_H)
        SFX(fwd_rows16)(0, y, NULL, mean, rstd, x, NULL, w, b, r0, r1, H, eps, buf != NULL);
    else
        SFX(long_rows)(KIND_F32, 0, y, NULL, mean, rstd, x, NULL, w, b, r0, r1, H, eps, NULL,
                       buf != NULL);
    return;
#endif
    SFX(ln_rows)(y, mean, rstd, x, w, b, r0, r1, H, eps, buf);
}

/* RMSNorm forward rows [r0, r1): on AVX-512 in float as ln_range; else
 * rms_rows. */
static void SFX(rms_range)(T *y, T *rstd, const T *x, const T *w, int64_t r0, int64_t r1,
                           int64_t H, double eps, T *buf)
{
#if HAVE_SHORT16
    if (H <= FWD16_H)
        SFX(fwd_rows16)(1, y, NULL, NULL, rstd, x, NULL, w, NULL, r0, r1, H, eps, buf != NULL);
    else
        SFX(long_rows)(KIND_F32, 1, y, NULL, NULL, rstd, x, NULL, w, NULL, r0, r1, H, eps, NULL,
                       buf != NULL);
    return;
#endif
    SFX(rms_rows)(y, rstd, x, w, r0, r1, H, eps, buf);
}

/* Backward rows [r0, r1) (buf != NULL: streaming stores; hot: the call's
 * data fits the cache; rows up to re >= r1 may be prefetched: the rows the
 * calling thread does next). On AVX-512 in float, rows of up to SHORT16_H go
 * sixteen at a time (bwd_rows16, which prefetches; against long_bwd, 2
 * threads: (16384, 64) 150 against 210 us, (16384, 112) 275 against 320
 * us, (8192, 128) 124 against 196 us, 1 thread (4096, 128) 110 against 166
 * us, (16384, 128) even; and its staged dx streams whole lines, where
 * long_bwd's rows of a few lines each start and end on a partial one:
 * streamed, measured at (16384, 128), 1.42 against 1.76 ms). Longer rows go
 * through long_bwd where the data comes from memory, and hot ones through
 * bwd_rows (its groups of rows update the partials less often, which wins
 * when no load waits on memory), and so do LayerNorm's streamed rows of up to
 * SHORT_H (2 threads: (131072, 160) 8.1 -> 6.1 ms, (65536, 256) 5.4 -> 4.5
 * ms, (16384, 200) 0.88 -> 0.65 ms; 1 thread 1.3-1.6x; not streamed, (4096,
 * 200), 6% slower; RMSNorm's (65536, 256) 16% slower). Elsewhere bwd_rows. */
static void SFX(bwd_range)(T *dx, T *pw, T *pb, const T *dy, const T *x, const T *mean,
                           const T *rstd, const T *w, int64_t r0, int64_t r1, int64_t re,
                           int64_t H, T *buf, int hot)
{
#if HAVE_SHORT16
    if (H <= SHORT16_H) {
        SFX(bwd_rows16)(KIND_F32, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, re, H, buf != NULL);
        return;
    }
    if (!hot && (H > SHORT_H || !buf || !pb)) {
        SFX(long_bwd)(KIND_F32, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, H, NULL, buf != NULL);
        return;
    }
#endif
    (void)hot;
    (void)re;
    SFX(bwd_rows)(dx, pw, pb, dy, x, mean, rstd, w, r0, r1, H, buf);
}

/* ---- drivers: split rows over threads ---------------------------------- */

/* Per-thread staging rows of n elements for streaming stores, or NULL (no
 * streaming; also when the allocation fails, which only costs speed). */
static T *SFX(stream_scratch)(int stream, int nt, int64_t n)
{
    return stream ? (T *)malloc((size_t)(nt * n) * sizeof(T)) : NULL;
}

static int SFX(layer_norm)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                           int64_t N, int64_t H, double eps, int nt, int stream)
{
    T *scratch = SFX(stream_scratch)(stream, nt, H);
    if (nt <= 1) {          /* no OpenMP region at all: even an if(0) one costs a microsecond */
        SFX(ln_range)(y, mean, rstd, x, w, b, 0, N, H, eps, scratch);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(ln_range)(y, mean, rstd, x, w, b, N * t / p, N * (t + 1) / p, H, eps,
                          scratch ? scratch + t * H : NULL);
        }
    }
    free(scratch);
    return FASTLN_OK;
}

/* add + LayerNorm rows [r0, r1): on AVX-512 in float, rows of up to
 * FWD16_H sixteen at a time (fwd_rows16; (262144, 64) 8.7 -> 5.3 ms on 2
 * threads, (262144, 16) 4.5 -> 1.2 ms; rows of 129-256 against long_rows:
 * (65536, 256) 6.7-7.1 -> 4.3-6.4 ms, (16384, 256) 1.56-1.66 -> 0.80-1.26
 * ms, (4096, 160) 117-130 -> 87-114 us, 1 thread (65536, 256) 19.7 -> 11.9
 * ms, but (16384, 200) 526-724 -> 575-907 us), longer ones with long_rows;
 * else add_ln_rows. */
static void SFX(add_ln_range)(T *y, T *s, T *mean, T *rstd, const T *x, const T *res,
                              const T *w, const T *b, int64_t r0, int64_t r1, int64_t H,
                              double eps, T *buf)
{
#if HAVE_SHORT16
    if (H <= FWD16_H)
        SFX(fwd_rows16)(0, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf != NULL);
    else
        SFX(long_rows)(KIND_F32, 0, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, NULL,
                       buf != NULL);
    return;
#endif
    SFX(add_ln_rows)(y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf);
}

static int SFX(add_layer_norm)(T *y, T *s, T *mean, T *rstd, const T *x, const T *res,
                               const T *w, const T *b, int64_t N, int64_t H, double eps,
                               int nt, int stream)
{
    T *scratch = SFX(stream_scratch)(stream, nt, 2 * H);
    if (nt <= 1) {
        SFX(add_ln_range)(y, s, mean, rstd, x, res, w, b, 0, N, H, eps, scratch);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(add_ln_range)(y, s, mean, rstd, x, res, w, b, N * t / p, N * (t + 1) / p, H,
                              eps, scratch ? scratch + t * 2 * H : NULL);
        }
    }
    free(scratch);
    return FASTLN_OK;
}

static int SFX(rms_norm)(T *y, T *rstd, const T *x, const T *w,
                         int64_t N, int64_t H, double eps, int nt, int stream)
{
    T *scratch = SFX(stream_scratch)(stream, nt, H);
    if (nt <= 1) {
        SFX(rms_range)(y, rstd, x, w, 0, N, H, eps, scratch);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(rms_range)(y, rstd, x, w, N * t / p, N * (t + 1) / p, H, eps,
                          scratch ? scratch + t * H : NULL);
        }
    }
    free(scratch);
    return FASTLN_OK;
}

/* Elements between partial vectors: H rounded up to a cache line, plus 1 KiB
 * where that is a multiple of 4 KiB, so that dweight and dbias partials never
 * sit at equal offsets modulo 4096 (4K aliasing). */
static int64_t SFX(part_stride)(int64_t H)
{
    int64_t line = 64 / (int64_t)sizeof(T), ps = (H + line - 1) / line * line;
    return ps * (int64_t)sizeof(T) % 4096 == 0 ? ps + 1024 / (int64_t)sizeof(T) : ps;
}

/* ---- float16 and bfloat16 storage (compiled for float only) ------------
 * Half the bytes of float32 in and out, the same float math. On AVX-512 the
 * forwards, and the backward past SHORT16_H elements, convert in registers
 * (short_rows.h). Everything else goes in blocks of about 8192 elements,
 * widened into float scratch that stays in L1/L2 (F16C/AVX-512 conversions),
 * run through the float row kernels, and rounded back (nearest even) on the
 * way out. Blocks are a multiple of 16 rows where more than 16 fit; rows
 * never depend on their block, so neither do results. */

/* x, dy, dx of a backward in 16-bit storage (kind FASTLN_F16 or FASTLN_BF16) */
typedef struct {
    int kind, stream;
    uint16_t *dx;
    const uint16_t *dy, *x;
} SFX(lp_bwd);

#if IS_F32
static int64_t SFX(lp_block)(int64_t H)
{
    int64_t m = 8192 / H;
    return m >= 16 ? m / 16 * 16 : m > 0 ? m : 1;
}

/* floats of per-thread scratch: two float blocks and a 16-bit staging block */
static int64_t SFX(lp_scratch)(int64_t H)
{
    int64_t e = SFX(lp_block)(H) * H;
    return 2 * e + (e + 1) / 2;
}

/* dst = src (n values) rounded to kind; with stream through stage and
 * non-temporal stores (the caller fences). */
static void SFX(lp_put)(int kind, uint16_t *dst, const float *src, int64_t n, uint16_t *stage,
                        int stream)
{
    if (!stream) {
        narrow_half(kind, dst, src, n);
        return;
    }
    narrow_half(kind, stage, src, n);
    stream_copy(dst, stage, (size_t)n * sizeof(uint16_t));
}

/* Backward rows [r0, r1) in 16-bit storage (prefetching up to row re, as
 * bwd_range): converted in registers on AVX-512 (long_bwd, bwd_rows16),
 * else bwd_range on widened blocks. */
static void SFX(lp_bwd_rows)(const SFX(lp_bwd) *a, float *pw, float *pb, const float *mean,
                             const float *rstd, const float *w, int64_t r0, int64_t r1,
                             int64_t re, int64_t H, float *buf)
{
#if HAVE_SHORT16
    if (H > SHORT16_H)
        SFX(long_bwd)(a->kind, a->dx, pw, pb, a->dy, a->x, mean, rstd, w, r0, r1, H, buf,
                      a->stream);
    else
        SFX(bwd_rows16)(a->kind, a->dx, pw, pb, a->dy, a->x, mean, rstd, w, r0, r1, re, H,
                        a->stream);
    return;
#endif
    (void)re;
    const int64_t m = SFX(lp_block)(H);
    float *xb = buf, *gb = buf + m * H;
    uint16_t *stage = (uint16_t *)(gb + m * H);
    for (int64_t r = r0; r < r1; r += m) {
        int64_t n = r1 - r < m ? r1 - r : m, e = n * H;
        widen_half(a->kind, xb, a->x + r * H, e);
        widen_half(a->kind, gb, a->dy + r * H, e);
        SFX(bwd_range)(gb, pw, pb, gb, xb, mean ? mean + r : NULL, rstd + r, w, 0, n, n, H, NULL,
                       1);
        SFX(lp_put)(a->kind, a->dx + r * H, gb, e, stage, a->stream);
    }
    if (a->stream) stream_fence();
}
#endif

/* Share t of p: the row blocks [k0, k1) with k0 = nblk*t/p, each into its own
 * partial sums part[k] = [dweight | dbias]. */
static void SFX(bwd_blocks)(T *part, int64_t np, int64_t ps, T *dx, const T *dy,
                            const T *x, const T *mean, const T *rstd, const T *w,
                            int64_t N, int64_t H, int64_t rb, int64_t nblk, T *stage,
                            const SFX(lp_bwd) *lp, int hot, int64_t t, int64_t p)
{
    const int64_t k1 = nblk * (t + 1) / p, re = k1 * rb < N ? k1 * rb : N;   /* share's end */
    for (int64_t k = nblk * t / p; k < k1; k++) {
        T *pw = part + k * np * ps, *pb = np == 2 ? pw + ps : NULL;   /* block k's partials */
        memset(pw, 0, (size_t)(np * ps) * sizeof(T));
        int64_t r1 = (k + 1) * rb < N ? (k + 1) * rb : N;
#if IS_F32
        if (lp) {
            SFX(lp_bwd_rows)(lp, pw, pb, mean, rstd, w, k * rb, r1, re, H, stage);
            continue;
        }
#endif
        SFX(bwd_range)(dx, pw, pb, dy, x, mean, rstd, w, k * rb, r1, re, H, stage, hot);
    }
}

#define REDUCE_COLS 256   /* bwd_reduce's column chunk */

/* Share t of p of the columns, in chunks of REDUCE_COLS: out_v[j] = sum over
 * blocks k, in order, of part[k][v][j], summed in double (v = 0: dweight,
 * v = 1: dbias). */
static void SFX(bwd_reduce)(T *dw, T *db, const T *part, int64_t np, int64_t ps, int64_t H,
                            int64_t nblk, int64_t t, int64_t p)
{
    int64_t nc = (H + REDUCE_COLS - 1) / REDUCE_COLS;
    for (int64_t c = nc * t / p; c < nc * (t + 1) / p; c++) {
        int64_t j0 = c * REDUCE_COLS, j1 = j0 + REDUCE_COLS < H ? j0 + REDUCE_COLS : H;
        for (int64_t v = 0; v < np; v++) {
            double acc[REDUCE_COLS];
            for (int64_t j = j0; j < j1; j++) acc[j - j0] = 0;
            for (int64_t k = 0; k < nblk; k++) {
                const T *pk = part + (k * np + v) * ps;
#pragma omp simd
                for (int64_t j = j0; j < j1; j++) acc[j - j0] += (double)pk[j];
            }
            T *dst = v == 0 ? dw : db;
            for (int64_t j = j0; j < j1; j++) dst[j] = (T)acc[j - j0];
        }
    }
}

/* Backward driver shared by LayerNorm and RMSNorm (db == NULL). Rows go in
 * blocks of fastln_row_block(N) rows, independent of the thread count; each
 * block owns partial sums of dweight and dbias, which are then added in
 * block order: the result is bitwise the same on any number of threads.
 * With lp, x, dy and dx are lp's (16-bit storage), and dx, dy, x are unused. */
static int SFX(backward)(T *dx, T *dw, T *db, const T *dy,
                         const T *x, const T *mean, const T *rstd, const T *w,
                         int64_t N, int64_t H, int nt, int stream, const SFX(lp_bwd) *lp)
{
    int64_t rb = fastln_row_block(N), nblk = (N + rb - 1) / rb;
    int64_t np = db ? 2 : 1;                         /* partial vectors per block */
    int hot = 3.0 * (double)N * (double)H * sizeof(T) <= FASTLN_BWD_HOT_BYTES;
    if (nblk == 0) {                                 /* no rows: zero gradients */
        memset(dw, 0, (size_t)H * sizeof(T));
        if (db) memset(db, 0, (size_t)H * sizeof(T));
        return FASTLN_OK;
    }
    if (nblk == 1 && !stream && !lp) {               /* one block: sums straight into dw, db */
        memset(dw, 0, (size_t)H * sizeof(T));
        if (db) memset(db, 0, (size_t)H * sizeof(T));
        SFX(bwd_range)(dx, dw, db, dy, x, mean, rstd, w, 0, N, N, H, NULL, hot);
        return FASTLN_OK;
    }
    int64_t ps = SFX(part_stride)(H);
    T *part = (T *)malloc((size_t)(nblk * np * ps) * sizeof(T));
    if (!part) return FASTLN_ENOMEM;
    if (nt > nblk) nt = (int)nblk;
    /* per-thread staging rows for streamed dx (NULL: dx is written in place,
     * also when the allocation fails, which only costs speed); with lp, the
     * scratch it needs */
    int64_t sn = stream ? GROUP * H : 0;
#if IS_F32
    if (lp) sn = SFX(lp_scratch)(H);
#endif
    T *stage = sn ? (T *)malloc((size_t)(nt * sn) * sizeof(T)) : NULL;
    if (lp && !stage) {
        free(part);
        return FASTLN_ENOMEM;
    }
    /* the reduce shares its chunks of columns out among the threads; rows of
     * up to one chunk (one thread would add it all) add it after the
     * region, one barrier fewer */
    const int par_reduce = nt > 1 && H > REDUCE_COLS;
    if (nt <= 1) {
        SFX(bwd_blocks)(part, np, ps, dx, dy, x, mean, rstd, w, N, H, rb, nblk, stage, lp, hot,
                        0, 1);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(bwd_blocks)(part, np, ps, dx, dy, x, mean, rstd, w, N, H, rb, nblk,
                            stage ? stage + t * sn : NULL, lp, hot, t, p);
            if (par_reduce) {
#pragma omp barrier
                SFX(bwd_reduce)(dw, db, part, np, ps, H, nblk, t, p);
            }
        }
    }
    if (!par_reduce) SFX(bwd_reduce)(dw, db, part, np, ps, H, nblk, 0, 1);
    free(stage);
    free(part);
    return FASTLN_OK;
}

static int SFX(layer_norm_backward)(T *dx, T *dw, T *db, const T *dy, const T *x,
                                    const T *mean, const T *rstd, const T *w,
                                    int64_t N, int64_t H, int nt, int stream)
{
    return SFX(backward)(dx, dw, db, dy, x, mean, rstd, w, N, H, nt, stream, NULL);
}

static int SFX(rms_norm_backward)(T *dx, T *dw, const T *dy, const T *x, const T *rstd,
                                  const T *w, int64_t N, int64_t H, int nt, int stream)
{
    return SFX(backward)(dx, dw, NULL, dy, x, NULL, rstd, w, N, H, nt, stream, NULL);
}

#if IS_F32
/* LayerNorm (db != NULL) or RMSNorm backward in 16-bit storage. */
static int SFX(half_bwd)(int kind, uint16_t *dx, float *dw, float *db, const uint16_t *dy,
                         const uint16_t *x, const float *mean, const float *rstd,
                         const float *w, int64_t N, int64_t H, int nt, int stream)
{
    SFX(lp_bwd) lp = {kind, stream, dx, dy, x};
    return SFX(backward)(NULL, dw, db, NULL, NULL, mean, rstd, w, N, H, nt, stream, &lp);
}

/* Forward in 16-bit storage: op FASTLN_OP_LN (y = LN(x)), FASTLN_OP_RMS, or
 * FASTLN_OP_ADD (s = x + res and y = LN(s) in float, both stored rounded, as
 * the float32 kernels do). */
typedef struct {
    int op, kind, stream;
    uint16_t *y, *s;
    float *mean, *rstd;
    const uint16_t *x, *res;
    const float *w, *b;
    int64_t H;
    double eps;
} SFX(lp_fwd);

static void SFX(lp_fwd_rows)(const SFX(lp_fwd) *a, int64_t r0, int64_t r1, float *buf)
{
    const int64_t H = a->H;
#if HAVE_SHORT16   /* converted in registers, sixteen rows at a time or long rows */
    const uint16_t *res = a->op == FASTLN_OP_ADD ? a->res : NULL;
    if (H <= FWD16_H)   /* buf: at least 17H floats */
        SFX(fwd_rows16_half)(a->op == FASTLN_OP_RMS, a->kind, a->y, a->s, a->mean, a->rstd, a->x,
                             res, a->w, a->b, r0, r1, H, a->eps, a->stream, buf);
    else
        SFX(long_rows)(a->kind, a->op == FASTLN_OP_RMS, a->y, a->s, a->mean, a->rstd, a->x, res,
                       a->w, a->b, r0, r1, H, a->eps, buf, a->stream);
    return;
#endif
    const int64_t m = SFX(lp_block)(H);
    float *xb = buf, *rb = buf + m * H;
    uint16_t *stage = (uint16_t *)(rb + m * H);
    for (int64_t r = r0; r < r1; r += m) {
        int64_t n = r1 - r < m ? r1 - r : m, e = n * H;
        float *mean = a->mean ? a->mean + r : NULL, *rstd = a->rstd ? a->rstd + r : NULL;
        widen_half(a->kind, xb, a->x + r * H, e);
        if (a->op == FASTLN_OP_ADD) {   /* s over x, y over res */
            widen_half(a->kind, rb, a->res + r * H, e);
            SFX(add_ln_range)(rb, xb, mean, rstd, xb, rb, a->w, a->b, 0, n, H, a->eps, NULL);
            SFX(lp_put)(a->kind, a->s + r * H, xb, e, stage, a->stream);
            SFX(lp_put)(a->kind, a->y + r * H, rb, e, stage, a->stream);
            continue;
        }
        if (a->op == FASTLN_OP_RMS) SFX(rms_range)(xb, rstd, xb, a->w, 0, n, H, a->eps, NULL);
        else SFX(ln_range)(xb, mean, rstd, xb, a->w, a->b, 0, n, H, a->eps, NULL);
        SFX(lp_put)(a->kind, a->y + r * H, xb, e, stage, a->stream);
    }
    if (a->stream) stream_fence();
}

static int SFX(half_fwd)(int op, int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                         const uint16_t *x, const uint16_t *res, const float *w,
                         const float *b, int64_t N, int64_t H, double eps, int nt, int stream)
{
    SFX(lp_fwd) a = {op, kind, stream, y, s, mean, rstd, x, res, w, b, H, eps};
    int64_t sn = SFX(lp_scratch)(H);
    float *scratch = (float *)malloc((size_t)(nt * sn) * sizeof(float));
    if (!scratch) return FASTLN_ENOMEM;
    if (nt <= 1) {
        SFX(lp_fwd_rows)(&a, 0, N, scratch);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(lp_fwd_rows)(&a, N * t / p, N * (t + 1) / p, scratch + t * sn);
        }
    }
    free(scratch);
    return FASTLN_OK;
}
#endif

#undef NACC
#undef CHUNK
#undef GROUP
#undef BWD_PF_ROWS
#undef ROWS
#undef SHORT_H
#undef HAVE_SHORT16
