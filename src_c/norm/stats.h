/*
 * The forward statistics of one row, written once per (element type, ISA)
 * (isa/type_begin.h): the shifted two-pass mean and variance, the normalize
 * sweep, and the double fallback for float rows whose statistics overflow or
 * underflow. x0 = x[0] is a shift: x - x0 is exact for values close to each
 * other, so a huge mean next to a small spread loses no precision (Sterbenz
 * lemma). Needs sums.h.
 */

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

