/*
 * The drivers, written once per (element type, ISA) (isa/type_begin.h): they
 * split the rows over nt threads (1: no OpenMP region) and run a path's row
 * ranges (range.h, half.h) on them. Threads take contiguous row
 * ranges (forward) or row blocks (backward); the entry points (api/norm.c)
 * chooses their number and whether to stream.
 */
#include "norm/norm.h"
#include "runtime/policy.h"

/* ---- forwards ------------------------------------------------------------ */

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
    if (nt <= 1) {          /* no OpenMP region at all: even an if(0) one costs time */
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

/* The general fused add + norm (add.h), contiguous row ranges a thread */
static int SFX(add_norm)(const fastln_add_args *g, int nt, int stream)
{
    const SFX(add_args) a = {g->rms,       g->elem, stream,           g->y,
                             g->s,         (T *)g->mean, (T *)g->rstd, g->x,
                             g->res,       (const T *)g->bi, (const T *)g->w, (const T *)g->b,
                             g->N,         g->R,    g->H,         g->eps};
    const int64_t sn = SFX(add_scratch)(g->H), N = g->N;
    T *scratch = (T *)malloc((size_t)(nt * sn) * sizeof(T));
    if (!scratch) return FASTLN_ENOMEM;
    if (nt <= 1) {
        SFX(add_norm_rows)(&a, 0, N, scratch);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(add_norm_rows)(&a, N * t / p, N * (t + 1) / p, scratch + t * sn);
        }
    }
    free(scratch);
    return FASTLN_OK;
}

#if IS_F32
static int SFX(half_fwd)(fastln_norm_op op, int elem, uint16_t *y, uint16_t *s, float *mean,
                         float *rstd, const uint16_t *x, const uint16_t *res, const float *w,
                         const float *b, int64_t N, int64_t H, double eps, int nt, int stream)
{
    SFX(half_fwd_args) a = {op, elem, stream, y, s, mean, rstd, x, res, w, b, H, eps};
    int64_t sn = SFX(half_scratch)(H);
    float *scratch = (float *)malloc((size_t)(nt * sn) * sizeof(float));
    if (!scratch) return FASTLN_ENOMEM;
    if (nt <= 1) {
        SFX(half_fwd_rows)(&a, 0, N, scratch);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(half_fwd_rows)(&a, N * t / p, N * (t + 1) / p, scratch + t * sn);
        }
    }
    free(scratch);
    return FASTLN_OK;
}
#endif

/* ---- backward ------------------------------------------------------------ */

/* Elements between partial vectors: H rounded up to a cache line, plus 1 KiB
 * where that is a multiple of 4 KiB, so that dweight and dbias partials never
 * sit at equal offsets modulo 4096 (4K aliasing). */
static int64_t SFX(part_stride)(int64_t H)
{
    int64_t line = 64 / (int64_t)sizeof(T), ps = (H + line - 1) / line * line;
    return ps * (int64_t)sizeof(T) % 4096 == 0 ? ps + 1024 / (int64_t)sizeof(T) : ps;
}

/* The fused add's extras of a backward: ds, an incoming gradient added to dx
 * (may be NULL), and with di the column sums of that dx (add.h) */
typedef struct {
    const T *ds;
    T *di;
} SFX(bwd_add);

/* Share t of p: the row blocks [k0, k1) with k0 = nblk*t/p, each into its own
 * partial sums part[k] = [dweight | dbias (LayerNorm) | dx's column sums
 * (with add->di)]. */
static void SFX(bwd_blocks)(T *part, int64_t np, int64_t ps, T *dx, const T *dy,
                            const T *x, const T *mean, const T *rstd, const T *w,
                            int64_t N, int64_t H, int64_t rb, int64_t nblk, T *stage,
                            const SFX(half_bwd_args) *half, const SFX(bwd_add) *add, int stream,
                            int hot, int64_t t, int64_t p)
{
    const int64_t k1 = nblk * (t + 1) / p, re = k1 * rb < N ? k1 * rb : N;   /* share's end */
    const int has_b = np - (add && add->di) == 2;
    for (int64_t k = nblk * t / p; k < k1; k++) {
        T *pw = part + k * np * ps, *pb = has_b ? pw + ps : NULL;   /* block k's partials */
        memset(pw, 0, (size_t)(np * ps) * sizeof(T));
        int64_t r1 = (k + 1) * rb < N ? (k + 1) * rb : N;
        if (add) {
            SFX(bwd_add_rows)(dx, pw, pb, add->di ? pw + (np - 1) * ps : NULL, dy, x, add->ds,
                              mean, rstd, w, k * rb, r1, H, stage, stream, hot);
            continue;
        }
#if IS_F32
        if (half) {
            SFX(half_bwd_rows)(half, pw, pb, mean, rstd, w, k * rb, r1, re, H, stage);
            continue;
        }
#else
        (void)half;   /* double: no half storage */
#endif
        SFX(bwd_range)(dx, pw, pb, dy, x, mean, rstd, w, k * rb, r1, re, H, stage, hot);
    }
}

#define REDUCE_COLS 256   /* bwd_reduce's column chunk */

/* Share t of p of the columns, in chunks of REDUCE_COLS: dst[v][j] = sum over
 * blocks k, in order, of part[k][v][j], summed in double. */
static void SFX(bwd_reduce)(T *const *dst, const T *part, int64_t np, int64_t ps, int64_t H,
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
            for (int64_t j = j0; j < j1; j++) dst[v][j] = (T)acc[j - j0];
        }
    }
}

/* Backward driver shared by LayerNorm and RMSNorm (db == NULL). Rows go in
 * blocks of fastln_row_block(N) rows, independent of the thread count; each
 * block owns partial sums of dweight and dbias, which are then added in
 * block order: the result is bitwise the same on any number of threads.
 * With half, x, dy and dx are half's (half storage), and dx, dy, x are unused.
 * With add, the fused add's backward: dx gets add->ds added, and add->di
 * (when not NULL) its column sums, reduced as dweight is. */
static int SFX(backward)(T *dx, T *dw, T *db, const T *dy,
                         const T *x, const T *mean, const T *rstd, const T *w,
                         int64_t N, int64_t H, int nt, int stream, const SFX(half_bwd_args) *half,
                         const SFX(bwd_add) *add)
{
    int64_t rb = fastln_row_block(N), nblk = (N + rb - 1) / rb;
    T *const dst[3] = {dw, db ? db : add ? add->di : NULL, db && add ? add->di : NULL};
    int64_t np = 1 + (dst[1] != NULL) + (dst[2] != NULL);   /* partial vectors per block */
    int hot = 3.0 * (double)N * (double)H * sizeof(T) <= FASTLN_BWD_HOT_BYTES;
    if (nblk == 0) {                                 /* no rows: zero gradients */
        for (int v = 0; v < np; v++) memset(dst[v], 0, (size_t)H * sizeof(T));
        return FASTLN_OK;
    }
    if (nblk == 1 && !stream && !half && !add) {     /* one block: sums straight into dw, db */
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
     * also when the allocation fails, which only costs speed); with half, the
     * scratch it needs */
    int64_t sn = add ? SFX(cache_block)(H) * H : stream ? GROUP * H : 0;
#if IS_F32
    if (half) sn = SFX(half_scratch)(H);
#endif
    T *stage = sn ? (T *)malloc((size_t)(nt * sn) * sizeof(T)) : NULL;
    if ((half || add) && !stage) {
        free(part);
        return FASTLN_ENOMEM;
    }
    /* the reduce shares its chunks of columns out among the threads; rows of
     * up to one chunk (one thread would add it all) add it after the
     * region, one barrier fewer */
    const int par_reduce = nt > 1 && H > REDUCE_COLS;
    if (nt <= 1) {
        SFX(bwd_blocks)(part, np, ps, dx, dy, x, mean, rstd, w, N, H, rb, nblk, stage, half, add,
                        stream, hot, 0, 1);
    } else {
#pragma omp parallel num_threads(nt)
        {
            int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
            SFX(bwd_blocks)(part, np, ps, dx, dy, x, mean, rstd, w, N, H, rb, nblk,
                            stage ? stage + t * sn : NULL, half, add, stream, hot, t, p);
            if (par_reduce) {
#pragma omp barrier
                SFX(bwd_reduce)(dst, part, np, ps, H, nblk, t, p);
            }
        }
    }
    if (!par_reduce) SFX(bwd_reduce)(dst, part, np, ps, H, nblk, 0, 1);
    free(stage);
    free(part);
    return FASTLN_OK;
}

static int SFX(layer_norm_backward)(T *dx, T *dw, T *db, const T *dy, const T *x,
                                    const T *mean, const T *rstd, const T *w,
                                    int64_t N, int64_t H, int nt, int stream)
{
    return SFX(backward)(dx, dw, db, dy, x, mean, rstd, w, N, H, nt, stream, NULL, NULL);
}

static int SFX(rms_norm_backward)(T *dx, T *dw, const T *dy, const T *x, const T *rstd,
                                  const T *w, int64_t N, int64_t H, int nt, int stream)
{
    return SFX(backward)(dx, dw, NULL, dy, x, NULL, rstd, w, N, H, nt, stream, NULL, NULL);
}

/* The fused add's backward: LayerNorm (db != NULL) or RMSNorm, dx plus ds
 * (may be NULL), and into di (may be NULL) the column sums of that dx */
static int SFX(add_backward)(T *dx, T *dw, T *db, T *di, const T *dy, const T *x, const T *ds,
                             const T *mean, const T *rstd, const T *w, int64_t N, int64_t H,
                             int nt, int stream)
{
    const SFX(bwd_add) add = {ds, di};
    return SFX(backward)(dx, dw, db, dy, x, mean, rstd, w, N, H, nt, stream, NULL, &add);
}

#if IS_F32
/* LayerNorm (db != NULL) or RMSNorm backward in half storage. */
static int SFX(half_bwd)(int elem, uint16_t *dx, float *dw, float *db, const uint16_t *dy,
                         const uint16_t *x, const float *mean, const float *rstd,
                         const float *w, int64_t N, int64_t H, int nt, int stream)
{
    SFX(half_bwd_args) half = {elem, stream, dx, dy, x};
    return SFX(backward)(NULL, dw, db, NULL, NULL, mean, rstd, w, N, H, nt, stream, &half, NULL);
}
#endif
