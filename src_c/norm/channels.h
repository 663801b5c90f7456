/*
 * Channels-first LayerNorm and RMSNorm, written once per (element type, ISA)
 * (isa/type_begin.h): x, y (N, C, S) contiguous, normalized over the C channels
 * at each of the N * S positions (the LayerNorm of ConvNeXt-style networks,
 * axis 1 of (N, C, H, W)); mean, rstd (N, S) or NULL; weight, bias (C) or
 * NULL.
 *
 * A row's C values lie S apart, so a position-at-a-time kernel would read one
 * element per cache line. Instead a tile of neighbouring positions walks the
 * channels together: each channel contributes one contiguous run of the
 * tile's positions, and each position keeps its own running sums (one vector
 * lane a position). The tile's values stay in L2 across its three sweeps
 * (the sum around the first channel's value, the centred sum of squares, the
 * output), so x is read from memory once and y written once. The statistics
 * are those of the row kernels: shifted by the first value, two passes, sums
 * in double (in T over blocks of CF_BLOCK channels first).
 */

/* Positions a tile holds at most, and the bytes of x its sweeps revisit:
 * a tile of CF_TILE_BYTES stays in L2 between them, and the longer its runs,
 * the fewer the tiles' overheads and the better the prefetchers follow. */
#ifndef CF_TILE
#define CF_TILE 256
#define CF_TILE_BYTES (128 << 10)
#endif

/* Channels per block of the running sums: each block sums in T, one lane a
 * position, and is folded into the double sums, so that T's rounding covers
 * at most CF_BLOCK terms. */
#define CF_BLOCK 32

/* A tile's first sweep prefetches the run this many channels on: each run
 * starts a page of its own, which the hardware prefetchers have not seen. */
#define CF_PF_AHEAD 4

/* Positions a tile: CF_TILE_BYTES of each array it reads, a multiple of 16,
 * from 16 to CF_TILE */
static int64_t SFX(cf_tile_len)(int64_t C)
{
    int64_t len = CF_TILE_BYTES / (C * (int64_t)sizeof(T)) / 16 * 16;
    return len < 16 ? 16 : len > CF_TILE ? CF_TILE : len;
}

/* Position j of a tile redone in double straight from x, as ln_row_double
 * does a row (stats.h): for statistics that T may have lost (overflow,
 * underflow, a non-finite value). */
static void SFX(cf_column_double)(T *y, T *mean, T *rstd, const T *x, const T *w,
                                  const T *b, int64_t C, int64_t S, double eps, int rms)
{
    double s = 0, ss = 0;
    for (int64_t c = 0; c < C && !rms; c++) s += (double)x[c * S];
    double m = s / (double)C;
    for (int64_t c = 0; c < C; c++) ss += ((double)x[c * S] - m) * ((double)x[c * S] - m);
    double r = 1.0 / sqrt(ss / (double)C + eps);
    if (mean) *mean = (T)m;
    if (rstd) *rstd = (T)r;
    for (int64_t c = 0; c < C; c++)
        y[c * S] = (T)(((double)x[c * S] - m) * r * (w ? (double)w[c] : 1.0) +
                       (b && !rms ? (double)b[c] : 0.0));
}

/* One tile: positions [s0, s0 + m) of sample n. rms: RMSNorm (no mean, no
 * bias). stream: y's runs go out with non-temporal stores from a buffer in
 * L1 (an output of many runs S apart would otherwise be read for ownership,
 * run by run). */
static void SFX(cf_tile)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                         int64_t C, int64_t S, int64_t s0, int64_t m, double eps, int rms,
                         int stream)
{
    double acc[CF_TILE];
    T shift[CF_TILE], d[CF_TILE], r[CF_TILE], part[CF_TILE];
    unsigned char redo[CF_TILE];   /* statistics T may have lost: see cf_column_double */
    int differs[CF_TILE];          /* some value differs from the shift */
    int any_redo = 0;
    const T *x0 = x + s0;
    for (int64_t j = 0; j < m; j++) {
        shift[j] = rms ? (T)0 : x0[j];
        d[j] = 0;
        acc[j] = 0;
        redo[j] = 0;
        differs[j] = 0;
    }
    for (int pass = rms; pass < 2; pass++) {   /* 0: sum around the shift; 1: squares */
        for (int64_t c0 = 0; c0 < C; c0 += CF_BLOCK) {
            int64_t c1 = c0 + CF_BLOCK < C ? c0 + CF_BLOCK : C;
            for (int64_t j = 0; j < m; j++) part[j] = 0;
            for (int64_t c = c0; c < c1; c++) {
                const T *xc = x0 + c * S;
                if (pass == rms && c + CF_PF_AHEAD < C)   /* x's first sweep: see CF_PF_AHEAD */
                    for (int64_t o = 0; o < m; o += 64 / (int64_t)sizeof(T))
                        __builtin_prefetch(xc + CF_PF_AHEAD * S + o);
                if (pass == 0) {
#pragma omp simd
                    for (int64_t j = 0; j < m; j++) part[j] += xc[j] - shift[j];
                } else {
#pragma omp simd
                    for (int64_t j = 0; j < m; j++) {
                        T v = (xc[j] - shift[j]) - d[j];
                        part[j] = FMA(v, v, part[j]);
                        differs[j] |= xc[j] != shift[j];
                    }
                }
            }
#pragma omp simd
            for (int64_t j = 0; j < m; j++) acc[j] += (double)part[j];
        }
        for (int64_t j = 0; j < m; j++) {
            double v = acc[j] / (double)C;
            if (pass == 0) {
                d[j] = (T)v;
                redo[j] = !isfinite(v);
            } else {
                r[j] = (T)(1.0 / sqrt(v + eps));
                /* as stats_suspect: a float mean square out of range may be
                 * an overflow, or an underflow (0 too, unless every value is
                 * the shift: a constant column) */
                redo[j] |= !isfinite(v) || (sizeof(T) == 4 && !(v >= 1e-30 && v <= 1e30) &&
                                            (v != 0 || differs[j]));
            }
            any_redo |= redo[j];
            acc[j] = 0;
        }
    }
    if (any_redo) stream = 0;   /* the redone positions are written over */
    for (int64_t j = 0; j < m; j++) {
        if (mean) mean[s0 + j] = shift[j] + d[j];
        if (rstd) rstd[s0 + j] = r[j];
    }
    T *y0 = y + s0, *out = part;   /* part: free again, a buffer for stream */
    for (int64_t c = 0; c < C; c++) {
        const T *xc = x0 + c * S;
        T *yc = y0 + c * S;
        const T wc = w ? w[c] : (T)1, bc = b && !rms ? b[c] : (T)0;
        if (!stream) out = yc;
#pragma omp simd
        for (int64_t j = 0; j < m; j++) out[j] = FMA(((xc[j] - shift[j]) - d[j]) * r[j], wc, bc);
        if (stream) stream_copy(yc, out, (size_t)m * sizeof(T));
    }
    for (int64_t j = 0; j < m && any_redo; j++)
        if (redo[j])
            SFX(cf_column_double)(y0 + j, mean ? mean + s0 + j : NULL, rstd ? rstd + s0 + j : NULL,
                                  x0 + j, w, b, C, S, eps, rms);
}

/* The (N, C, S) array in tiles of up to CF_TILE positions (fewer for many
 * channels: see CF_TILE_BYTES), shared by nt threads. */
static int SFX(norm_channels)(T *y, T *mean, T *rstd, const T *x, const T *w, const T *b,
                              int64_t N, int64_t C, int64_t S, double eps, int rms, int nt,
                              int stream)
{
    (void)nt;   /* unused in a serial build */
    const int64_t len = SFX(cf_tile_len)(C);
    const int64_t tiles = (S + len - 1) / len;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < N * tiles; q++) {
            int64_t n = q / tiles, s0 = q % tiles * len;
            int64_t m = S - s0 < len ? S - s0 : len;
            SFX(cf_tile)(y + n * C * S, mean ? mean + n * S : NULL,
                         rstd ? rstd + n * S : NULL, x + n * C * S, w, b, C, S, s0, m, eps,
                         rms, stream);
        }
        if (stream) stream_fence();
    }
    return FASTLN_OK;
}

/* ---- backward ------------------------------------------------------------ */

/* The backward of one tile, positions [s0, s0 + m) of sample n, with the
 * row backward's scalars (bwd_stats.h) for each position: sweep 1 sums
 * d = x - mean, g = dy * weight and g * d over the channels (RMSNorm: g * x),
 * one lane a position; sweep 2 writes dx = r * (g - c1 - xhat * c2) and the
 * tile's own sums of dy * xhat and dy per channel into pw, pb (C each; pb
 * NULL for RMSNorm). Sums that T lost are redone in double, as a row's. */
static void SFX(cf_bwd_tile)(T *dx, T *pw, T *pb, const T *dy, const T *x, const T *mean,
                             const T *rstd, const T *w, int64_t C, int64_t S, int64_t s0,
                             int64_t m, int stream)
{
    const int rms = mean == NULL;
    double a_d[CF_TILE], a_g[CF_TILE], a_gd[CF_TILE];
    T p_d[CF_TILE], p_g[CF_TILE], p_gd[CF_TILE], mj[CF_TILE], dm[CF_TILE],
        r[CF_TILE], c1[CF_TILE], c2[CF_TILE];
    const T *x0 = x + s0, *g0 = dy + s0;
    for (int64_t j = 0; j < m; j++) {
        mj[j] = rms ? (T)0 : mean[s0 + j];
        r[j] = rstd[s0 + j];
        a_d[j] = a_g[j] = a_gd[j] = 0;
    }
    for (int64_t c0 = 0; c0 < C; c0 += CF_BLOCK) {
        int64_t c1_ = c0 + CF_BLOCK < C ? c0 + CF_BLOCK : C;
        for (int64_t j = 0; j < m; j++) p_d[j] = p_g[j] = p_gd[j] = 0;
        for (int64_t c = c0; c < c1_; c++) {
            const T *xc = x0 + c * S, *gc = g0 + c * S;
            const T wc = w ? w[c] : (T)1;
            if (c + CF_PF_AHEAD < C)   /* see CF_PF_AHEAD */
                for (int64_t o = 0; o < m; o += 64 / (int64_t)sizeof(T)) {
                    __builtin_prefetch(xc + CF_PF_AHEAD * S + o);
                    __builtin_prefetch(gc + CF_PF_AHEAD * S + o);
                }
#pragma omp simd
            for (int64_t j = 0; j < m; j++) {
                T d = xc[j] - mj[j], g = gc[j] * wc;
                p_d[j] += d;
                p_g[j] += g;
                p_gd[j] = FMA(g, d, p_gd[j]);
            }
        }
#pragma omp simd
        for (int64_t j = 0; j < m; j++) {
            a_d[j] += (double)p_d[j];
            a_g[j] += (double)p_g[j];
            a_gd[j] += (double)p_gd[j];
        }
    }
    for (int64_t j = 0; j < m; j++) {
        if (sizeof(T) == 4 && !(isfinite(a_d[j]) && isfinite(a_g[j]) && isfinite(a_gd[j]))) {
            /* float lanes overflowed: this position's sums in double */
            a_d[j] = a_g[j] = a_gd[j] = 0;
            for (int64_t c = 0; c < C; c++) {
                double d = (double)x0[c * S + j] - (double)mj[j],
                       g = (double)g0[c * S + j] * (w ? (double)w[c] : 1.0);
                a_d[j] += d;
                a_g[j] += g;
                a_gd[j] += g * d;
            }
        }
        /* RMSNorm: m = dm = c1 = 0 and c2 = r * mean(g * x) */
        double dmj = rms ? 0 : a_d[j] / (double)C;
        dm[j] = (T)dmj;
        c1[j] = rms ? (T)0 : (T)(a_g[j] / (double)C);
        c2[j] = (T)((double)r[j] * (a_gd[j] - dmj * a_g[j]) / (double)C);
    }
    T *out = p_d;   /* free again: a buffer for stream */
    for (int64_t c = 0; c < C; c++) {
        const T *xc = x0 + c * S, *gc = g0 + c * S;
        T *dc = dx + s0 + c * S;
        const T wc = w ? w[c] : (T)1;
        T sw = 0, sb = 0;
        if (!stream) out = dc;
#pragma omp simd reduction(+ : sw, sb)
        for (int64_t j = 0; j < m; j++) {
            T xh = ((xc[j] - mj[j]) - dm[j]) * r[j], g = gc[j];
            sw = FMA(g, xh, sw);
            sb += g;
            out[j] = r[j] * FMA(-xh, c2[j], g * wc - c1[j]);
        }
        if (stream) stream_copy(dc, out, (size_t)m * sizeof(T));
        pw[c] = sw;
        if (pb) pb[c] = sb;
    }
}

/* The backward of an (N, C, S) array: LayerNorm, or RMSNorm where mean is
 * NULL (db unused). Tiles as the forward's, each with partial sums of its
 * own; dw, db are their sums in tile order, in double: the same on any
 * thread count. With one channel the array is N * S rows of one element,
 * which take the row backward (its bwd_rows1: a LayerNorm dx of exactly 0). */
static int SFX(norm_channels_bwd)(T *dx, T *dw, T *db, const T *dy, const T *x, const T *mean,
                                  const T *rstd, const T *w, int64_t N, int64_t C, int64_t S,
                                  int nt, int stream)
{
    if (C == 1)
        return SFX(backward)(dx, dw, mean ? db : NULL, dy, x, mean, rstd, w, N * S, 1, nt,
                             stream, NULL, NULL);
    (void)nt;   /* unused in a serial build */
    const int np = mean ? 2 : 1;   /* partial vectors a tile */
    const int64_t len = SFX(cf_tile_len)(C);
    const int64_t tiles = (S + len - 1) / len, nq = N * tiles;
    T *part = (T *)malloc((size_t)(nq * np * C + 1) * sizeof(T));
    if (!part) return FASTLN_ENOMEM;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < nq; q++) {
            int64_t n = q / tiles, s0 = q % tiles * len;
            int64_t m = S - s0 < len ? S - s0 : len;
            T *pq = part + q * np * C;
            SFX(cf_bwd_tile)(dx + n * C * S, pq, np == 2 ? pq + C : NULL, dy + n * C * S,
                             x + n * C * S, mean ? mean + n * S : NULL, rstd + n * S, w, C, S,
                             s0, m, stream);
        }
        if (stream) stream_fence();
#pragma omp for schedule(static)
        for (int64_t c = 0; c < C; c++) {
            for (int v = 0; v < np; v++) {
                double acc = 0;
                for (int64_t q = 0; q < nq; q++) acc += (double)part[(q * np + v) * C + c];
                (v == 0 ? dw : db)[c] = (T)acc;
            }
        }
    }
    free(part);
    return FASTLN_OK;
}
