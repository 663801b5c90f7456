/*
 * The sixteen-row forwards of float rows on AVX-512: LayerNorm, RMSNorm and
 * add + LayerNorm of rows of up to FWD16_MAX_H elements (avx512.h).
 */
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include "isa/target_avx512.h"
#include "isa/begin.h"
#include "isa/simd.h"
#include "norm/avx512/avx512.h"
#define IS_F32 1
#include "isa/type_begin.h"
#include "norm/avx512/rows16.h"
#include "norm/avx512/rows16_fwd.h"

/* s = x + res over n elements; with pf, prefetching x and res n elements on */
static void add16(float *s, const float *x, const float *res, int64_t n, int pf)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (pf) {
            _mm_prefetch((const char *)(x + n + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(res + n + i), _MM_HINT_T0);
        }
        _mm512_storeu_ps(s + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(res + i)));
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(s + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i),
                                                      _mm512_maskz_loadu_ps(m, res + i)));
    }
}

/* LayerNorm, or with rms RMSNorm (mean and b unused), forward of rows
 * [r0, r1), H <= FWD16_MAX_H, sixteen at a time (rows of one or two vectors
 * 32, see NG below); rows the group kernel leaves go through the one-row
 * code (fastln_avx512_ln_row, fastln_avx512_rms_row). With res (LayerNorm
 * only), add + LayerNorm: a group's s = x + res is stored first, then its
 * LayerNorm is that of s (the bits of this LayerNorm on x + res). With
 * stream, y goes through an ntw writer where it can (a group with rows to
 * redo is staged, redone there, and put after); other rows, and
 * s, are written to staging blocks and streamed out a group at a time. */
static inline __attribute__((always_inline)) void fwd16_nv(
    int NV, int rms, int add, float *y, float *s, float *mean, float *rstd, const float *x,
    const float *res, const float *w, const float *b, int64_t r0, int64_t r1, int64_t H,
    double eps, int stream)
{
    const __mmask16 tail = tail16(H);
    __m512 wv[NVF16], bv[NVF16];
    load_wb16(wv, bv, w, rms ? NULL : b, NV, tail);
    /* y's staging block starts 2 KiB into its array: at its start, its
     * stores and the loads of the frame's other locals can alias modulo 4 KiB
     * (4K aliasing), which slows the streamed rows */
    float stage_[16 * FWD16_MAX_H + 512], sstage[16 * FWD16_MAX_H];
    float *const stage = stage_ + 512;
    /* y prefetched for writing, rows of more than 8 vectors (group kernels) */
    const int pfw = !stream && !add && NV > 8 && (double)(r1 - r0) * H * 4 > FASTLN_PF_RANGE_BYTES;
    ntw w_;
    ntw *const ow = stream && ntw_ok(y, H) ? &w_ : NULL;
    if (ow) ntw_init(ow, y + r0 * H);
    /* LayerNorm and RMSNorm rows of one vector, and of two not streamed, go 32
     * at a time (NG 2 groups of 16, as fwd16h_nv): the two groups'
     * latency chains (reductions, rstd) overlap. Streamed rows of two
     * vectors, rows of three or more, and add + LayerNorm gain nothing from
     * it and go 16 at a time. */
    const int NG = !add && (NV == 1 || (NV == 2 && !stream)) ? 2 : 1, G = 16 * NG;
    for (int64_t n = r0; n < r1; n += G) {
        int R = r1 - n < G ? (int)(r1 - n) : G;
        const float *xr[32];
        float *yr[32];
        if (add) {
            float *sg = stream ? sstage : s + n * H;
            add16(sg, x + n * H, res + n * H, R * H, n + 32 <= r1);
            rows16(xr, sg, 0, R, H);
        } else {
            rows16(xr, x, n, r1, H);
            if (NG == 2) rows16(xr + 16, x, n + 16, r1, H);
        }
        for (int k = 0; k < G; k++) yr[k] = stream ? stage + k * H : y + (n + k) * H;
        float *mn = mean && !rms ? mean + n : NULL, *rs = rstd ? rstd + n : NULL;
        /* Prefetch. LayerNorm and RMSNorm rows of SPREAD_NV vectors or more:
         * the group kernel's first sweep fetches the next group's row k with
         * its row k. Shorter rows and add + LayerNorm: PF_GROUP_FWD bytes of x
         * ahead at once, except LayerNorm rows of 16 (slower in cache with it,
         * no faster past it). add16 also fetches the next group's x and res
         * line by line; both are needed, as the hardware prefetchers fall
         * behind these rows. */
        const int spread = !add && NV >= SPREAD_NV;
        if (!spread && (NV > 1 || rms))
            pf_ahead(x + n * H, G * H * 4, PF_GROUP_FWD, x + r1 * H);
        /* the next group, for the group kernel with rows of NV vectors: a
         * constant NULL where NV < SPREAD_NV (a NULL known only at run time
         * slows rows of 16); groups of sixteen only */
#define PF(NV) (NV >= SPREAD_NV && spread && n + 32 <= r1 ? (const char *)(x + (n + 16) * H) : NULL)
        uint32_t redo;
        if (NV <= 2 && NG == 2)
            redo = rms ? rms_group16((void *const *)yr, rs, (const void *const *)xr, wv, R, NV,
                                     H, tail, eps, 0, 0, 0, NULL, 0, 2, ow)
                       : ln_group16((void *const *)yr, mn, rs, (const void *const *)xr, wv,
                                    bv, R, NV, H, tail, eps, 0, 0, 0, 0, NULL, 0, 2, ow);
        else
            redo = rms ? rms_group16((void *const *)yr, rs, (const void *const *)xr, wv, R, NV,
                                     H, tail, eps, 0, 0, 0, PF(NV), NV > 8 && pfw, 1, ow)
                       : ln_group16((void *const *)yr, mn, rs, (const void *const *)xr, wv,
                                    bv, R, NV, H, tail, eps, 0, 0, 0, 0, PF(NV), NV > 8 && pfw,
                                    1, ow);
#undef PF
        for (int k = 0; redo && k < R; k++) {
            if (!((redo >> k) & 1)) continue;
            if (rms) fastln_avx512_rms_row(yr[k], rs ? rs + k : NULL, xr[k], w, H, eps);
            else fastln_avx512_ln_row(yr[k], mn ? mn + k : NULL, rs ? rs + k : NULL, xr[k], w, b, H,
                              eps);
        }
        if (stream && add) stream_copy(s + n * H, sstage, (size_t)(R * H) * sizeof(float));
        if (ow && redo) ntw_put_n(ow, stage, R * H);   /* staged: the group's rows */
        else if (stream && !ow) stream_copy(y + n * H, stage, (size_t)(R * H) * sizeof(float));
    }
    if (ow) ntw_finish(ow);
    if (stream) stream_fence();
}


/* fwd16_nv for each (NV, OP) a function of its own (OP 0 LayerNorm, 1
 * RMSNorm, 2 add + LayerNorm), as fwd16h_ and the backward's bwd16_; rows of
 * one and two vectors hold their groups of 32 too (once a function of their
 * own, group32, so that paths/avx512.c compiled in reasonable time) */
#define FWD16_FN(NV, OP)                                                                   \
    static __attribute__((noinline)) void CAT3(fwd16_, NV, OP)(                            \
        float *y, float *s, float *mean, float *rstd, const float *x, const float *res,    \
        const float *w, const float *b, int64_t r0, int64_t r1, int64_t H, double eps,     \
        int stream)                                                                        \
    {                                                                                      \
        fwd16_nv(NV, OP == 1, OP == 2, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps,     \
                      stream);                                                             \
    }
#define FWD16_FNS(NV) FWD16_FN(NV, 0) FWD16_FN(NV, 1) FWD16_FN(NV, 2)
FOR_NVF16(FWD16_FNS)
#undef FWD16_FNS
#undef FWD16_FN

/* The float32 LayerNorm (rms 0), RMSNorm (rms 1) or, with res, add +
 * LayerNorm forward of rows [r0, r1), H <= FWD16_MAX_H, as fwd16_nv */
void fastln_avx512_fwd_rows16(int rms, float *y, float *s, float *mean, float *rstd,
                            const float *x, const float *res, const float *w, const float *b,
                            int64_t r0, int64_t r1, int64_t H, double eps, int stream)
{
#define F(NV, OP) CAT3(fwd16_, NV, OP)(y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, stream)
    switch ((int)((H + 15) / 16) * 3 + (res ? 2 : rms ? 1 : 0)) {   /* rows of 1 to 16 vectors */
        FOR_NVF16(OP_CASES)
    }
#undef F
}

#include "isa/type_end.h"
#include "isa/end.h"
#endif
