/*
 * The sixteen-row forwards of float16/bfloat16 rows on AVX-512, converted in
 * registers: LayerNorm, RMSNorm and add + LayerNorm of rows of up to
 * FWD16_MAX_H elements (avx512.h).
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


/* s = x + res over n values of half storage elem, in float into sf and rounded
 * into s (nt: non-temporal where aligned), or with os put to that writer;
 * with pf, prefetching x and res n values on (as add16) */
static inline __attribute__((always_inline)) void add16_half(
    int elem, int bf16i, float *sf, uint16_t *s, const uint16_t *x, const uint16_t *res, int64_t n,
    int nt, int pf, ntw *os)
{
    if (os) {   /* s to the writer os instead (n a multiple of 32), two vectors a put */
        ntw wl = *os;
        for (int64_t i = 0; i < n; i += 32) {
            if (pf) {
                _mm_prefetch((const char *)(x + n + i), _MM_HINT_T0);
                _mm_prefetch((const char *)(res + n + i), _MM_HINT_T0);
            }
            const __mmask16 m = (__mmask16)0xFFFF;
            __m512 a = _mm512_add_ps(ld_half(elem, x + i, m), ld_half(elem, res + i, m));
            __m512 b = _mm512_add_ps(ld_half(elem, x + i + 16, m),
                                     ld_half(elem, res + i + 16, m));
            _mm512_storeu_ps(sf + i, a);
            _mm512_storeu_ps(sf + i + 16, b);
            ntw_put(&wl, _mm512_castsi512_ps(narrow32(elem, bf16i, a, b)));
        }
        *os = wl;
        return;
    }
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        if (pf && !(i & 31)) {   /* a line of each, every other vector */
            _mm_prefetch((const char *)(x + n + i), _MM_HINT_T0);
            _mm_prefetch((const char *)(res + n + i), _MM_HINT_T0);
        }
        __m512 v = _mm512_add_ps(ld_half(elem, x + i, m), ld_half(elem, res + i, m));
        _mm512_mask_storeu_ps(sf + i, m, v);
        st_half(elem, bf16i, s + i, v, m, nt);
    }
}

/* The float forwards' LayerNorm (rows16_fwd.c), or with rms RMSNorm
 * (mean and b unused), or with res add + LayerNorm (into y and s), on rows of
 * half storage elem, converted in registers (bfloat16 narrowed as bf16i
 * says): the float32 arithmetic of the float forwards exactly (a group's
 * s = x + res in float into buf, rounded into s, and the LayerNorm of the
 * float s). buf: 17H floats; stream: non-temporal stores (fenced here). rms
 * and add (res != NULL) are constants. */
static inline __attribute__((always_inline)) void fwd16h_nv(
    int NV, int rms, int add, int elem, int bf16i, uint16_t *y, uint16_t *s, float *mean,
    float *rstd, const uint16_t *x, const uint16_t *res, const float *w, const float *b, int64_t r0,
    int64_t r1, int64_t H, double eps, int stream, float *buf)
{
    const __mmask16 tail = tail16(H);
    __m512 wv[NVF16], bv[NVF16];
    load_wb16(wv, bv, w, rms ? NULL : b, NV, tail);
    if (rms) mean = NULL;
    float *const yf = buf + 16 * H;   /* y of a row that takes the one-row code */
    /* Streamed rows of an even number of vectors go through ntw writers, y's
     * and (add + LayerNorm) s's; a group with rows to redo is staged, then put.
     * NumPy's large arrays start 16 bytes into a line, where st_half's
     * 32-byte streaming stores never apply: without the writers y would go
     * out by ordinary stores. */
    ntw w_, ws_;
    ntw *const ow = stream && ntw_ok16(y, H) ? &w_ : NULL;
    ntw *const os = stream && add && ntw_ok16(s, H) ? &ws_ : NULL;   /* s's */
    uint16_t stage[16 * FWD16_MAX_H] __attribute__((aligned(64)));   /* G * H at most */
    const int nt = stream && !ow;
    if (ow) ntw_init(ow, (float *)(y + r0 * H));
    if (os) ntw_init(os, (float *)(s + r0 * H));
    const int pf_on = (double)(r1 - r0) * H * 2 > FASTLN_PF_RANGE_BYTES;
    /* Rows go 32 at a time (NG 2 groups of 16) where that is faster: the two
     * groups' reductions and rstd, latency chains between the sweeps,
     * overlap. Longer rows, and RMSNorm rows of one vector, are faster 16 at
     * a time. The float forwards take 32 rows only for rows of one vector,
     * and of two where not streamed (rows16_fwd.c). */
#define NG_LN(NV) ((NV) <= 6 ? 2 : 1)
#define NG_RMS(NV) ((NV) >= 2 && (NV) <= 6 ? 2 : 1)
    const int NGR = add ? 1 : rms ? NG_RMS(NV) : NG_LN(NV), G = 16 * NGR;
    for (int64_t n = r0; n < r1; n += G) {
        int R = r1 - n < G ? (int)(r1 - n) : G;
        const uint16_t *xr[32];
        const float *sr[16];
        uint16_t *yr[32];
        if (add) {
            add16_half(elem, bf16i, buf, s + n * H, x + n * H, res + n * H, R * H, stream,
                       n + 32 <= r1, os);
            rows16(sr, buf, 0, R, H);
        }
        for (int k = 0; k < G; k++) {
            xr[k] = x + (n + k < r1 ? n + k : r1 - 1) * H;
            yr[k] = ow ? stage + k * H : y + (n + k) * H;
        }
        float *mn = mean ? mean + n : NULL, *rs = rstd ? rstd + n : NULL;
        /* rows of more than 8 vectors prefetch the next group, as ln_group16
         * and rms_group16 do, where a thread's rows pass FASTLN_PF_RANGE_BYTES (in
         * cache it only costs time). Rows of SPREAD_NV to 8 vectors only where
         * y is streamed; shorter rows are slower with it (a constant NULL for
         * them) */
        const char *pf = pf_on && n + 2 * G <= r1 ? (const char *)(x + (n + G) * H) : NULL;
#define PF(NV) (NV > 8 || (NV >= SPREAD_NV && stream) ? pf : NULL)
        uint32_t redo;
#define HGROUP(E, BI)                                                                         \
    (add ? ln_group16((void *const *)yr, mn, rs, (const void *const *)sr, wv, bv, R, NV,      \
                           H, tail, eps, 0, E, BI, nt, NULL, 0, 1, ow)                        \
     : rms ? rms_group16((void *const *)yr, rs, (const void *const *)xr, wv, R, NV, H,        \
                              tail, eps, E, BI, nt, PF(NV), 0, NG_RMS(NV), ow)                \
           : ln_group16((void *const *)yr, mn, rs, (const void *const *)xr, wv, bv, R,        \
                             NV, H, tail, eps, E, E, BI, nt, PF(NV), 0, NG_LN(NV), ow))
        if (elem == FASTLN_F16) redo = HGROUP(FASTLN_F16, 0);
        else if (!bf16i) redo = HGROUP(FASTLN_BF16, 0);
        else redo = HGROUP(FASTLN_BF16, 1);
#undef HGROUP
#undef PF
#undef NG_RMS
#undef NG_LN
        for (int k = 0; redo && k < R; k++) {
            if (!((redo >> k) & 1)) continue;
            float *xf = add ? buf + k * H : buf;
            if (!add) widen_half(elem, xf, xr[k], H);
            if (rms) fastln_avx512_rms_row(yf, rs ? rs + k : NULL, xf, w, H, eps);
            else fastln_avx512_ln_row(yf, mn ? mn + k : NULL, rs ? rs + k : NULL, xf, w, b, H, eps);
            narrow_half(elem, yr[k], yf, H);
        }
        if (ow && redo) ntw_put_n(ow, (const float *)stage, R * H / 2);
    }
    if (ow) ntw_finish(ow);
    if (os) ntw_finish(os);
    if (stream) stream_fence();
}

/* fwd16h_nv for each (NV, OP) a function of its own (OP 0 LayerNorm, 1
 * RMSNorm, 2 add + LayerNorm), for float16, bfloat16 and bfloat16 by
 * VCVTNEPS2BF16, as the backward's bwd16_ functions: in one function for all
 * of them (the switch over NV and elem inside the loop over groups) GCC kept
 * the weights, the row pointers and the streaming flags on the stack. */
#define FWD16H_FN(NV, OP)                                                                       \
    static __attribute__((noinline)) void CAT3(fwd16h_, NV, OP)(                                \
        int elem, int bf16i, uint16_t *y, uint16_t *s, float *mean, float *rstd,                \
        const uint16_t *x,                                                                      \
        const uint16_t *res, const float *w, const float *b, int64_t r0, int64_t r1,            \
        int64_t H, double eps, int stream, float *buf)                                          \
    {                                                                                           \
        fwd16h_nv(NV, OP == 1, OP == 2, elem, bf16i, y, s, mean, rstd, x, res, w, b, r0, r1, H, \
                       eps, stream, buf);                                                       \
    }
#define FWD16H_FNS(NV) FWD16H_FN(NV, 0) FWD16H_FN(NV, 1) FWD16H_FN(NV, 2)
FOR_NVF16(FWD16H_FNS)
#undef FWD16H_FNS
#undef FWD16H_FN

/* The half-storage LayerNorm (rms 0), RMSNorm (rms 1) or, with res, add +
 * LayerNorm forward of rows [r0, r1), H <= FWD16_MAX_H, as fwd16h_nv */
void fastln_avx512_fwd_rows16_half(int rms, int elem, uint16_t *y, uint16_t *s, float *mean,
                                   float *rstd, const uint16_t *x, const uint16_t *res,
                                 const float *w, const float *b, int64_t r0, int64_t r1,
                                 int64_t H, double eps, int stream, float *buf)
{
    const int bf16i = bf16_insn_for(elem);
#define F(NV, OP) \
    CAT3(fwd16h_, NV, OP)(elem, bf16i, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, stream, buf)
    switch ((int)((H + 15) / 16) * 3 + (res ? 2 : rms ? 1 : 0)) {   /* rows of 1 to 16 vectors */
        FOR_NVF16(OP_CASES)
    }
#undef F
}

#include "isa/type_end.h"
#include "isa/end.h"
#endif
