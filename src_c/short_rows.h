/*
 * Short rows in float32 on AVX-512: sixteen rows at once (the forwards up
 * to FWD16_H, the backward up to SHORT16_H); and at the end, long rows'
 * forward in registers (long_rows).
 * Included by kernels_impl.h for (float, avx512) only.
 *
 * One row's vector is at most FWD16_H / 16 registers, so per-row
 * horizontal sums and scalar statistics would dominate. Here each row's sums
 * stay in one vector accumulator, a transposing reduction tree (reduce16)
 * turns sixteen of them into one vector holding the sixteen row sums, and
 * the statistics are computed for the sixteen rows in vector lanes. A group
 * short of sixteen rows repeats its last row in the spare lanes (their
 * results are dropped), so a row's arithmetic does not depend on its group:
 * results are bitwise the same for any split of the rows over threads.
 *
 * The statistics follow the row kernels of kernels_impl.h: shifted two-pass
 * forward (x - x0, then the centred squares), rstd in double, and for float
 * sums that may have lost the row (not finite, or a variance outside
 * [1e-30, 1e30]) the row is redone by the one-row code with its double
 * fallback.
 */
#include <float.h>

#define SHORT16_H 128
#if SHORT16_H != FASTLN_SHORT_BWD_H   /* the backward's streaming threshold follows it */
#error "SHORT16_H and FASTLN_SHORT_BWD_H differ"
#endif
#define NV16 (SHORT16_H / 16)   /* vectors in a row, at most */
/* The forwards go sixteen rows at a time up to rows of FWD16_H (2 threads,
 * 129-256 against four rows at a time in ln_rows: (4096, 160) 81 -> 57 us,
 * (16384, 200) 512 -> 290 us, streamed (65536, 256) 2.2-4.4 -> 1.8 ms;
 * RMSNorm against rms_rows or long_rows, (16384, 200) 324 -> 238 us,
 * streamed (131072, 160) 4.3 -> 3.5 ms, but (16384, 256) 3-30% slower;
 * add + LayerNorm: add_ln_range). The backward measured slower that way
 * past SHORT16_H. The 16-bit forwards take rows of up to 96 (RMSNorm:
 * 17-96) thirty-two at a time (fwd16h_nv). */
#define FWD16_H 256
#define NVF16 (FWD16_H / 16)
/* M(NV) for each row length of the sixteen-row forwards, 1 to NVF16 vectors */
#define FOR_NVF16(M)                                                                 \
    M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) M(16)
/* The forwards' switch over NV * 3 + op (op 0 LayerNorm, 1 RMSNorm, 2 add +
 * LayerNorm): the three cases of rows of NV vectors, each a call of the
 * F(NV, op) its user defines */
#define OP_CASES(NV)                   \
    case 3 * NV: F(NV, 0); break;     \
    case 3 * NV + 1: F(NV, 1); break; \
    case 3 * NV + 2: F(NV, 2); break;

/* reduce16's tree in three steps, for callers that sum their rows in order
 * and combine them as they come (fewer vectors live, the same bits):
 * red_pair: rows 2q, 2q+1 -> per 128-bit lane, even and odd halves;
 * red_quad: two pairs (rows 4r .. 4r+3) -> per 128-bit lane;
 * red_final: the four quads -> lane k the sum of row k. */
static inline __m512 SFX(red_pair)(__m512 s0, __m512 s1)
{
    return _mm512_add_ps(_mm512_unpacklo_ps(s0, s1), _mm512_unpackhi_ps(s0, s1));
}
static inline __m512 SFX(red_quad)(__m512 b0, __m512 b1)
{
    __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b0), _mm512_castps_pd(b1));
    __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b0), _mm512_castps_pd(b1));
    return _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
}
static inline __m512 SFX(red_final)(const __m512 *d)
{
    /* add the four 128-bit lanes of each d[r] and put them in lane r */
    __m512 e0 = _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 e1 = _mm512_add_ps(_mm512_shuffle_f32x4(d[2], d[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(d[2], d[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e0, e1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Lane k of the result = the sum of the 16 lanes of s[k]. */
static inline __m512 SFX(reduce16)(const __m512 *s)
{
    __m512 b[8], d[4];
    for (int q = 0; q < 8; q++) b[q] = SFX(red_pair)(s[2 * q], s[2 * q + 1]);
    for (int r = 0; r < 4; r++) d[r] = SFX(red_quad)(b[2 * r], b[2 * r + 1]);
    return SFX(red_final)(d);
}

/* f(a) lane by lane in double: the lanes of a widened, f applied to both halves, narrowed. */
#define IN_DOUBLE(a, f)                                                             \
    _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(f(_mm512_cvtps_pd(   \
                           _mm512_castps512_ps256(a))))),                           \
                       _mm512_cvtpd_ps(f(_mm512_cvtps_pd(_mm512_extractf32x8_ps(a, 1)))), 1)

/* The mask of the real rows among sixteen rows g of a group of R real rows */
static inline __mmask16 SFX(real16)(int R, int g)
{
    const int n = R <= 16 * g ? 0 : R - 16 * g >= 16 ? 16 : R - 16 * g;
    return (__mmask16)((1u << n) - 1);
}

/* The mask of the last vector of a row of H elements. */
static inline __mmask16 SFX(tail16)(int64_t H)
{
    return H % 16 ? (__mmask16)((1u << (H % 16)) - 1) : (__mmask16)0xFFFF;
}

/* w and b (NULL: ones, zeros) as nv vectors, the last one masked by tail */
static inline void SFX(load_wb16)(__m512 *wv, __m512 *bv, const float *w, const float *b,
                                  int nv, __mmask16 tail)
{
    for (int v = 0; v < nv; v++) {
        __mmask16 m = v == nv - 1 ? tail : (__mmask16)0xFFFF;
        wv[v] = w ? _mm512_maskz_loadu_ps(m, w + 16 * v) : _mm512_set1_ps(1.0f);
        bv[v] = b ? _mm512_maskz_loadu_ps(m, b + 16 * v) : _mm512_setzero_ps();
    }
}

/* Rows [n, n + 16) of x, the spare ones (from r1 on) repeating row r1 - 1. */
static inline void SFX(rows16)(const float **xr, const float *x, int64_t n, int64_t r1, int64_t H)
{
    for (int k = 0; k < 16; k++) xr[k] = x + (n + k < r1 ? n + k : r1 - 1) * H;
}

/* Prefetches into L1 the n bytes that start ahead bytes after p, short of
 * end: in the loops over groups of sixteen rows, the rows a few groups on,
 * and in long_bwd the part of the rows a few KiB on. The hardware
 * prefetchers fall behind both (AMD EPYC, 1 thread: (262144, 16) backward
 * 3.9 -> 2.0 ms, (262144, 32) forward 4.2 -> 1.7 ms). always_inline: GCC
 * drops a call to this function that it does not inline, since a prefetch
 * has no effect it can see. */
#define PF_GROUP_FWD 4096   /* bytes ahead: 2 KiB measured slower, 8 KiB the same; the
                             * 16-bit sixteen-row forward measured slower with it */
#define SPREAD_NV 3   /* fwd_rows16: rows of this many vectors prefetch a row at a time
                       * (rows of 1 or 2: slower; 16-bit rows: streamed ones) */
#define PF_RANGE_BYTES (4.0 * 1024 * 1024)   /* a thread's rows past this: the forward
                                              * prefetches its outputs too */
static inline __attribute__((always_inline)) void SFX(pf_ahead)(const void *p, int64_t n,
                                                                int64_t ahead, const void *end)
{
    const char *q = (const char *)p + ahead;
    const int64_t left = (const char *)end - q;
    for (int64_t o = 0; o < n && o < left; o += 64) _mm_prefetch(q + o, _MM_HINT_T0);
}

/* Prefetches into L1 the rb bytes of row k of the rows at pf */
static inline __attribute__((always_inline)) void SFX(pf_row)(const char *pf, int k, int64_t rb)
{
    for (int64_t o = 0; o < rb; o += 64) _mm_prefetch(pf + k * rb + o, _MM_HINT_T0);
}

/* Prefetches for writing (PREFETCHW) the rb bytes at p: an output row's
 * lines, fetched while the row's sums still run, instead of by its stores */
static inline __attribute__((always_inline)) void SFX(pfw_row)(const void *p, int64_t rb)
{
    for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_ET0);
}

/* Bytes of one stored value of kind: float (KIND_F32) or a 16-bit kind */
#define KIND_F32 0
static inline int64_t SFX(elsize)(int kind) { return kind ? 2 : 4; }

/* 16-bit loads and stores, converted in registers (kind FASTLN_F16 or
 * FASTLN_BF16, or KIND_BF16_INSN below) */
static inline __attribute__((always_inline)) __m512 SFX(ld_half)(
    int kind, const uint16_t *p, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (kind == FASTLN_F16) return _mm512_cvtph_ps(h);
    /* bfloat16 i into the high half of lane i, zeros below: one permute
     * (the zero-extend and shift it replaces are two instructions) */
    const __m512i idx = _mm512_slli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 16);
    return _mm512_castsi512_ps(
        _mm512_maskz_permutexvar_epi16(0xAAAAAAAA, idx, _mm512_zextsi256_si512(h)));
}

/* kind, or for bfloat16 on a CPU with AVX512-BF16, KIND_BF16_INSN: its
 * VCVTNEPS2BF16 rounds to nearest even in one instruction, but reads
 * subnormal inputs as 0 and flushes subnormal results, so a vector holding a
 * subnormal float takes the integer rounding (bf16_round512) instead. */
#define KIND_BF16_INSN 3

/* The kind the stores of this CPU use for kind */
static inline int SFX(store_kind)(int kind)
{
    return kind == FASTLN_BF16 && fastln_cpu_has_avx512bf16() ? KIND_BF16_INSN : kind;
}

static inline __attribute__((always_inline)) __m256i SFX(bf16_insn)(__m512 v)
{
    if (_mm512_fpclass_ps_mask(v, 0x20)) return bf16_round512(v);   /* 0x20: subnormal */
    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    IN_REGISTER(h);
    return h;
}

/* v as 16-bit values of kind */
static inline __attribute__((always_inline)) __m256i SFX(narrow16)(int kind, __m512 v)
{
    return kind == FASTLN_F16 ? f16_round512(v)
           : kind == KIND_BF16_INSN ? SFX(bf16_insn)(v) : bf16_round512(v);
}

/* a, b as 32 16-bit values of kind (a's first); bfloat16 on AVX512-BF16 in
 * one VCVTNE2PS2BF16 where neither holds a subnormal */
static inline __attribute__((always_inline)) __m512i SFX(narrow32)(int kind, __m512 a, __m512 b)
{
    if (kind == KIND_BF16_INSN && !(_mm512_fpclass_ps_mask(a, 0x20) |
                                    _mm512_fpclass_ps_mask(b, 0x20))) {
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        IN_REGISTER(h);
        return h;
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(SFX(narrow16)(kind, a)),
                              SFX(narrow16)(kind, b), 1);
}

/* 16 values (lanes in m) to p; nt: a non-temporal store where p is aligned */
static inline __attribute__((always_inline)) void SFX(st_half)(
    int kind, uint16_t *p, __m512 v, __mmask16 m, int nt)
{
    __m256i h = SFX(narrow16)(kind, v);
    if (m != (__mmask16)0xFFFF) _mm256_mask_storeu_epi16(p, m, h);
    else if (nt && !((uintptr_t)p & 31)) _mm256_stream_si256((__m256i *)p, h);
    else _mm256_storeu_si256((__m256i *)p, h);
}

/* v / H lane by lane; for H a power of two the same bits as v * (1 / H),
 * which spares the divider */
static inline __attribute__((always_inline)) __m512 SFX(div_h16)(__m512 v, int64_t H)
{
    return !(H & (H - 1)) ? _mm512_mul_ps(v, _mm512_set1_ps(1.0f / (float)H))
                          : _mm512_div_ps(v, _mm512_set1_ps((float)H));
}

/* div_h16 in double lanes */
static inline __attribute__((always_inline)) __m512d SFX(div_hd)(__m512d v, int64_t H)
{
    return !(H & (H - 1)) ? _mm512_mul_pd(v, _mm512_set1_pd(1.0 / (double)H))
                          : _mm512_div_pd(v, _mm512_set1_pd((double)H));
}

/* 1 / sqrt(var + eps) lane by lane in double, rounded to float; *ok: the lanes
 * whose var lies in [1e-30, 1e30], where the float statistics hold */
static inline __attribute__((always_inline)) __m512 SFX(rstd16)(__m512 var, double eps,
                                                                __mmask16 *ok)
{
    *ok = _mm512_cmp_ps_mask(var, _mm512_set1_ps(1e-30f), _CMP_GE_OQ) &
          _mm512_cmp_ps_mask(var, _mm512_set1_ps(1e30f), _CMP_LE_OQ);
    __m512d e = _mm512_set1_pd(eps), one = _mm512_set1_pd(1.0);
#define RSTD(v) _mm512_div_pd(one, _mm512_sqrt_pd(_mm512_add_pd((v), e)))
    __m512 rv = IN_DOUBLE(var, RSTD);
#undef RSTD
    return rv;
}

/* ---- a float output streamed from registers ------------------------------
 * The rows [r0, r1) a sixteen-row kernel writes are one contiguous block of
 * its output. With rows of a multiple of 16 floats, ntw takes the block's
 * vectors in order and writes it with non-temporal stores of whole aligned
 * lines: a line is the end of one vector and the start of the next (one
 * vpermt2ps; NumPy's large arrays start 16 bytes into a line), and the
 * partial lines at the block's two ends get ordinary masked stores.
 * Against writing a group's rows to an L1 staging block and streaming that
 * out with stream_copy after the group, 2 threads, outputs 0 and 16 bytes
 * into a line, the medians of three same-process A/B runs each: LayerNorm
 * forward (65536, 128) 1.05-1.15x, (65536, 256) 1.02-1.06x, (262144, 64)
 * 0.96-1.05x; RMSNorm 1.03-1.13x; backward (262144, 64) 1.04-1.10x,
 * (65536, 128) 1.06-1.17x. Rows of 32 measured 0.94-1.16x, rows of 16 up
 * to 1.07x forward but 0.79-0.98x backward: the writer's work per vector
 * weighs more there. Those rows, and rows of other lengths, keep the
 * staging block. The 16-bit forwards put pairs of narrowed vectors (32
 * values, one line's worth) as the floats of a vector (fwd16h_nv). */
typedef struct {
    float *p;          /* the next aligned line (the block's start + f0 until the first put) */
    __m512 carry;      /* the last vector put */
    __m512i idx;       /* lanes f0.. of carry, then lanes ..f0 - 1 of the next vector */
    int f0;            /* floats of the block before its first aligned line */
    int started;
} SFX(ntw);

/* Whether ntw writes a block of rows of H floats at dst: floats aligned as
 * floats, rows of 4 or more whole vectors */
static inline int SFX(ntw_ok)(const float *dst, int64_t H)
{
    return H % 16 == 0 && H >= 64 && !((uintptr_t)dst & 3);
}

/* Whether ntw writes a block of 16-bit rows of H values at dst, taken as
 * floats (two values each): rows of an even number of whole vectors, dst
 * aligned as floats */
static inline int SFX(ntw_ok16)(const uint16_t *dst, int64_t H)
{
    return H % 32 == 0 && !((uintptr_t)dst & 3);
}

static inline void SFX(ntw_init)(SFX(ntw) *w, float *dst)
{
    w->f0 = (int)((-(uintptr_t)dst >> 2) & 15);
    w->p = dst + w->f0;
    w->carry = _mm512_setzero_ps();
    w->idx = _mm512_add_epi32(_mm512_set1_epi32(w->f0),
                              _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                14, 15));
    w->started = 0;
}

/* The block's next 16 floats */
static inline __attribute__((always_inline)) void SFX(ntw_put)(SFX(ntw) *w, __m512 u)
{
    if (!w->f0) {   /* the block starts a line: the vectors are its lines */
        _mm512_stream_ps(w->p, u);
        w->p += 16;
    } else if (w->started) {
        _mm512_stream_ps(w->p, _mm512_permutex2var_ps(w->carry, w->idx, u));
        w->p += 16;
    } else {   /* the head: the first f0 floats */
        _mm512_mask_storeu_ps(w->p - w->f0, (__mmask16)((1u << w->f0) - 1), u);
        w->started = 1;
    }
    w->carry = u;
}

/* The n floats at src (n a multiple of 16), put */
static inline void SFX(ntw_put_n)(SFX(ntw) *w, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) SFX(ntw_put)(w, _mm512_loadu_ps(src + i));
}

/* The tail: the last vector's floats from f0 on (none when nothing was put
 * or f0 is 0). The caller fences the streaming stores (stream_fence). */
static inline void SFX(ntw_finish)(SFX(ntw) *w)
{
    if (w->started)
        _mm512_mask_storeu_ps(w->p - w->f0, (__mmask16)~((1u << w->f0) - 1), w->carry);
}

/* In the group kernels below (KIND, YK, NV, tail, xr, yr, nt theirs): the
 * mask of vector v of a row, vector v of row k (float, or 16-bit values of
 * KIND widened), and y to vector v of row k (float, or 16-bit values of YK;
 * nt as st_half). */
#define MASK(v) ((v) == NV - 1 ? tail : (__mmask16)0xFFFF)
#define LD(k, v) (KIND ? SFX(ld_half)(KIND, (const uint16_t *)xr[k] + 16 * (v), MASK(v))    \
                       : _mm512_maskz_loadu_ps(MASK(v), (const float *)xr[k] + 16 * (v)))
#define ST(k, v, y)                                                                       \
    do {                                                                                  \
        if (YK) SFX(st_half)(YK, (uint16_t *)yr[k] + 16 * (v), (y), MASK(v), nt);         \
        else _mm512_mask_storeu_ps((float *)yr[k] + 16 * (v), MASK(v), (y));             \
    } while (0)
/* y to vector v of row k, or with put to the writer wl (the group kernel's
 * copy of ow: a local the streaming stores cannot alias stays in registers) */
#define PUT_OR_ST(k, v, y)                                                                \
    do {                                                                                  \
        if (put) SFX(ntw_put)(&wl, (y));                                                  \
        else ST(k, v, (y));                                                               \
    } while (0)
/* Vectors v and v + 1 of a 16-bit y row, narrowed together and put to wl as
 * one line's worth. The group kernels do this in a sweep of its own: with
 * the float rows' loop taking it too, GCC unrolled neither loop (bfloat16
 * (262144, 64) 0.8x, float32 3-8% slower). */
#define PUT16(a, b) SFX(ntw_put)(&wl, _mm512_castsi512_ps(SFX(narrow32)(YK, (a), (b))))
/* One group of 16 * NG rows (R of them real; NG 1 or 2) of the LayerNorm
 * forward, rows of NV vectors (NV and NG constants after inlining: the loops
 * unroll, w and b stay in registers). Each sixteen rows' sums reduce on their
 * own (reduce16), and rows are the same bits whatever NG. Rows of float,
 * or with KIND (a constant too) of 16-bit values converted in registers; y
 * rows likewise of float or, with YK (a constant), 16-bit (nt: non-temporal
 * stores where aligned). pf: NULL, or rows (of x's storage) to prefetch, one
 * with each row of the first sweep (rows of more than 8 vectors: of the
 * second; 2 threads, (65536, 256) streamed 2.9 -> 2.7 ms, (16384, 256) 548
 * -> 504 us). pfw: the y rows are
 * prefetched for writing, one with each row of the second sweep (float;
 * (16384, 256) 462 -> 419 us; in cache, (4096, 256), 68 -> 84 us).
 * ow: NULL, or the writer of y's rows (float rows of whole vectors, or 16-bit
 * rows of an even number): the rows go to it when all of them are finished
 * (nothing to redo), else to yr.
 * Returns the mask of the rows it did not finish: their float statistics are
 * suspect, and the caller redoes them with the one-row code. */
static inline __attribute__((always_inline)) uint32_t SFX(ln_group16)(
    void *const *yr, float *mean, float *rstd, const void *const *xr, const __m512 *wv,
    const __m512 *bv, int R, int NV, int64_t H, __mmask16 tail, double eps, int KIND, int YK,
    int nt, const char *pf, int pfw, int NG, SFX(ntw) *ow)
{
#define X0(k) (!KIND ? ((const float *)xr[k])[0]                                           \
               : KIND == FASTLN_F16 ? f16_to_f32(((const uint16_t *)xr[k])[0])            \
                                    : bf16_to_f32(((const uint16_t *)xr[k])[0]))
    float sh[32] __attribute__((aligned(64))), dm[32] __attribute__((aligned(64)));
    float r[32] __attribute__((aligned(64)));
    /* 16-bit rows: widened once, by the first sweep, for the other two */
    float xw[KIND ? 16 * 16 * NG * NV : 1] __attribute__((aligned(64)));
#define LDW(k, v) (KIND ? _mm512_load_ps(xw + 16 * ((k) * NV + (v))) : LD(k, v))
    const char *pf1 = NV <= 8 ? pf : NULL, *pf2 = NV <= 8 ? NULL : pf;
    __m512 acc[32];
    for (int k = 0; k < 16 * NG; k++) {   /* sum(x - x0) */
        sh[k] = X0(k);
        __m512 s = _mm512_set1_ps(sh[k]), a = _mm512_setzero_ps();
        if (pf1) SFX(pf_row)(pf1, k, H * SFX(elsize)(KIND));
        for (int v = 0; v < NV; v++) {
            __m512 xv = LD(k, v);
            if (KIND) _mm512_store_ps(xw + 16 * (k * NV + v), xv);
            a = _mm512_add_ps(a, _mm512_maskz_sub_ps(MASK(v), xv, s));
        }
        acc[k] = a;
    }
    __m512 s1[2], dmv[2];
    for (int g = 0; g < NG; g++) {
        s1[g] = SFX(reduce16)(acc + 16 * g);
        dmv[g] = SFX(div_h16)(s1[g], H);
        _mm512_store_ps(dm + 16 * g, dmv[g]);
    }
    for (int k = 0; k < 16 * NG; k++) {   /* sum((x - x0 - dm)^2) */
        __m512 s = _mm512_set1_ps(sh[k]), d = _mm512_set1_ps(dm[k]), a = _mm512_setzero_ps();
        if (pf2) SFX(pf_row)(pf2, k, H * SFX(elsize)(KIND));
        if (pfw && k < R) SFX(pfw_row)(yr[k], H * 4);
        for (int v = 0; v < NV; v++) {
            __m512 c = _mm512_maskz_sub_ps(MASK(v), _mm512_maskz_sub_ps(MASK(v), LDW(k, v), s), d);
            a = _mm512_fmadd_ps(c, c, a);
        }
        acc[k] = a;
    }
    uint32_t ok = 0;   /* bit k: row k's float statistics hold */
    for (int g = 0; g < NG; g++) {
        __mmask16 okg;
        __m512 rv = SFX(rstd16)(SFX(div_h16)(SFX(reduce16)(acc + 16 * g), H), eps, &okg);
        okg &= _mm512_cmp_ps_mask(_mm512_abs_ps(s1[g]), _mm512_set1_ps(FLT_MAX), _CMP_LE_OQ);
        _mm512_store_ps(r + 16 * g, rv);
        const __mmask16 done = okg & SFX(real16)(R, g);
        if (mean) {   /* x0 + dm, rounded once */
            __m512 shv = _mm512_load_ps(sh + 16 * g);
            __m512d lo = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(shv)),
                                       _mm512_cvtps_pd(_mm512_castps512_ps256(dmv[g])));
            __m512d hi = _mm512_add_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(shv, 1)),
                                       _mm512_cvtps_pd(_mm512_extractf32x8_ps(dmv[g], 1)));
            _mm512_mask_storeu_ps(mean + 16 * g, done, _mm512_insertf32x8(
                _mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1));
        }
        if (rstd) _mm512_mask_storeu_ps(rstd + 16 * g, done, rv);
        ok |= (uint32_t)okg << (16 * g);
    }
    const uint32_t redo = ~ok & (uint32_t)((1ull << R) - 1);
    const int put = ow && !redo;
    SFX(ntw) wl;
    if (put) wl = *ow;
#define Y(v) _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(LDW(k, v), s), d), rk), \
                             wv[v], bv[v])
    if (YK && put) {   /* 16-bit rows to the writer (put: every row is finished) */
        for (int k = 0; k < R; k++) {
            __m512 s = _mm512_set1_ps(sh[k]), d = _mm512_set1_ps(dm[k]), rk = _mm512_set1_ps(r[k]);
            for (int v = 0; v + 1 < NV; v += 2) PUT16(Y(v), Y(v + 1));
        }
    } else
    for (int k = 0; k < R; k++) {   /* y = (x - x0 - dm) * r * w + b */
        if (!((ok >> k) & 1)) continue;
        __m512 s = _mm512_set1_ps(sh[k]), d = _mm512_set1_ps(dm[k]), rk = _mm512_set1_ps(r[k]);
        for (int v = 0; v < NV; v++) {
            __m512 c = _mm512_sub_ps(_mm512_sub_ps(LDW(k, v), s), d);
            PUT_OR_ST(k, v, _mm512_fmadd_ps(_mm512_mul_ps(c, rk), wv[v], bv[v]));
        }
    }
#undef Y
    if (put) *ow = wl;
#undef LDW
#undef X0
    return redo;
}

/* RMSNorm forward of one group of 16 * NG rows (R real; NG 1 or 2), rows of
 * NV vectors (NV and NG constants), as rms_rows computes it: r = 1 /
 * sqrt(mean(x^2) + eps) in double from the float mean square, y = x * r * w. Each row's squares add
 * in one vector, reduce16 adds the sixteen rows'; wv holds ones where there
 * is no weight (x * r * 1 is x * r); KIND and nt as ln_group16 (16-bit
 * rows are read twice, converted each time); pf (each NV) and pfw as
 * ln_group16, in the first sweep (pfw: (16384, 256) 404 -> 348 us). Returns
 * the mask of the rows whose mean square lies outside [1e-30, 1e30] (or is
 * not finite), which the caller redoes with rms_rows and its double
 * fallback. */
static inline __attribute__((always_inline)) uint32_t SFX(rms_group16)(
    void *const *yr, float *rstd, const void *const *xr, const __m512 *wv, int R, int NV,
    int64_t H, __mmask16 tail, double eps, int KIND, int nt, const char *pf, int pfw, int NG,
    SFX(ntw) *ow)
{
    const int YK = KIND;   /* y of the same storage as x */
    float r[32] __attribute__((aligned(64)));
    __m512 acc[32];
    for (int k = 0; k < 16 * NG; k++) {
        __m512 a = _mm512_setzero_ps();
        if (pf) SFX(pf_row)(pf, k, H * SFX(elsize)(KIND));
        if (pfw && k < R) SFX(pfw_row)(yr[k], H * 4);
        for (int v = 0; v < NV; v++) {
            __m512 xv = LD(k, v);
            a = _mm512_fmadd_ps(xv, xv, a);
        }
        acc[k] = a;
    }
    uint32_t ok = 0;   /* bit k: row k's mean square is in range */
    for (int g = 0; g < NG; g++) {
        __mmask16 okg;
        __m512 rv = SFX(rstd16)(SFX(div_h16)(SFX(reduce16)(acc + 16 * g), H), eps, &okg);
        _mm512_store_ps(r + 16 * g, rv);
        if (rstd) _mm512_mask_storeu_ps(rstd + 16 * g, okg & SFX(real16)(R, g), rv);
        ok |= (uint32_t)okg << (16 * g);
    }
    const uint32_t redo = ~ok & (uint32_t)((1ull << R) - 1);
    const int put = ow && !redo;
    SFX(ntw) wl;
    if (put) wl = *ow;
#define Y(v) _mm512_mul_ps(_mm512_mul_ps(LD(k, v), rk), wv[v])
    if (YK && put) {   /* as ln_group16 */
        for (int k = 0; k < R; k++) {
            __m512 rk = _mm512_set1_ps(r[k]);
            for (int v = 0; v + 1 < NV; v += 2) PUT16(Y(v), Y(v + 1));
        }
    } else
    for (int k = 0; k < R; k++) {
        if (!((ok >> k) & 1)) continue;
        __m512 rk = _mm512_set1_ps(r[k]);
        for (int v = 0; v < NV; v++) PUT_OR_ST(k, v, _mm512_mul_ps(_mm512_mul_ps(LD(k, v), rk), wv[v]));
    }
#undef Y
    if (put) *ow = wl;
    return redo;
}
#undef PUT16
#undef PUT_OR_ST
#undef ST
#undef LD
#undef MASK

/* s = x + res over n elements; with pf, prefetching x and res n elements on */
static void SFX(add16)(float *s, const float *x, const float *res, int64_t n, int pf)
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
 * [r0, r1), H <= FWD16_H, sixteen at a time (short rows 32, see NG
 * below); rows the group kernel leaves
 * go through the one-row code (ln_rows, rms_rows). With res (LayerNorm
 * only), add + LayerNorm: a group's s = x + res is stored first, then its
 * LayerNorm is that of s (the bits of this LayerNorm on x + res). With
 * stream, y goes through an ntw writer where it can (a group with rows to
 * redo is staged, redone there, and put after); other rows, and
 * s, are written to staging blocks and streamed out a group at a time. */
static inline __attribute__((always_inline)) void SFX(fwd16_nv)(
    int NV, int rms, int add, float *y, float *s, float *mean, float *rstd, const float *x,
    const float *res, const float *w, const float *b, int64_t r0, int64_t r1, int64_t H,
    double eps, int stream)
{
    const __mmask16 tail = SFX(tail16)(H);
    __m512 wv[NVF16], bv[NVF16];
    SFX(load_wb16)(wv, bv, w, rms ? NULL : b, NV, tail);
    /* y's staging block starts 2 KiB into its array: at its start, RMSNorm
     * (524288, 32) measured 8% slower on 2 threads (4K aliasing between its
     * stores and the loads of the frame's other locals, probably) */
    float stage_[16 * FWD16_H + 512], sstage[16 * FWD16_H];
    float *const stage = stage_ + 512;
    /* y prefetched for writing, rows of more than 8 vectors (group kernels) */
    const int pfw = !stream && !add && NV > 8 && (double)(r1 - r0) * H * 4 > PF_RANGE_BYTES;
    SFX(ntw) w_;
    SFX(ntw) *const ow = stream && SFX(ntw_ok)(y, H) ? &w_ : NULL;
    if (ow) SFX(ntw_init)(ow, y + r0 * H);
    /* LayerNorm and RMSNorm rows of one vector, and of two not streamed, go 32
     * at a time (NG 2 groups of 16, as fwd16h_nv): the two groups'
     * latency chains (reductions, rstd) overlap. Same-process A/B against 16
     * at a time, LayerNorm and RMSNorm: 2 threads (16384, 16) 1.20x and
     * 1.29x, (262144, 16) 1.14x and 1.18x, (16384, 32) 1.18x and 1.12x,
     * (65536, 32) 1.16-1.31x and 1.01-1.17x, (100000, 32) 1.17x and 1.13x;
     * 1 thread 1.03-1.32x, but (65536, 32) 0.98x. Streamed rows of two
     * measured 0.90-1.06x ((524288, 32)), rows of 3-4 vectors 0.89-1.18x,
     * add + LayerNorm at 16 and 32 0.85-1.13x. */
    const int NG = !add && (NV == 1 || (NV == 2 && !stream)) ? 2 : 1, G = 16 * NG;
    for (int64_t n = r0; n < r1; n += G) {
        int R = r1 - n < G ? (int)(r1 - n) : G;
        const float *xr[32];
        float *yr[32];
        if (add) {
            float *sg = stream ? sstage : s + n * H;
            SFX(add16)(sg, x + n * H, res + n * H, R * H, n + 32 <= r1);
            SFX(rows16)(xr, sg, 0, R, H);
        } else {
            SFX(rows16)(xr, x, n, r1, H);
            if (NG == 2) SFX(rows16)(xr + 16, x, n + 16, r1, H);
        }
        for (int k = 0; k < G; k++) yr[k] = stream ? stage + k * H : y + (n + k) * H;
        float *mn = mean && !rms ? mean + n : NULL, *rs = rstd ? rstd + n : NULL;
        /* Prefetch. LayerNorm and RMSNorm rows of SPREAD_NV vectors or more:
         * the group kernel's first sweep fetches the next group's row k with
         * its row k (2 threads, (262144, 64) 2.8 -> 2.4 ms, (131072, 128) 3.2
         * -> 2.8 ms; RMSNorm 2.4 -> 2.2, 2.8 -> 2.5). Shorter rows and add +
         * LayerNorm: PF_GROUP_FWD bytes of x ahead at once, except LayerNorm
         * rows of 16 (5-8% slower in cache with it, no faster past it;
         * RMSNorm's (262144, 16) 2.2 -> 0.95 ms on 1 thread). add16 also
         * fetches the next group's x and res line by line (2 threads (262144,
         * 64) 4.8 -> 3.7 ms, (1048576, 16) 5.0 -> 4.2 ms; 1 thread 8.2 -> 7.2,
         * 9.5 -> 8.5 ms; slower without the burst). */
        const int spread = !add && NV >= SPREAD_NV;
        if (!spread && (NV > 1 || rms))
            SFX(pf_ahead)(x + n * H, G * H * 4, PF_GROUP_FWD, x + r1 * H);
        /* the next group, for the group kernel with rows of NV vectors: a
         * constant NULL where NV < SPREAD_NV (a NULL known only at run time
         * made LayerNorm rows of 16 3% slower); groups of sixteen only */
#define PF(NV) (NV >= SPREAD_NV && spread && n + 32 <= r1 ? (const char *)(x + (n + 16) * H) : NULL)
        uint32_t redo;
        if (NV <= 2 && NG == 2)
            redo = rms ? SFX(rms_group16)((void *const *)yr, rs, (const void *const *)xr, wv, R, NV,
                                          H, tail, eps, 0, 0, NULL, 0, 2, ow)
                       : SFX(ln_group16)((void *const *)yr, mn, rs, (const void *const *)xr, wv,
                                         bv, R, NV, H, tail, eps, 0, 0, 0, NULL, 0, 2, ow);
        else
            redo = rms ? SFX(rms_group16)((void *const *)yr, rs, (const void *const *)xr, wv, R, NV,
                                          H, tail, eps, 0, 0, PF(NV), NV > 8 && pfw, 1, ow)
                       : SFX(ln_group16)((void *const *)yr, mn, rs, (const void *const *)xr, wv,
                                         bv, R, NV, H, tail, eps, 0, 0, 0, PF(NV), NV > 8 && pfw,
                                         1, ow);
#undef PF
        for (int k = 0; redo && k < R; k++) {
            if (!((redo >> k) & 1)) continue;
            if (rms) SFX(rms_rows)(yr[k], rs ? rs + k : NULL, xr[k], w, 0, 1, H, eps, NULL);
            else SFX(ln_rows)(yr[k], mn ? mn + k : NULL, rs ? rs + k : NULL, xr[k], w, b, 0, 1, H,
                              eps, NULL);
        }
        if (stream && add) stream_copy(s + n * H, sstage, (size_t)(R * H) * sizeof(float));
        if (ow && redo) SFX(ntw_put_n)(ow, stage, R * H);   /* staged: the group's rows */
        else if (stream && !ow) stream_copy(y + n * H, stage, (size_t)(R * H) * sizeof(float));
    }
    if (ow) SFX(ntw_finish)(ow);
    if (stream) stream_fence();
}


/* fwd16_nv for each (NV, OP) a function of its own (OP 0 LayerNorm, 1
 * RMSNorm, 2 add + LayerNorm), as fwd16h_ and the backward's bwd16_; rows of
 * one and two vectors hold their groups of 32 too (once a function of their
 * own, group32, so that kernels_avx512.c compiled in reasonable time) */
#define FWD16_FN(NV, OP)                                                                   \
    static __attribute__((noinline)) void SFX(CAT3(fwd16_, NV, OP))(                       \
        float *y, float *s, float *mean, float *rstd, const float *x, const float *res,    \
        const float *w, const float *b, int64_t r0, int64_t r1, int64_t H, double eps,     \
        int stream)                                                                        \
    {                                                                                      \
        SFX(fwd16_nv)(NV, OP == 1, OP == 2, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, \
                      stream);                                                             \
    }
#define FWD16_FNS(NV) FWD16_FN(NV, 0) FWD16_FN(NV, 1) FWD16_FN(NV, 2)
FOR_NVF16(FWD16_FNS)
#undef FWD16_FNS
#undef FWD16_FN

/* The float32 LayerNorm (rms 0), RMSNorm (rms 1) or, with res, add +
 * LayerNorm forward of rows [r0, r1), H <= FWD16_H, as fwd16_nv */
static void SFX(fwd_rows16)(int rms, float *y, float *s, float *mean, float *rstd,
                            const float *x, const float *res, const float *w, const float *b,
                            int64_t r0, int64_t r1, int64_t H, double eps, int stream)
{
#define F(NV, OP) SFX(CAT3(fwd16_, NV, OP))(y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, stream)
    switch ((int)((H + 15) / 16) * 3 + (res ? 2 : rms ? 1 : 0)) {   /* rows of 1 to 16 vectors */
        FOR_NVF16(OP_CASES)
    }
#undef F
}

/* s = x + res over n 16-bit values of kind, in float into sf and rounded
 * into s (nt: non-temporal where aligned), or with os put to that writer;
 * with pf, prefetching x and res n values on (as add16) */
static inline __attribute__((always_inline)) void SFX(add16_half)(
    int kind, float *sf, uint16_t *s, const uint16_t *x, const uint16_t *res, int64_t n, int nt,
    int pf, SFX(ntw) *os)
{
    if (os) {   /* s to the writer os instead (n a multiple of 32), two vectors a put */
        SFX(ntw) wl = *os;
        for (int64_t i = 0; i < n; i += 32) {
            if (pf) {
                _mm_prefetch((const char *)(x + n + i), _MM_HINT_T0);
                _mm_prefetch((const char *)(res + n + i), _MM_HINT_T0);
            }
            const __mmask16 m = (__mmask16)0xFFFF;
            __m512 a = _mm512_add_ps(SFX(ld_half)(kind, x + i, m), SFX(ld_half)(kind, res + i, m));
            __m512 b = _mm512_add_ps(SFX(ld_half)(kind, x + i + 16, m),
                                     SFX(ld_half)(kind, res + i + 16, m));
            _mm512_storeu_ps(sf + i, a);
            _mm512_storeu_ps(sf + i + 16, b);
            SFX(ntw_put)(&wl, _mm512_castsi512_ps(SFX(narrow32)(kind, a, b)));
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
        __m512 v = _mm512_add_ps(SFX(ld_half)(kind, x + i, m), SFX(ld_half)(kind, res + i, m));
        _mm512_mask_storeu_ps(sf + i, m, v);
        SFX(st_half)(kind, s + i, v, m, nt);
    }
}

/* fwd_rows16's LayerNorm, or with rms RMSNorm (mean and b unused), or with
 * res add + LayerNorm (into y and s), on rows of 16-bit values of kind,
 * converted in registers: the float32 arithmetic of fwd_rows16 exactly (a
 * group's s = x + res in float into buf, rounded into s, and the LayerNorm
 * of the float s; bfloat16 on 2 threads, against the widened blocks below
 * 128 and long_rows above: (262144, 64) 5.7 -> 3.2 ms, (4096, 200) 159 ->
 * 145 us, (131072, 160) 5.6 -> 4.3 ms, (65536, 256) 3.5-4.2 -> 3.8-4.1 ms,
 * (16384, 256) 673-683 -> 678-764 us). buf: 17H floats; stream:
 * non-temporal stores (fenced here). rms and add (res != NULL) are
 * constants. */
static inline __attribute__((always_inline)) void SFX(fwd16h_nv)(
    int NV, int rms, int add, int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
    const uint16_t *x, const uint16_t *res, const float *w, const float *b, int64_t r0,
    int64_t r1, int64_t H, double eps, int stream, float *buf)
{
    const __mmask16 tail = SFX(tail16)(H);
    __m512 wv[NVF16], bv[NVF16];
    SFX(load_wb16)(wv, bv, w, rms ? NULL : b, NV, tail);
    if (rms) mean = NULL;
    float *const yf = buf + 16 * H;   /* y of a row that takes the one-row code */
    /* Streamed rows of an even number of vectors go through ntw writers, y's
     * and (add + LayerNorm) s's; a group with rows to redo is staged, then put.
     * NumPy's large arrays start 16 bytes into a line, where st_half's
     * 32-byte streaming stores never apply: y was written by ordinary stores.
     * Same-process A/B, 2 threads, y 16 bytes into a line: bfloat16
     * (262144, 64) 1.17-1.32x, (131072, 128) 1.34-1.36x, (65536, 256)
     * 1.40-1.43x, (524288, 32) 1.22-1.23x; float16 (262144, 64) 1.20-1.30x,
     * (65536, 256) 1.46-1.54x; 1 thread 1.12-1.48x; bfloat16 add + LayerNorm
     * (262144, 64) 1.36-1.61x, (131072, 128) 1.45-1.49x, (65536, 256)
     * 1.29-1.58x. With the outputs on a line (st_half streaming) 0.95-1.15x. */
    SFX(ntw) w_, ws_;
    SFX(ntw) *const ow = stream && SFX(ntw_ok16)(y, H) ? &w_ : NULL;
    SFX(ntw) *const os = stream && add && SFX(ntw_ok16)(s, H) ? &ws_ : NULL;   /* s's */
    uint16_t stage[16 * FWD16_H] __attribute__((aligned(64)));   /* G * H at most */
    const int nt = stream && !ow;
    if (ow) SFX(ntw_init)(ow, (float *)(y + r0 * H));
    if (os) SFX(ntw_init)(os, (float *)(s + r0 * H));
    const int pf_on = (double)(r1 - r0) * H * 2 > PF_RANGE_BYTES;
    /* Rows go 32 at a time (NG 2 groups of 16) where that measured faster:
     * the two groups' reductions and rstd, latency chains between the
     * sweeps, overlap. bfloat16, 2 threads: LayerNorm (262144, 64) 1.53 ->
     * 1.35 ms, (1048576, 16) 2.92 -> 2.50 ms, (16384, 16) 40 -> 31 us,
     * (16384, 128) 147 -> 134 us, but streamed (131072, 128) 1.44 -> 1.64
     * ms; RMSNorm (524288, 32) 1.52 -> 1.43 ms, (16384, 64) 69 -> 56 us,
     * but (1048576, 16) 2.1 -> 3.7 ms. The float forwards take 32 rows
     * only for rows of one vector, and of two where not streamed (fwd_rows16). */
#define NG_LN(NV) ((NV) <= 6 ? 2 : 1)
#define NG_RMS(NV) ((NV) >= 2 && (NV) <= 6 ? 2 : 1)
    const int NGR = add ? 1 : rms ? NG_RMS(NV) : NG_LN(NV), G = 16 * NGR;
    for (int64_t n = r0; n < r1; n += G) {
        int R = r1 - n < G ? (int)(r1 - n) : G;
        const uint16_t *xr[32];
        const float *sr[16];
        uint16_t *yr[32];
        if (add) {
            SFX(add16_half)(kind, buf, s + n * H, x + n * H, res + n * H, R * H, stream,
                            n + 32 <= r1, os);
            SFX(rows16)(sr, buf, 0, R, H);
        }
        for (int k = 0; k < G; k++) {
            xr[k] = x + (n + k < r1 ? n + k : r1 - 1) * H;
            yr[k] = ow ? stage + k * H : y + (n + k) * H;
        }
        float *mn = mean ? mean + n : NULL, *rs = rstd ? rstd + n : NULL;
        /* rows of more than 8 vectors prefetch the next group, as ln_group16
         * and rms_group16 do, where a thread's rows pass PF_RANGE_BYTES
         * (bfloat16, 2 threads: (65536, 256) 1.89 -> 1.57 ms, (131072, 160)
         * 2.00 -> 1.91 ms, RMSNorm 1.34 -> 1.21 ms, 1.83 -> 1.63 ms; 1 thread
         * 3.7 -> 3.1 ms; in cache 3-5% slower). Rows of SPREAD_NV to 8
         * vectors only where y is streamed (through the writer: bfloat16, 2
         * threads, (262144, 64) 1.03-1.08x, (131072, 128) 1.02-1.05x, 1.07-1.17x
         * where memory ran slow; (98304, 64), not streamed, 0.95x); shorter
         * rows measured slower with it (a constant NULL for them) */
        const char *pf = pf_on && n + 2 * G <= r1 ? (const char *)(x + (n + G) * H) : NULL;
#define PF(NV) (NV > 8 || (NV >= SPREAD_NV && stream) ? pf : NULL)
        uint32_t redo;
#define HGROUP(K)                                                                          \
    (add ? SFX(ln_group16)((void *const *)yr, mn, rs, (const void *const *)sr, wv, bv, R, NV, \
                           H, tail, eps, 0, K, nt, NULL, 0, 1, ow)                        \
     : rms ? SFX(rms_group16)((void *const *)yr, rs, (const void *const *)xr, wv, R, NV, H,  \
                              tail, eps, K, nt, PF(NV), 0, NG_RMS(NV), ow)                \
           : SFX(ln_group16)((void *const *)yr, mn, rs, (const void *const *)xr, wv, bv, R,  \
                             NV, H, tail, eps, K, K, nt, PF(NV), 0, NG_LN(NV), ow))
        if (kind == FASTLN_F16) redo = HGROUP(FASTLN_F16);
        else if (kind == FASTLN_BF16) redo = HGROUP(FASTLN_BF16);
        else redo = HGROUP(KIND_BF16_INSN);
#undef HGROUP
#undef PF
#undef NG_RMS
#undef NG_LN
        for (int k = 0; redo && k < R; k++) {
            if (!((redo >> k) & 1)) continue;
            float *xf = add ? buf + k * H : buf;
            if (!add) widen_half(kind, xf, xr[k], H);
            if (rms) SFX(rms_rows)(yf, rs ? rs + k : NULL, xf, w, 0, 1, H, eps, NULL);
            else SFX(ln_rows)(yf, mn ? mn + k : NULL, rs ? rs + k : NULL, xf, w, b, 0, 1, H, eps,
                              NULL);
            narrow_half(kind, yr[k], yf, H);
        }
        if (ow && redo) SFX(ntw_put_n)(ow, (const float *)stage, R * H / 2);
    }
    if (ow) SFX(ntw_finish)(ow);
    if (os) SFX(ntw_finish)(os);
    if (stream) stream_fence();
}

/* fwd16h_nv for each (NV, OP) a function of its own (OP 0 LayerNorm, 1
 * RMSNorm, 2 add + LayerNorm), for the three stored kinds, as the backward's
 * bwd16_ functions: one function for all of them (the switch over NV and
 * kind inside the loop over groups) kept the weights, the row pointers and
 * the streaming flags on the stack. */
#define FWD16H_FN(NV, OP)                                                                   \
    static __attribute__((noinline)) void SFX(CAT3(fwd16h_, NV, OP))(                       \
        int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd, const uint16_t *x,    \
        const uint16_t *res, const float *w, const float *b, int64_t r0, int64_t r1,        \
        int64_t H, double eps, int stream, float *buf)                                      \
    {                                                                                       \
        SFX(fwd16h_nv)(NV, OP == 1, OP == 2, kind, y, s, mean, rstd, x, res, w, b, r0, r1, H, \
                       eps, stream, buf);                                                   \
    }
#define FWD16H_FNS(NV) FWD16H_FN(NV, 0) FWD16H_FN(NV, 1) FWD16H_FN(NV, 2)
FOR_NVF16(FWD16H_FNS)
#undef FWD16H_FNS
#undef FWD16H_FN

/* The 16-bit LayerNorm (rms 0), RMSNorm (rms 1) or, with res, add +
 * LayerNorm forward of rows [r0, r1), H <= FWD16_H, as fwd16h_nv */
static void SFX(fwd_rows16_half)(int rms, int kind, uint16_t *y, uint16_t *s, float *mean,
                                 float *rstd, const uint16_t *x, const uint16_t *res,
                                 const float *w, const float *b, int64_t r0, int64_t r1,
                                 int64_t H, double eps, int stream, float *buf)
{
    kind = SFX(store_kind)(kind);
#define F(NV, OP) \
    SFX(CAT3(fwd16h_, NV, OP))(kind, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, stream, buf)
    switch ((int)((H + 15) / 16) * 3 + (res ? 2 : rms ? 1 : 0)) {   /* rows of 1 to 16 vectors */
        FOR_NVF16(OP_CASES)
    }
#undef F
}

/* ln_bwd_scalars (LN) or rms_bwd_scalars of a row of 16-bit values of
 * kind, widened (a row whose float sums overflowed; a function of its own, so
 * that its buffers stay out of the group kernels' frames) */
static SFX(bwd_scalars) SFX(bwd_scalars16)(int kind, const void *x, const void *g, const float *w,
                                           float m, float r, int64_t H, int LN)
{
    float xf[SHORT16_H], gf[SHORT16_H];
    const int wk = kind == FASTLN_F16 ? FASTLN_F16 : FASTLN_BF16;
    widen_half(wk, xf, (const uint16_t *)x, H);
    widen_half(wk, gf, (const uint16_t *)g, H);
    return LN ? SFX(ln_bwd_scalars)(xf, gf, w, m, r, H) : SFX(rms_bwd_scalars)(xf, gf, w, r, H);
}

/* Rows [n, n + 16) of the rows at p (rowb bytes each, r1 of them) for
 * bwd_group16, which takes sixteen rows one after another: where all are
 * real, in place; else copied to tile, the spare rows (from r1 on)
 * repeating row r1 - 1. It replaced arrays of sixteen row pointers, which
 * the caller built and the group kernel loaded back from the stack (with the
 * per-(NV, LN) functions below, against them: float (16384, 16) 1.34-1.50x,
 * (16384, 32) 1.14-1.18x, (16384, 64) 1.00-1.07x, (16384, 128) 1.08-1.12x,
 * 2 threads). */
static inline const void *SFX(group_rows16)(const void *p, int64_t n, int64_t r1, int64_t rowb,
                                            char *tile)
{
    const char *q = (const char *)p + n * rowb;
    if (n + 16 <= r1) return q;
    const int R = (int)(r1 - n);
    memcpy(tile, q, (size_t)(R * rowb));
    for (int k = R; k < 16; k++) memcpy(tile + k * rowb, q + (R - 1) * rowb, (size_t)rowb);
    return tile;
}

/* Backward of one group of 16 rows (R real), rows of NV vectors, LayerNorm
 * (LN = 1: sums of d = x - mean, g = dy*w and g*d) or RMSNorm (LN = 0: the
 * sum of g*x). Sweep 1 keeps each row's sums in vectors and reduces them with
 * reduce16; the scalars follow ln_bwd_scalars/rms_bwd_scalars in double
 * lanes, and a row whose float sums are not finite gets them from that
 * one-row code (its double fallback). Sweep 2 goes a row at a time, its
 * five scalars broadcast once, with the dweight/dbias partials pw, pb held
 * in registers: each column adds the rows in order, as bwd_sweep2 does.
 * The rows lie one after another, H values each: x0, g0 (x, dy) hold all
 * sixteen (group_rows16), dx0 the R real ones of dx. A row's dx is stored
 * after that row's loads (dx may be x or dy), to dx0 or with ow to that
 * writer. px, pg: NULL, or rows of x and dy to prefetch, one of each with
 * each row of sweep 1. */
static inline __attribute__((always_inline)) void SFX(bwd_group16)(
    void *dx0, float *pw, float *pb, const void *x0, const void *g0,
    const float *mean, const float *rstd, const float *w, int R, int NV, int LN, int64_t H,
    __mmask16 tail, const char *px, const char *pg, SFX(ntw) *ow, int KIND)
{
#define MASK(v) ((v) == NV - 1 ? tail : (__mmask16)0xFFFF)
#define ROW(p, k) ((const char *)(p) + (k) * rowb)
#define DXROW(k) ((char *)dx0 + (k) * rowb)
#define LDB(p, k, v) (KIND ? SFX(ld_half)(KIND, (const uint16_t *)ROW(p, k) + 16 * (v), MASK(v)) \
                           : _mm512_maskz_loadu_ps(MASK(v), (const float *)ROW(p, k) + 16 * (v)))
    const int64_t rowb = H * SFX(elsize)(KIND);
    float mt[16] __attribute__((aligned(64))), rt[16] __attribute__((aligned(64)));
    float dm[16] __attribute__((aligned(64))), c1[16] __attribute__((aligned(64)));
    float c2[16] __attribute__((aligned(64)));
    /* m, r: the rows' mean (0 for RMSNorm) and rstd, read where they lie;
     * a short group's copies repeat row R - 1. (r's vector load below, from
     * sixteen scalar stores, waited for them to leave the store queue.) */
    const float *m = mean, *r = rstd;
    if (R < 16 || !LN) {
        for (int k = 0; k < 16; k++) mt[k] = LN ? mean[k < R ? k : R - 1] : 0.0f;
        m = mt;
    }
    if (R < 16) {
        for (int k = 0; k < 16; k++) rt[k] = rstd[k < R ? k : R - 1];
        r = rt;
    }
    __m512 wv[NV16];
    for (int v = 0; v < NV; v++)
        wv[v] = w ? _mm512_maskz_loadu_ps(MASK(v), w + 16 * v)
                  : _mm512_maskz_mov_ps(MASK(v), _mm512_set1_ps(1.0f));
    /* Sweep 1, row k: its sums of d, g and g*d. Rows of several vectors
     * keep them (sd, sg, sgd[k]) for reduce16. Rows of one vector put them
     * into reduce16's tree as they come, the same bits: each pair of rows
     * (sd2.. [k & 1] -> bd..), then each four (-> qd..). With their loop
     * unrolled, all of it stays in registers, where the sixteen rows' 48
     * sums were spilled to the stack (A/B, (16384, 16): 1 thread 1.31x, 2
     * threads 1.14-1.24x; (262144, 16) 1.23x). For rows of 2-8 vectors the
     * pairwise form measured 0.86-0.96x, rolled, and 0.89-0.96x unrolled. */
    __m512 sd[16], sg[16], sgd[16];
    __m512 sd2[2], sg2[2], sgd2[2], bd[2], bg[2], bgd[2], qd[4], qg[4], qgd[4];
#define SWEEP1(k)                                                                  \
    do {                                                                           \
        __m512 mk = _mm512_set1_ps(m[k]), ad = _mm512_setzero_ps(), ag = ad, agd = ad; \
        if (px && NV == 1) {                                                       \
            _mm_prefetch(px + (k) * rowb, _MM_HINT_T0);                            \
            _mm_prefetch(pg + (k) * rowb, _MM_HINT_T0);                            \
        } else if (px) {                                                           \
            SFX(pf_row)(px, k, rowb);                                              \
            SFX(pf_row)(pg, k, rowb);                                              \
        }                                                                          \
        for (int v = 0; v < NV; v++) {                                             \
            __m512 xv = LDB(x0, k, v);                                             \
            __m512 g = _mm512_mul_ps(LDB(g0, k, v), wv[v]);                        \
            if (LN) {                                                              \
                __m512 d = _mm512_maskz_sub_ps(MASK(v), xv, mk);                   \
                ad = v ? _mm512_add_ps(ad, d) : d;                                 \
                ag = v ? _mm512_add_ps(ag, g) : g;                                 \
                agd = v ? _mm512_fmadd_ps(g, d, agd) : _mm512_mul_ps(g, d);        \
            } else {                                                               \
                agd = v ? _mm512_fmadd_ps(g, xv, agd) : _mm512_mul_ps(g, xv);      \
            }                                                                      \
        }                                                                          \
        if (NV > 1) {                                                              \
            sd[k] = ad;                                                            \
            sg[k] = ag;                                                            \
            sgd[k] = agd;                                                          \
        } else {                                                                   \
            sd2[(k) & 1] = ad;                                                     \
            sg2[(k) & 1] = ag;                                                     \
            sgd2[(k) & 1] = agd;                                                   \
        }                                                                          \
        if (NV == 1 && ((k) & 1)) {                                                \
            const int j_ = ((k) >> 1) & 1;                                         \
            bd[j_] = SFX(red_pair)(sd2[0], sd2[1]);                                \
            bg[j_] = SFX(red_pair)(sg2[0], sg2[1]);                                \
            bgd[j_] = SFX(red_pair)(sgd2[0], sgd2[1]);                             \
        }                                                                          \
        if (NV == 1 && ((k) & 3) == 3) {                                           \
            qd[(k) >> 2] = SFX(red_quad)(bd[0], bd[1]);                            \
            qg[(k) >> 2] = SFX(red_quad)(bg[0], bg[1]);                            \
            qgd[(k) >> 2] = SFX(red_quad)(bgd[0], bgd[1]);                         \
        }                                                                          \
    } while (0)
    /* Rows of one vector: the loop unrolled, a prefetch of x and dy each a
     * row. Same-process A/B against the loop, 2 threads: (16384, 16) 1.14x,
     * (262144, 16) 1.09x, (4096, 16) 1.15x, bfloat16 (262144, 16) 1.13x; 1
     * thread 1.07-1.17x. Unrolled for every row length, rows of 4-8 vectors
     * measured 0.92-1.00x. */
    if (NV == 1) {
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) SWEEP1(k);
    } else {
        for (int k = 0; k < 16; k++) SWEEP1(k);
    }
#undef SWEEP1
    /* + 0: a row's sums began at the first vector's values, not at 0 + them
     * (three adds fewer a row; (4096, 16) 1.03-1.09x). Such a sum differs
     * only where it is -0 and the other +0, and adding +0 makes it +0. */
    const __m512 z = _mm512_setzero_ps();
    __m512 S_gd = _mm512_add_ps(NV == 1 ? SFX(red_final)(qgd) : SFX(reduce16)(sgd), z);
    __m512 S_d = !LN ? z : _mm512_add_ps(NV == 1 ? SFX(red_final)(qd) : SFX(reduce16)(sd), z);
    __m512 S_g = !LN ? z : _mm512_add_ps(NV == 1 ? SFX(red_final)(qg) : SFX(reduce16)(sg), z);
    __m512 big = _mm512_set1_ps(FLT_MAX);
    __mmask16 ok = _mm512_cmp_ps_mask(_mm512_abs_ps(S_gd), big, _CMP_LE_OQ);
    if (LN)
        ok &= _mm512_cmp_ps_mask(_mm512_abs_ps(S_d), big, _CMP_LE_OQ) &
              _mm512_cmp_ps_mask(_mm512_abs_ps(S_g), big, _CMP_LE_OQ);
    /* the scalars in double lanes, eight rows at a time (for H a power of
     * two, multiplied by 1 / H: the same bits without the divider) */
    for (int h = 0; h < 2; h++) {
#define HALF(v) _mm512_cvtps_pd(h ? _mm512_extractf32x8_ps((v), 1) : _mm512_castps512_ps256(v))
        __m512d sd_ = HALF(S_d), sg_ = HALF(S_g), sgd_ = HALF(S_gd);
        __m512d rd = HALF(_mm512_loadu_ps(r));
#undef HALF
        __m512d dmd = SFX(div_hd)(sd_, H);
        __m512d c2d = SFX(div_hd)(_mm512_mul_pd(rd, _mm512_fnmadd_pd(dmd, sg_, sgd_)), H);
        _mm256_store_ps(dm + 8 * h, _mm512_cvtpd_ps(dmd));
        _mm256_store_ps(c1 + 8 * h, _mm512_cvtpd_ps(SFX(div_hd)(sg_, H)));
        _mm256_store_ps(c2 + 8 * h, _mm512_cvtpd_ps(c2d));
    }
    /* rows whose float sums overflowed: in double (a loop over their bits;
     * the loop over all rows testing each one's bit, with its counters on
     * the stack, took about 6% of the profile at H = 16) */
    for (uint32_t bad = ~(uint32_t)ok & ((1u << R) - 1); bad; bad &= bad - 1) {
        const int k = __builtin_ctz(bad);
        SFX(bwd_scalars) sc =
            KIND ? SFX(bwd_scalars16)(KIND, ROW(x0, k), ROW(g0, k), w, LN ? m[k] : 0.0f, r[k],
                                      H, LN)
            : LN ? SFX(ln_bwd_scalars)((const float *)ROW(x0, k), (const float *)ROW(g0, k), w,
                                       m[k], r[k], H)
                 : SFX(rms_bwd_scalars)((const float *)ROW(x0, k), (const float *)ROW(g0, k), w,
                                        r[k], H);
        dm[k] = sc.dm;
        c1[k] = sc.c1;
        c2[k] = sc.c2;
    }
    __m512 sw[NV16], sb[NV16];   /* sweep 2, a row at a time: its scalars broadcast once */
    SFX(ntw) wl;   /* ow's copy (see PUT_OR_ST) */
    if (ow) wl = *ow;
    for (int v = 0; v < NV; v++) {
        sw[v] = _mm512_maskz_loadu_ps(MASK(v), pw + 16 * v);
        sb[v] = LN ? _mm512_maskz_loadu_ps(MASK(v), pb + 16 * v) : sw[v];
    }
    /* the rows' loop, with dx to ow (W = 1) or stored: two loops, which GCC
     * had made of one only as long as the function stayed small */
#define SWEEP2(W)                                                                  \
    for (int k = 0; k < R; k++) {                                                  \
        const __m512 mk = _mm512_set1_ps(m[k]), dk = _mm512_set1_ps(dm[k]);        \
        const __m512 rk = _mm512_set1_ps(r[k]), c1k = _mm512_set1_ps(c1[k]);       \
        const __m512 c2k = _mm512_set1_ps(c2[k]);                                  \
        for (int v = 0; v < NV; v++) {                                             \
            __m512 xv = LDB(x0, k, v);                                             \
            __m512 g = LDB(g0, k, v);                                              \
            __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(xv, mk), dk), rk); \
            sw[v] = _mm512_fmadd_ps(g, xh, sw[v]);                                 \
            if (LN) sb[v] = _mm512_add_ps(sb[v], g);                               \
            __m512 t = _mm512_fmsub_ps(g, wv[v], c1k);                             \
            __m512 d = _mm512_mul_ps(rk, _mm512_fnmadd_ps(xh, c2k, t));            \
            if (W) SFX(ntw_put)(&wl, d);                                           \
            else if (KIND) SFX(st_half)(KIND, (uint16_t *)DXROW(k) + 16 * v, d, MASK(v), 0); \
            else _mm512_mask_storeu_ps((float *)DXROW(k) + 16 * v, MASK(v), d);    \
        }                                                                          \
    }
    if (ow) {
        SWEEP2(1)
    } else {
        SWEEP2(0)
    }
#undef SWEEP2
    for (int v = 0; v < NV; v++) {
        _mm512_mask_storeu_ps(pw + 16 * v, MASK(v), sw[v]);
        if (LN) _mm512_mask_storeu_ps(pb + 16 * v, MASK(v), sb[v]);
    }
    if (ow) *ow = wl;
#undef LDB
#undef ROW
#undef DXROW
#undef MASK
}

/* The backward over rows [r0, r1) of rows of NV vectors (pb == NULL:
 * RMSNorm), H <= SHORT16_H, sixteen rows at a time; rows of KIND (a
 * constant): float, or 16-bit converted in registers (dx rounded as st_half
 * does). It prefetches rows up to re (>= r1). Streamed: float dx through an
 * ntw writer where it can, else dx staged a group at a time; staged as
 * well, the last group of fewer than 16 rows (group_rows16). The 16-bit
 * rows, converted in registers, against widening blocks of 16 rows for the
 * float kernel, bfloat16, 2 threads: (262144, 64) 1.44-1.68x, (65536, 128)
 * 1.66x, (131072, 48) 1.86x, (262144, 16) 1.31x. Float once had a loop of
 * its own, this one measuring 6-8% slower on it; with the per-(NV, LN)
 * functions below, a float loop of its own measured 0.92-1.08x against this
 * one (median of twelve shapes 1.04x; 2 threads, rows of 16-128): within
 * the noise of these runs, so the kinds share one loop. */
static inline __attribute__((always_inline)) void SFX(bwd_rows16_nv)(
    int KIND, int NV, int LN, void *dx, float *pw, float *pb, const void *dy, const void *x,
    const float *mean, const float *rstd, const float *w, int64_t r0, int64_t r1, int64_t re,
    int64_t H, int stream)
{
    const __mmask16 tail = SFX(tail16)(H);
    const int64_t rowb = H * SFX(elsize)(KIND);
    float stage[16 * SHORT16_H] __attribute__((aligned(64)));
    float xt[16 * SHORT16_H] __attribute__((aligned(64)));
    float gt[16 * SHORT16_H] __attribute__((aligned(64)));
    SFX(ntw) w_;
    SFX(ntw) *const ow = !KIND && stream && SFX(ntw_ok)((float *)dx, H) ? &w_ : NULL;
    if (ow) SFX(ntw_init)(ow, (float *)dx + r0 * H);
    for (int64_t n = r0; n < r1; n += 16) {
        const int R = r1 - n < 16 ? (int)(r1 - n) : 16;
        const void *x0 = SFX(group_rows16)(x, n, r1, rowb, (char *)xt);
        const void *g0 = SFX(group_rows16)(dy, n, r1, rowb, (char *)gt);
        char *dxn = (char *)dx + n * rowb;
        void *dx0 = stream || R < 16 ? (void *)stage : (void *)dxn;
        /* prefetch the rows ahead, a row of x and dy with each row of sweep 1:
         * 16 rows and at least 512 values ahead (float, 1 thread, (262144,
         * 64) 8.0 -> 6.4 ms, (65536, 64) 1.6 -> 1.2 ms; 2 threads 4.6 -> 4.3
         * ms, 0.82 -> 0.64 ms; 8 or 24 rows ahead, or 4 KiB at H = 16,
         * slower. The former burst of 4 KiB a group, 2 KiB ahead, fell
         * behind.) Up to re, across the end of the caller's block of rows:
         * the last group of each block of 256 rows went without (2 threads,
         * (262144, 64) 0.98-1.09x, medians of eight A/B runs). */
        const int64_t ahead = 16 * H < 512 ? 512 : 16 * H;   /* values */
        const int64_t pfo = n * rowb + ahead * SFX(elsize)(KIND);
        const char *px = n + 16 + ahead / H <= re ? (const char *)x + pfo : NULL;
        const char *pg = px ? (const char *)dy + pfo : NULL;
        SFX(bwd_group16)(dx0, pw, pb, x0, g0, LN ? mean + n : NULL, rstd + n, w, R, NV, LN, H,
                         tail, px, pg, ow, KIND);
        if (stream && !ow) stream_copy(dxn, stage, (size_t)(R * rowb));
        else if (!stream && R < 16) memcpy(dxn, stage, (size_t)(R * rowb));
    }
    if (ow) SFX(ntw_finish)(ow);
    if (stream) stream_fence();
}

/* bwd_rows16_nv for each (NV, LN) a function of its own, for the three
 * kinds: float, float16, bfloat16. As one function a kind, with the switch
 * over (NV, LN) inside the loop over groups, GCC kept more of each
 * instance's pointers, the 16-bit loads and the streaming writer on the
 * stack: against it, float, 2 threads, (16384, 64) 1.05x, (16384, 96)
 * 1.17x, (16384, 128) 1.11x; bfloat16 (16384, 16) 1.27x against the one
 * function with the row pointers (the functions one a kind and (NV, LN):
 * 0.90-1.03x against these). kernels_avx512.c compiles faster too.
 * bfloat16 dx takes the integer rounding on every CPU: against VCVTNEPS2BF16
 * where the CPU has it (KIND_BF16_INSN, the same bits) it measured as fast
 * (same-process A/B, 2 threads: 1.00x at (262144, 64), 1.03-1.04x at
 * (65536, 128)), and the instruction's instances of bwd_group16 cost
 * compile time. */
#define BWD16_FN(NV, LN)                                                                    \
    static __attribute__((noinline)) void SFX(CAT3(bwd16_, NV, LN))(                        \
        int kind, void *dx, float *pw, float *pb, const void *dy, const void *x,            \
        const float *mean, const float *rstd, const float *w, int64_t r0, int64_t r1,       \
        int64_t re, int64_t H, int stream)                                                  \
    {                                                                                       \
        if (kind == KIND_F32)                                                               \
            SFX(bwd_rows16_nv)(KIND_F32, NV, LN, dx, pw, pb, dy, x, mean, rstd, w, r0, r1,   \
                               re, H, stream);                                              \
        else if (kind == FASTLN_F16)                                                        \
            SFX(bwd_rows16_nv)(FASTLN_F16, NV, LN, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, \
                               re, H, stream);                                              \
        else                                                                                \
            SFX(bwd_rows16_nv)(FASTLN_BF16, NV, LN, dx, pw, pb, dy, x, mean, rstd, w, r0,    \
                               r1, re, H, stream);                                          \
    }
#define BWD16_FNS(NV) BWD16_FN(NV, 0) BWD16_FN(NV, 1)
BWD16_FNS(1) BWD16_FNS(2) BWD16_FNS(3) BWD16_FNS(4)
BWD16_FNS(5) BWD16_FNS(6) BWD16_FNS(7) BWD16_FNS(8)
#undef BWD16_FNS
#undef BWD16_FN

/* The backward over rows [r0, r1) as bwd_rows (pb == NULL: RMSNorm), H <=
 * SHORT16_H, rows of kind: KIND_F32, FASTLN_F16 or FASTLN_BF16. */
static void SFX(bwd_rows16)(int kind, void *dx, float *pw, float *pb, const void *dy,
                            const void *x, const float *mean, const float *rstd, const float *w,
                            int64_t r0, int64_t r1, int64_t re, int64_t H, int stream)
{
#define G16(NV, LN) \
    SFX(CAT3(bwd16_, NV, LN))(kind, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, re, H, stream)
#define CASE(NV)                  \
    case 2 * NV: G16(NV, 0); break; \
    case 2 * NV + 1: G16(NV, 1); break;
    switch ((int)((H + 15) / 16) * 2 + (pb != NULL)) {   /* rows of 1 to NV16 vectors */
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    }
#undef CASE
#undef G16
}

/* ---- long rows in registers, any storage -------------------------------
 * LayerNorm, add + LayerNorm and RMSNorm forward of rows longer than
 * FWD16_H, stored as float (KIND_F32) or 16-bit (FASTLN_F16, FASTLN_BF16,
 * KIND_BF16_INSN), widened and narrowed in registers. One sweep a row: y,
 * which also sums the next row, so that the next row's loads from memory
 * overlap this row's arithmetic in cache. RMSNorm sums the squares.
 * LayerNorm sums x - t and (x - t)^2 around t, the mean of the row's first
 * 16 values, and takes var = mean((x - t)^2) - mean(x - t)^2 where (mean -
 * t)^2 <= var / 2 (a row with a head far from its mean, or a bad sum, gets
 * the centred squares in a second sweep). With a residual, every sweep
 * reads x + res (the same float sum each time) and the y sweep stores it as
 * s, or (sf) the first sweep stores s and the others read it. With nt, y
 * (and s) go out by non-temporal stores from a 64-byte boundary (the row's
 * first vectors masked up to it), or for rows of up to STAGE_ROW_BYTES
 * through an L1 staging row, and the y sweep prefetches the rows ahead into
 * L1. The sums follow sum_shifted/sumsq_centered's lanes (four vectors,
 * chunks of 1024 added in double), so a row's results do not depend on
 * where its range starts, and 16-bit rows get those of the float kernels on
 * the widened row, rounded once. Rows whose statistics need the fallbacks go
 * through the one-row float code (16-bit ones widened into scratch).
 * RMSNorm's streamed float rows of whole vectors up to STAGE_ROW_BYTES go
 * through an ntw writer instead of the staging row (2 threads, outputs 0 and
 * 16 bytes into a line, same-process A/B medians: (16384, 768) 1.05-1.12x,
 * (16384, 1024) 1.10-1.19x, (32768, 512) 0.93-1.05x, (65536, 320)
 * 1.02-1.10x). LayerNorm's rows measured 0.80-1.15x with it (its y sweep
 * also sums the next row) and keep the staging row. */
#define PF_LONG_BWD 4096   /* long_bwd's prefetch distance, bytes (1, 8 KiB: slower) */
#define PF_AHEAD 4096   /* the y sweep's prefetch distance, bytes (RMSNorm: 1-8 KiB no better) */
/* Streamed forward rows of up to this many bytes (backward: shorter, see
 * long_bwd) are written to an L1 staging row and streamed out after it: the
 * y sweep's own non-temporal stores measured slower there (2 threads,
 * (32768, 512) 3.5 -> 2.2 ms, (43690, 384) 3.9 -> 2.3 ms, (16384, 1024) 2.5
 * -> 2.2 ms, (16384, 768) 2.0 -> 1.6 ms; bfloat16 (16384, 1024) 1.30 ->
 * 1.05 ms; 1 thread 1.2-2x), and faster for longer rows ((8192, 2048) 2.9 ms
 * staged, 2.5 direct). add + LayerNorm streams both s and y from the sweep
 * (staged y: (16384, 1024) 5.0 -> 5.7 ms). */
#define STAGE_ROW_BYTES 4096

static inline __attribute__((always_inline)) __m512 SFX(ld_k)(
    int kind, const void *p, int64_t i, __mmask16 m)
{
    return kind == KIND_F32 ? _mm512_maskz_loadu_ps(m, (const float *)p + i)
                            : SFX(ld_half)(kind, (const uint16_t *)p + i, m);
}

/* lanes m of v to element i of p; nt: non-temporal where aligned */
static inline __attribute__((always_inline)) void SFX(st_k)(
    int kind, void *p, int64_t i, __m512 v, __mmask16 m, int nt)
{
    if (kind != KIND_F32) {
        SFX(st_half)(kind, (uint16_t *)p + i, v, m, nt);
        return;
    }
    float *q = (float *)p + i;
    if (m != (__mmask16)0xFFFF) _mm512_mask_storeu_ps(q, m, v);
    else if (nt && !((uintptr_t)q & 63)) _mm512_stream_ps(q, v);
    else _mm512_storeu_ps(q, v);
}

/* a, b to elements i..i+31 of p (16-bit kind) in one 64-byte store;
 * non-temporal with nt where aligned (two 32-byte halves of a line stored
 * non-temporally measured slower than cached stores). KIND_BF16_INSN: one
 * VCVTNE2PS2BF16 whatever the values, and the lanes of a or b that hold a
 * subnormal set to all ones in *sub, for the caller to store again
 * (norm_row; a vector, as a mask it went through general registers). */
static inline __attribute__((always_inline)) void SFX(st_pair)(
    int kind, void *p, int64_t i, __m512 a, __m512 b, int nt, __m512i *sub)
{
    __m512i h;
    if (kind == KIND_BF16_INSN) {
        const __m512i ones = _mm512_set1_epi32(-1);
        *sub = _mm512_mask_mov_epi32(*sub, _mm512_fpclass_ps_mask(a, 0x20), ones);
        *sub = _mm512_mask_mov_epi32(*sub, _mm512_fpclass_ps_mask(b, 0x20), ones);
        h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    } else {
        h = SFX(narrow32)(kind, a, b);
    }
    uint16_t *q = (uint16_t *)p + i;
    if (nt && !((uintptr_t)q & 63)) _mm512_stream_si512((__m512i *)q, h);
    else _mm512_storeu_si512(q, h);
}

/* x, or with res x + res, at element i (lanes m) */
static inline __attribute__((always_inline)) __m512 SFX(ld_in)(
    int kind, const void *x, const void *res, int64_t i, __mmask16 m)
{
    __m512 v = SFX(ld_k)(kind, x, i, m);
    return res ? _mm512_add_ps(v, SFX(ld_k)(kind, res, i, m)) : v;
}

/* The shift of a row's LayerNorm sums (x + res with res): the mean of its
 * first min(H, 16) values, a value near the row's mean */
static inline float SFX(row_shift)(int kind, const void *x, const void *res, int64_t H)
{
    const int k = H < 16 ? (int)H : 16;
    __m512 v = SFX(ld_in)(kind, x, res, 0, (__mmask16)((1u << k) - 1));
    return _mm512_reduce_add_ps(v) / (float)k;
}

/* In the last, partial 64 elements at i of a chunk of n: the lanes of
 * accumulator k (elements i + 16k .. i + 16k + 15) that lie in the chunk */
#define TAILMASK(n, i, k) (n - i - 16 * (k) >= 16 ? (__mmask16)0xFFFF                 \
                           : n - i <= 16 * (k) ? (__mmask16)0                          \
                           : (__mmask16)((1u << (n - i - 16 * (k))) - 1))

/* The sum of the 64 lanes of a[0..3], as hsum adds sum_shifted's acc[64] */
static inline float SFX(hsum4)(const __m512 *a)
{
    float acc[64];
    for (int q = 0; q < 4; q++) _mm512_storeu_ps(acc + 16 * q, a[q]);
    return SFX(hsum)(acc);
}

/* Prefetches into L1 the part of pf that goes with elements [e, e + 64) of
 * a sweep (elements of esz bytes); always_inline as pf_ahead. Into L2 (T1)
 * it measured slower (same-process A/B, 2 threads: float32 (16384, 1024)
 * 1.22x with T0, (4096, 4096) 1.06x, (4096, 8192) 1.09x, (16384, 8192) 1.10x;
 * bfloat16 1.00x). */
static inline __attribute__((always_inline)) void SFX(pf_step)(const char *pf, int64_t e,
                                                               int64_t esz)
{
    for (int64_t k = 0; k < 64 * esz; k += 64) _mm_prefetch(pf + e * esz + k, _MM_HINT_T0);
}

/* Elements i..i+63 of the chunk at c0 (n elements; full: all 64 in it) of
 * x (x + res with res) into a[0..3], lanes as sum_shifted's acc[64], for
 * v = x - sh: with sq 0, v; with sq 1, (v - d)^2, d NULL meaning 0; with sq
 * 2 (SQ_BOTH), v into a[0..3] and v^2 into a[4..7]. With so (float kind),
 * x (x + res) is also stored there. */
#define SQ_BOTH 2
static inline __attribute__((always_inline)) void SFX(acc64)(
    int kind, const void *x, const void *res, float *so, int64_t c0, int64_t i, int64_t n,
    int full, __m512 sh, const __m512 *d, int sq, __m512 *a)
{
    for (int q = 0; q < 4; q++) {
        __mmask16 m = full ? (__mmask16)0xFFFF : TAILMASK(n, i, q);
        __m512 v = SFX(ld_in)(kind, x, res, c0 + i + 16 * q, m);
        if (so) SFX(st_k)(KIND_F32, so, c0 + i + 16 * q, v, m, 0);
        v = _mm512_sub_ps(v, sh);
        if (sq == 1 && d) v = _mm512_sub_ps(v, *d);
        if (sq == 1) {
            a[q] = _mm512_mask3_fmadd_ps(v, v, a[q], m);
            continue;
        }
        a[q] = _mm512_mask_add_ps(a[q], m, a[q], v);
        if (sq == SQ_BOTH) a[4 + q] = _mm512_mask3_fmadd_ps(v, v, a[4 + q], m);
    }
}

/* Over a row (x + res with res): sum((x - shift) - dm)^2 with sq 1, else
 * sum(x - shift), and with sq SQ_BOTH also sum((x - shift)^2) into *s2;
 * with so, x (x + res) stored there as acc64 */
static inline __attribute__((always_inline)) double SFX(row_sum)(
    int kind, const void *x, const void *res, float *so, int64_t H, float shift, float dm,
    int sq, double *s2)
{
    const __m512 sh = _mm512_set1_ps(shift), d = _mm512_set1_ps(dm);
    double total = 0;
    if (sq == SQ_BOTH) *s2 = 0;
    for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
        int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK;
        __m512 a[8];
        for (int q = 0; q < 8; q++) a[q] = _mm512_setzero_ps();
        int64_t i = 0;
        for (; i + 64 <= n; i += 64) SFX(acc64)(kind, x, res, so, c0, i, n, 1, sh, &d, sq, a);
        if (i < n) SFX(acc64)(kind, x, res, so, c0, i, n, 0, sh, &d, sq, a);
        total += SFX(hsum4)(a);
        if (sq == SQ_BOTH) *s2 += SFX(hsum4)(a + 4);
    }
    return total;
}

/* Lanes m of y at element j from xv = x there, as normalize_row computes it
 * (w, b NULL or not: WB = 2 * !!w + !!b); c = (x - shift) - dm. */
static inline __attribute__((always_inline)) __m512 SFX(norm16)(
    int WB, __m512 xv, const float *w, const float *b, int64_t j, __mmask16 m, __m512 sh,
    __m512 d, __m512 rv)
{
    __m512 c = _mm512_sub_ps(_mm512_sub_ps(xv, sh), d);
    if (WB == 3)
        return _mm512_fmadd_ps(_mm512_mul_ps(c, rv), _mm512_maskz_loadu_ps(m, w + j),
                               _mm512_maskz_loadu_ps(m, b + j));
    if (WB == 2) return _mm512_mul_ps(_mm512_mul_ps(c, rv), _mm512_maskz_loadu_ps(m, w + j));
    if (WB == 1) return _mm512_fmadd_ps(c, rv, _mm512_maskz_loadu_ps(m, b + j));
    return _mm512_mul_ps(c, rv);
}

/* The y sweep of a row (with res, of x + res, also stored to s); with xn, in
 * the same sweep row_sum(xn, rn, sn, shn, 0, sq, s2) of the next row, returned
 * (else 0), and with pf (pfr) pf_step(pf, ..) (pf_step(pfr, ..)) for each
 * 64 of those elements.
 * y's first vectors end at a 64-byte boundary, so that with nt the others
 * are non-temporal (16-bit values two vectors to a store). A bfloat16 row
 * on AVX512-BF16 with a subnormal in s or y is stored again at the end
 * (see st_pair). */
static inline __attribute__((always_inline)) double SFX(norm_row)(
    int kind, int WB, void *y, void *s, const void *x, const void *res, const float *w,
    const float *b, int64_t H, float shift, float dm, float r, int nt, const void *xn,
    const void *rn, float *sn, float shn, int sq, double *s2, const char *pf, const char *pfr,
    SFX(ntw) *ow)
{
    const __m512 sh = _mm512_set1_ps(shift), d = _mm512_set1_ps(dm), rv = _mm512_set1_ps(r);
    const int64_t esz = SFX(elsize)(kind);
    const int nt16 = kind == KIND_F32 && nt;   /* non-temporal one vector at a time */
    /* y's vectors from its first line boundary on, or with ow (float rows of
     * whole vectors, no res) from the row's start, in order, to ow's copy wl
     * (see PUT_OR_ST) */
    int64_t j = ow || (uintptr_t)y % esz ? 0 : (int64_t)((-(uintptr_t)y & 63) / esz);
    if (j > H) j = H;
    SFX(ntw) wl;
    if (ow) wl = *ow;
    __m512i sub = _mm512_setzero_si512();   /* Y32's subnormal lanes (see st_pair) */
#define FULL16 ((__mmask16)0xFFFF)
#define Y16(I, M)                                                                         \
    do {                                                                                  \
        __mmask16 m_ = (M);                                                               \
        __m512 xv_ = SFX(ld_in)(kind, x, res, (I), m_);                                   \
        __m512 yv_ = SFX(norm16)(WB, xv_, w, b, (I), m_, sh, d, rv);                      \
        if (res) SFX(st_k)(kind, s, (I), xv_, m_, nt16);                                  \
        if (ow) SFX(ntw_put)(&wl, yv_);                                                   \
        else SFX(st_k)(kind, y, (I), yv_, m_, nt16);                                      \
    } while (0)
#define Y32(I)   /* elements I..I+31, 16-bit kinds */                                    \
    do {                                                                                  \
        __m512 xa_ = SFX(ld_in)(kind, x, res, (I), FULL16);                               \
        __m512 xb_ = SFX(ld_in)(kind, x, res, (I) + 16, FULL16);                          \
        if (res) SFX(st_pair)(kind, s, (I), xa_, xb_, nt, &sub);                          \
        SFX(st_pair)(kind, y, (I), SFX(norm16)(WB, xa_, w, b, (I), FULL16, sh, d, rv),    \
                     SFX(norm16)(WB, xb_, w, b, (I) + 16, FULL16, sh, d, rv), nt, &sub);  \
    } while (0)
    for (int64_t h = 0; h < j; h += 16)
        Y16(h, j - h >= 16 ? FULL16 : (__mmask16)((1u << (j - h)) - 1));
    double total = 0;
    if (xn) {
        const __m512 shv = _mm512_set1_ps(shn);
        if (sq == SQ_BOTH) *s2 = 0;
        for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
            int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK;
            __m512 a[8];
            for (int q = 0; q < 8; q++) a[q] = _mm512_setzero_ps();
            int64_t i = 0;
            for (; i + 64 <= n; i += 64) {
                if (pf) SFX(pf_step)(pf, c0 + i, esz);
                if (pfr) SFX(pf_step)(pfr, c0 + i, esz);
                SFX(acc64)(kind, xn, rn, sn, c0, i, n, 1, shv, NULL, sq, a);
                if (j + 64 <= H) {   /* four whole vectors of y: constant masks */
                    if (kind == KIND_F32) {
                        Y16(j, FULL16);
                        Y16(j + 16, FULL16);
                        Y16(j + 32, FULL16);
                        Y16(j + 48, FULL16);
                    } else {
                        Y32(j);
                        Y32(j + 32);
                    }
                    j += 64;
                }
            }
            if (i < n) SFX(acc64)(kind, xn, rn, sn, c0, i, n, 0, shv, NULL, sq, a);
            total += SFX(hsum4)(a);
            if (sq == SQ_BOTH) *s2 += SFX(hsum4)(a + 4);
        }
    }
    for (; kind != KIND_F32 && j + 32 <= H; j += 32) Y32(j);
    for (; j + 16 <= H; j += 16) Y16(j, FULL16);
    if (j < H) Y16(j, (__mmask16)((1u << (H - j)) - 1));
    if (kind == KIND_BF16_INSN && _mm512_test_epi32_mask(sub, sub)) {
        /* a subnormal in s or y, which VCVTNE2PS2BF16 flushed: the row again
         * by Y16, whose stores take the integer rounding for such vectors */
        if (nt) stream_fence();
        for (j = 0; j < H; j += 16) Y16(j, H - j >= 16 ? FULL16 : (__mmask16)((1u << (H - j)) - 1));
    }
    if (ow) *ow = wl;
#undef FULL16
#undef Y32
#undef Y16
    return total;
}

/* Rows [r0, r1) of kind (a constant after inlining); rms: RMSNorm (mean
 * unused, b NULL); res: add + LayerNorm (s = x + res, y = LN(s)). sf (a
 * constant; float with res, not nt): a row's s is stored by the sweep that
 * first sums it, and its later sweeps read s instead of x + res (2 threads:
 * (1024, 768) 85 -> 68 us, (4096, 768) 440 -> 400 us); not with nt, where
 * the y sweep streams s out, nor for 16-bit s, whose rounded values are not
 * the float sums. buf: 2H floats of scratch for 16-bit rows that take the
 * fallbacks; nt: non-temporal stores (the caller fences), straight from the
 * y sweep, or with stg (STAGE_ROW_BYTES, 64-byte aligned; not with res) a
 * row's y stored there and then streamed out. */
static inline __attribute__((always_inline)) void SFX(long_rows_k)(
    int kind, int rms, int sf, void *y, void *s, float *mean, float *rstd,
    const void *x, const void *res, const float *w, const float *b, int64_t r0, int64_t r1,
    int64_t H, double eps, float *buf, int nt, char *stg)
{
    const int64_t rowb = H * SFX(elsize)(kind);   /* bytes a row */
    /* RMSNorm: stg's float rows of whole vectors go to a writer instead */
    SFX(ntw) w_;
    SFX(ntw) *const ow = rms && stg && kind == KIND_F32 && SFX(ntw_ok)((float *)y, H) ? &w_ : NULL;
    if (ow) {
        stg = NULL;
        SFX(ntw_init)(ow, (float *)y + r0 * H);
    }
    const int ntd = nt && !stg && !ow;   /* non-temporal stores in the sweeps */
    const char *xc = (const char *)x, *rc = (const char *)res;
    const int sq = rms ? 1 : SQ_BOTH;   /* the sums a y sweep takes of the next row */
    /* The y sweep prefetches PF_AHEAD bytes ahead of the next row's sums
     * with nt, and LayerNorm also where this thread's rows exceed
     * PF_RANGE_BYTES (2 threads, out= not streamed: (4096, 1024) 429 -> 406
     * us, (2048, 2048) 504 -> 452 us, (512, 8192) 602 -> 534 us, 1 thread
     * 8-12%; in cache, (1024, 1024), up to 6% slower with it; RMSNorm
     * (4096, 1024) 4% slower). With res, x and res both (2 threads:
     * (4096, 768) 771 -> 691 us, (4096, 2048) 2.3 -> 1.5 ms, (16384, 1024)
     * 5.9 -> 5.4 ms streamed; 1 thread 12-56%). */
    const int pf_on = nt || (!rms && (r1 - r0) * rowb > PF_RANGE_BYTES);
#define SHIFT(row) (rms ? 0.0f : SFX(row_shift)(kind, xc + (row) * rowb,               \
                                                res ? rc + (row) * rowb : NULL, H))
    /* s1: the row's sum(x - shift), for RMSNorm sum(x^2) (shift 0); s2 (LN):
     * sum((x - shift)^2) */
    float shift = 0;
    double s1 = 0, s2 = 0;
    if (r0 < r1) {
        shift = SHIFT(r0);
        s1 = SFX(row_sum)(kind, xc + r0 * rowb, res ? rc + r0 * rowb : NULL,
                          sf ? (float *)s + r0 * H : NULL, H, shift, 0, sq, &s2);
    }
    for (int64_t n = r0; n < r1; n++) {
        const void *xr = xc + n * rowb, *xn = n + 1 < r1 ? xc + (n + 1) * rowb : NULL;
        const void *rr_ = res ? rc + n * rowb : NULL, *rn = res && xn ? rc + (n + 1) * rowb : NULL;
        void *yr = stg ? (void *)stg : (char *)y + n * rowb;
        void *sr = res ? (char *)s + n * rowb : NULL;
        float *sn = sf && xn ? (float *)sr + H : NULL;   /* the next row's s */
        /* where the sweeps below read this row: s once it holds x + res */
        const void *xs = sf ? sr : xr, *rs = sf ? NULL : rr_;
        float *mr = mean ? mean + n : NULL, *rr = rstd ? rstd + n : NULL;
        float shn = xn ? SHIFT(n + 1) : 0;
        const char *pf = xn && pf_on ? (const char *)xn + PF_AHEAD : NULL;
        const char *pfr = rn && pf_on ? (const char *)rn + PF_AHEAD : NULL;
        float dm = rms ? 0 : (float)(s1 / (double)H);
        double var = s1 / (double)H;   /* RMSNorm: the mean square */
        if (!rms) {
            /* the one-sweep variance where the shift lies near the mean:
             * (mean - shift)^2 <= var / 2 bounds its cancellation to a third
             * of the result; else the centred squares, a second sweep */
            double d = s1 / (double)H;
            var = s2 / (double)H - d * d;
            if (!(d * d <= 0.5 * var))
                var = SFX(row_sum)(kind, xs, rs, NULL, H, shift, dm, 1, NULL) / (double)H;
        }
        double rd = 1.0 / sqrt(var + eps);
        float r = (float)rd;
        if (!(var >= 1e-30 && var <= 1e30) || !isfinite(s1) || isinf(r)) {
            /* the one-row float code, with its fallbacks, on x (or s = x + res
             * in float, stored first); around it the writer ends its block and
             * starts the next one after this row */
            if (ow) SFX(ntw_finish)(ow);
            float *xf = kind != KIND_F32 ? buf : res ? (float *)sr : (float *)xr;
            float *yf = kind == KIND_F32 ? (float *)yr : buf + H;
            for (int64_t i = 0; (kind != KIND_F32 || (res && !sf)) && i < H; i += 16) {
                __mmask16 m = H - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - i)) - 1);
                __m512 v = SFX(ld_in)(kind, xr, rr_, i, m);
                _mm512_mask_storeu_ps(xf + i, m, v);
                if (res && kind != KIND_F32) SFX(st_k)(kind, sr, i, v, m, 0);
            }
            if (rms) SFX(rms_rows)(yf, rr, xf, w, 0, 1, H, eps, NULL);
            else SFX(ln_finish_row)(yf, mr, rr, xf, w, b, H, eps, shift, s1, dm, var);
            if (kind != KIND_F32) narrow_half(kind, (uint16_t *)yr, yf, H);
            if (ow) SFX(ntw_init)(ow, (float *)y + (n + 1) * H);
            s1 = xn ? SFX(row_sum)(kind, xn, rn, sn, H, shn, 0, sq, &s2) : 0;
        } else {
            if (mr) *mr = (float)((double)shift + (double)dm);
            if (rr) *rr = r;
#define NORM(WB) SFX(norm_row)(kind, WB, yr, sf ? NULL : sr, xs, rs, w, b, H, shift, dm, r, \
                               ntd, xn, rn, sn, shn, sq, &s2, pf, pfr, ow)
            switch (2 * (w != NULL) + (b != NULL)) {   /* RMSNorm: WB 2 or 0, shift = dm = 0 */
            case 3: s1 = NORM(3); break;
            case 2: s1 = NORM(2); break;
            case 1: s1 = NORM(1); break;
            default: s1 = NORM(0); break;
            }
#undef NORM
        }
        if (stg) stream_copy((char *)y + n * rowb, yr, (size_t)rowb);
        shift = shn;
    }
#undef SHIFT
    if (ow) SFX(ntw_finish)(ow);
    if (nt) stream_fence();
}

/* long_rows_k for one stored kind and variant (LayerNorm, RMSNorm, add +
 * LayerNorm), a function of each, as the sixteen-row kernels have. In one
 * function for all of them (long_rows_nt), GCC keeps the weight pointers on
 * the stack and reloads them for each vector (same-process A/B, 2 threads:
 * (4096, 1024) 1.23x, (4096, 768) 1.27x, add + LayerNorm (4096, 1024)
 * 1.25x, bfloat16 streamed 1.03-1.07x; 1 thread (1024, 1024) 1.24-1.37x,
 * RMSNorm 1.12x). */
#define LONG_FN(KN, V, K, RMS, ADD)                                                        \
    static __attribute__((noinline)) void SFX(CAT3(long_, KN, V))(                         \
        void *y, void *s, float *mean, float *rstd, const void *x, const void *res,        \
        const float *w, const float *b, int64_t r0, int64_t r1, int64_t H, double eps,     \
        float *buf, int nt, char *stg)                                                     \
    {                                                                                      \
        SFX(long_rows_k)(K, RMS, ADD && K == KIND_F32 && !nt, y, ADD ? s : NULL, mean,     \
                         rstd, x, ADD ? res : NULL, w, b, r0, r1, H, eps, buf, nt, stg);   \
    }
#define LONG_FNS(KN, K)     \
    LONG_FN(KN, _ln, K, 0, 0)  \
    LONG_FN(KN, _rms, K, 1, 0) \
    LONG_FN(KN, _add, K, 0, 1)
LONG_FNS(f32, KIND_F32)
LONG_FNS(f16, FASTLN_F16)
LONG_FNS(bf16i, KIND_BF16_INSN)
LONG_FNS(bf16, FASTLN_BF16)
#undef LONG_FNS
#undef LONG_FN

/* long_rows_k for every kind and variant in one function, for float32
 * LayerNorm rows streamed from the y sweep (longer than STAGE_ROW_BYTES, or
 * with res): there the functions above measured slower (2 threads:
 * (4096, 8192) 0.86-0.93x, (4096, 4096) 0.92-0.99x, add + LayerNorm (4096,
 * 8192) 0.90x), for a reason not found. noipa: compiled as it was before
 * those functions, for no caller in particular (its other kinds unused). */
static __attribute__((noipa)) void SFX(long_rows_nt)(
    int kind, int rms, void *y, void *s, float *mean, float *rstd, const void *x,
    const void *res, const float *w, const float *b, int64_t r0, int64_t r1, int64_t H,
    double eps, float *buf, int nt, char *stg)
{
#define K_(K, RMS, SF, S, RES) \
    SFX(long_rows_k)(K, RMS, SF, y, S, mean, rstd, x, RES, w, b, r0, r1, H, eps, buf, nt, stg)
#define CASE(K)                                                   \
    case K:                                                       \
        if (rms) K_(K, 1, 0, NULL, NULL);                         \
        else if (res && K == KIND_F32 && !nt) K_(K, 0, 1, s, res); \
        else if (res) K_(K, 0, 0, s, res);                        \
        else K_(K, 0, 0, NULL, NULL);                             \
        break;
    switch (SFX(store_kind)(kind)) {
        CASE(KIND_F32) CASE(FASTLN_F16) CASE(KIND_BF16_INSN) CASE(FASTLN_BF16)
    }
#undef CASE
#undef K_
}

/* long_rows_k for kind FASTLN_F16, FASTLN_BF16 or KIND_F32 (the kind of this
 * CPU's stores for bfloat16); with res (not with rms) add + LayerNorm into y
 * and s. */
static void SFX(long_rows)(int kind, int rms, void *y, void *s, float *mean, float *rstd,
                           const void *x, const void *res, const float *w, const float *b,
                           int64_t r0, int64_t r1, int64_t H, double eps, float *buf, int nt)
{
    char stg_[STAGE_ROW_BYTES] __attribute__((aligned(64)));
    char *stg = nt && !res && H * SFX(elsize)(kind) <= STAGE_ROW_BYTES ? stg_ : NULL;
    const int k = SFX(store_kind)(kind);
    if (nt && k == KIND_F32 && !rms && !stg) {
        SFX(long_rows_nt)(kind, rms, y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf, nt, stg);
        return;
    }
#define F_(KN, V) SFX(CAT3(long_, KN, V))(y, s, mean, rstd, x, res, w, b, r0, r1, H, eps, buf, nt, stg)
#define CASE(K, KN)                                           \
    case K:                                                   \
        if (rms) F_(KN, _rms);                                \
        else if (res) F_(KN, _add);                           \
        else F_(KN, _ln);                                     \
        break;
    switch (k) {
        CASE(KIND_F32, f32) CASE(FASTLN_F16, f16) CASE(KIND_BF16_INSN, bf16i)
        CASE(FASTLN_BF16, bf16)
    }
#undef CASE
#undef F_
}

/* ---- long rows' backward in registers -----------------------------------
 * LayerNorm (LN) and RMSNorm backward of rows longer than SHORT16_H, float or
 * 16-bit storage (kinds as long_rows); HW: a weight. One sweep a row: dx and
 * the dweight/dbias partials of this row (bwd_sweep2's arithmetic one row at
 * a time, so the partials add in the same order), and the sums of the next
 * row (ln_bwd_scalars/rms_bwd_scalars lane for lane), whose loads from memory
 * overlap this row's arithmetic. With nt, dx goes out by non-temporal stores
 * after a masked head up to the store alignment. */

/* Adds lanes m at element i of a row to its sums: LN sum(d), sum(g), sum(g*d)
 * (d = x - mean, g = dy * w); RMSNorm sum(g*x) in agd. */
static inline __attribute__((always_inline)) void SFX(bsum16)(
    int kind, int LN, int HW, const void *x, const void *dy, const float *w, int64_t i,
    __mmask16 m, __m512 mv, __m512 *ad, __m512 *ag, __m512 *agd)
{
    __m512 xv = SFX(ld_k)(kind, x, i, m), g = SFX(ld_k)(kind, dy, i, m);
    if (HW) g = _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, w + i));
    if (LN) {
        __m512 d = _mm512_sub_ps(xv, mv);
        *ad = _mm512_mask_add_ps(*ad, m, *ad, d);
        *ag = _mm512_mask_add_ps(*ag, m, *ag, g);
        *agd = _mm512_mask3_fmadd_ps(g, d, *agd, m);
    } else {
        *agd = _mm512_mask3_fmadd_ps(g, xv, *agd, m);
    }
}

/* Lanes m at element j of a row: dx, and the partials pw (+= dy * xhat) and,
 * with LN, pb (+= dy). s: the row's scalars m, dm, r, c1, c2 as vectors.
 * Every load comes before the stores (4K aliasing; dx may be x or dy). */
static inline __attribute__((always_inline)) void SFX(bdx16)(
    int kind, int LN, int HW, void *dx, float *pw, float *pb, const void *x, const void *dy,
    const float *w, int64_t j, __mmask16 m, const __m512 *s, int nt)
{
    __m512 xv = SFX(ld_k)(kind, x, j, m), g = SFX(ld_k)(kind, dy, j, m);
    __m512 wv = HW ? _mm512_maskz_loadu_ps(m, w + j) : _mm512_set1_ps(1.0f);
    __m512 sw = _mm512_maskz_loadu_ps(m, pw + j);
    __m512 sb = LN ? _mm512_maskz_loadu_ps(m, pb + j) : sw;
    __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(xv, s[0]), s[1]), s[2]);
    __m512 t = _mm512_fmsub_ps(g, wv, s[3]);                     /* g * w - c1 */
    SFX(st_k)(KIND_F32, pw, j, _mm512_fmadd_ps(g, xh, sw), m, 0);
    if (LN) SFX(st_k)(KIND_F32, pb, j, _mm512_add_ps(sb, g), m, 0);
    SFX(st_k)(kind, dx, j, _mm512_mul_ps(s[2], _mm512_fnmadd_ps(xh, s[4], t)), m, nt);
}

/* One sweep: with xa, dx of row a (dy ga, scalars s) into dxa and the
 * partials; with xb, the sums of row b (dy gb, mean mb) into S. */
static inline __attribute__((always_inline)) void SFX(bwd_pass)(
    int kind, int LN, int HW, void *dxa, float *pw, float *pb, const void *xa, const void *ga,
    const __m512 *s, const void *xb, const void *gb, float mb, const float *w, int64_t H,
    int nt, double *S, int pf, const char *xend, const char *gend)
{
    const int64_t esz = SFX(elsize)(kind);
    int64_t j = H;
    if (xa) {
        j = (uintptr_t)dxa % esz ? 0 : (int64_t)((-(uintptr_t)dxa & (16 * esz - 1)) / esz);
        if (j > H) j = H;
        if (j)
            SFX(bdx16)(kind, LN, HW, dxa, pw, pb, xa, ga, w, 0, (__mmask16)((1u << j) - 1), s, nt);
    }
#define DX16()                                                                             \
    do {                                                                                   \
        __mmask16 m_ = H - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (H - j)) - 1); \
        SFX(bdx16)(kind, LN, HW, dxa, pw, pb, xa, ga, w, j, m_, s, nt);                    \
        j += 16;                                                                           \
    } while (0)
    if (xb) {
        const __m512 mv = _mm512_set1_ps(mb);
        S[0] = S[1] = S[2] = 0;
        for (int64_t c0 = 0; c0 < H; c0 += CHUNK) {
            int64_t n = H - c0 < CHUNK ? H - c0 : CHUNK, i = 0;
            __m512 ad[4], ag[4], agd[4];
            for (int q = 0; q < 4; q++) ad[q] = ag[q] = agd[q] = _mm512_setzero_ps();
            for (; i + 64 <= n; i += 64) {   /* lanes as ln_bwd_scalars' ad[64] */
                if (pf) {
                    const char *xo = (const char *)xb + (c0 + i) * esz;
                    const char *go = (const char *)gb + (c0 + i) * esz;
                    SFX(pf_ahead)(xo, 64 * esz, PF_LONG_BWD, xend);
                    SFX(pf_ahead)(go, 64 * esz, PF_LONG_BWD, gend);
                }
                for (int q = 0; q < 4; q++)
                    SFX(bsum16)(kind, LN, HW, xb, gb, w, c0 + i + 16 * q, (__mmask16)0xFFFF, mv,
                                &ad[q], &ag[q], &agd[q]);
                for (int k = 0; k < 4 && j < H; k++) DX16();
            }
            if (i < n)
                for (int q = 0; q < 4; q++)
                    SFX(bsum16)(kind, LN, HW, xb, gb, w, c0 + i + 16 * q, TAILMASK(n, i, q), mv,
                                &ad[q], &ag[q], &agd[q]);
            if (LN) {
                S[0] += SFX(hsum4)(ad);
                S[1] += SFX(hsum4)(ag);
            }
            S[2] += SFX(hsum4)(agd);
        }
    }
    while (j < H) DX16();
#undef DX16
}

/* The scalars of row n from its sums S, as vectors (16-bit rows whose sums
 * are not finite are widened into buf for the double fallback). */
static inline __attribute__((always_inline)) void SFX(bwd_vscalars)(
    int kind, int LN, __m512 *s, const double *S, const void *xr, const void *gr,
    const float *w, const float *mean, const float *rstd, int64_t n, int64_t H, float *buf)
{
    const float *xf = (const float *)xr, *gf = (const float *)gr;
    int finite = LN ? isfinite(S[0]) && isfinite(S[1]) && isfinite(S[2]) : isfinite(S[2]);
    if (kind != KIND_F32 && !finite) {
        widen_half(kind, buf, (const uint16_t *)xr, H);
        widen_half(kind, buf + H, (const uint16_t *)gr, H);
        xf = buf;
        gf = buf + H;
    }
    SFX(bwd_scalars) sc = LN ? SFX(ln_bwd_finish)(xf, gf, w, mean[n], rstd[n], H, S[0], S[1], S[2])
                             : SFX(rms_bwd_finish)(xf, gf, w, rstd[n], H, S[2]);
    s[0] = _mm512_set1_ps(sc.m);
    s[1] = _mm512_set1_ps(sc.dm);
    s[2] = _mm512_set1_ps(sc.r);
    s[3] = _mm512_set1_ps(sc.c1);
    s[4] = _mm512_set1_ps(sc.c2);
}

/* Backward rows [r0, r1): LayerNorm when pb != NULL, else RMSNorm (as
 * bwd_rows). buf: 2H floats of scratch for 16-bit rows; nt: non-temporal dx
 * (fenced here), from the sweep, or with stg (as long_rows_k's) staged;
 * pf (a constant): prefetch x and dy PF_LONG_BWD bytes ahead of the sums,
 * short of r1. */
static inline __attribute__((always_inline)) void SFX(long_bwd_k)(
    int kind, int LN, int HW, int pf, void *dx, float *pw, float *pb, const void *dy,
    const void *x, const float *mean, const float *rstd, const float *w, int64_t r0, int64_t r1,
    int64_t H, float *buf, int nt, char *stg)
{
    const int64_t rowb = H * SFX(elsize)(kind);
    const char *xc = (const char *)x, *gc = (const char *)dy;
    double S[3] = {0, 0, 0};
    __m512 s[5];
    if (r0 >= r1) return;
    const char *xend = xc + r1 * rowb, *gend = gc + r1 * rowb;
    SFX(bwd_pass)(kind, LN, HW, NULL, pw, pb, NULL, NULL, NULL, xc + r0 * rowb, gc + r0 * rowb,
                  LN ? mean[r0] : 0, w, H, nt, S, pf, xend, gend);
    SFX(bwd_vscalars)(kind, LN, s, S, xc + r0 * rowb, gc + r0 * rowb, w, mean, rstd, r0, H, buf);
    for (int64_t n = r0; n < r1; n++) {
        const char *xb = n + 1 < r1 ? xc + (n + 1) * rowb : NULL, *gb = gc + (n + 1) * rowb;
        char *dxr = stg ? stg : (char *)dx + n * rowb;
        SFX(bwd_pass)(kind, LN, HW, dxr, pw, pb, xc + n * rowb, gc + n * rowb, s, xb, gb,
                      xb && LN ? mean[n + 1] : 0, w, H, nt && !stg, S, pf, xend, gend);
        if (stg) stream_copy((char *)dx + n * rowb, stg, (size_t)rowb);   /* row n read */
        if (xb) SFX(bwd_vscalars)(kind, LN, s, S, xb, gb, w, mean, rstd, n + 1, H, buf);
    }
    if (nt) stream_fence();
}

static void SFX(long_bwd)(int kind, void *dx, float *pw, float *pb, const void *dy,
                          const void *x, const float *mean, const float *rstd, const float *w,
                          int64_t r0, int64_t r1, int64_t H, float *buf, int nt)
{
    /* pf: rows longer than 4 KiB, and streamed ones, prefetch PF_LONG_BWD
     * bytes ahead of the sums in x and dy (a constant for each instance: the
     * test in the loop measured slower). Streamed rows of 1-4 KiB: 2 threads
     * (16384, 1024) 3.7 -> 3.4 ms, (16384, 768) 2.7 -> 2.5 ms, (65536, 256)
     * 6.1 -> 5.7 ms, 1 thread 4-12%; rows in cache, (1024, 1024), 6-9%
     * slower with it. */
    const int64_t rowb = H * SFX(elsize)(kind);
    const int pf = nt || rowb > 4096;
    /* stg: streamed rows shorter than STAGE_ROW_BYTES stage dx (2 threads,
     * (43690, 384) 4.7 -> 3.3 ms, (32768, 512) 3.8 -> 2.6 ms, (21845, 768)
     * 3.8 -> 3.4 ms; bfloat16 (65536, 256) 5.8 -> 2.4 ms, (16384, 1024) 2.8 ->
     * 2.2 ms; 1 thread 1.3-1.8x); float rows of 4 KiB measured 4-9% slower
     * that way, at any offset of the staging row. */
    char stg_[STAGE_ROW_BYTES] __attribute__((aligned(64)));
    char *stg = nt && rowb < STAGE_ROW_BYTES ? stg_ : NULL;
#define K_(K, LN, HW, PF) \
    SFX(long_bwd_k)(K, LN, HW, PF, dx, pw, pb, dy, x, mean, rstd, w, r0, r1, H, buf, nt, stg)
#define CASE(K, LN, HW)                   \
    case K * 4 + LN * 2 + HW:             \
        if (pf) K_(K, LN, HW, 1);         \
        else K_(K, LN, HW, 0);            \
        break;
#define CASES(K) CASE(K, 0, 0) CASE(K, 0, 1) CASE(K, 1, 0) CASE(K, 1, 1)
    switch (SFX(store_kind)(kind) * 4 + (pb != NULL) * 2 + (w != NULL)) {
        CASES(KIND_F32) CASES(FASTLN_F16) CASES(FASTLN_BF16) CASES(KIND_BF16_INSN)
    }
#undef CASES
#undef CASE
#undef K_
}
#undef TAILMASK
