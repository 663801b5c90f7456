/*
 * The backward scalars of one row, written once per (element type, ISA)
 * (isa/type_begin.h): with xhat = ((x - m) - dm) * r and g = dy * weight,
 * dx = r * (g - c1 - xhat * c2); RMSNorm is m = dm = c1 = 0. Sums that are
 * not finite are redone in double. Needs sums.h.
 */


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

