/*
 * SIMD helpers shared by the kernels of every instruction-set path: the
 * non-temporal copy, horizontal sums, float16/bfloat16 conversions (one value,
 * and vectors), and on AVX-512 the transposing reduction of sixteen vectors,
 * the prefetch helpers, the loads and stores of float16/bfloat16 vectors and
 * the streaming writer of a float output (ntw).
 * Include it after begin.h, which sets the target: VEC_BYTES says the
 * vector width, FASTLN_X86 whether intrinsics are available.
 */
#ifndef FASTLN_SIMD_H
#define FASTLN_SIMD_H
#ifndef VEC_BYTES
#error "isa/simd.h: include isa/begin.h first (it sets the target)"
#endif
#include <float.h>

/* Non-temporal copy of nbytes: ordinary stores up to the first aligned
 * vector, streaming stores for whole vectors, ordinary stores for the tail. */
#if defined(FASTLN_X86) && VEC_BYTES >= 16
#include <immintrin.h>
static inline void stream_copy(void *dst, const void *src, size_t nbytes)
{
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (size_t)(-(uintptr_t)d & (VEC_BYTES - 1));
    if (head > nbytes) head = nbytes;
    memcpy(d, s, head);
    d += head; s += head; nbytes -= head;
    for (; nbytes >= VEC_BYTES; nbytes -= VEC_BYTES, d += VEC_BYTES, s += VEC_BYTES) {
#if VEC_BYTES == 64
        _mm512_stream_si512((__m512i *)d, _mm512_loadu_si512((const void *)s));
#elif VEC_BYTES == 32
        _mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
#else
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
#endif
    }
    memcpy(d, s, nbytes);
}
static inline void stream_fence(void) { _mm_sfence(); }
#else
static inline void stream_copy(void *dst, const void *src, size_t nbytes)
{
    memcpy(dst, src, nbytes);
}
static inline void stream_fence(void) {}
#endif

/* Horizontal sum of the 4 * VEC_BYTES bytes of accumulators of the kernels
 * (four vector registers): add the four, then reduce one register. The
 * generic path leaves the reduction to the compiler. */
#if defined(FASTLN_X86) && VEC_BYTES == 64
static inline float hsum_f32(const float *a)
{
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(a + 16)),
                             _mm512_add_ps(_mm512_loadu_ps(a + 32), _mm512_loadu_ps(a + 48)));
    return _mm512_reduce_add_ps(s);
}
static inline double hsum_f64(const double *a)
{
    __m512d s = _mm512_add_pd(_mm512_add_pd(_mm512_loadu_pd(a), _mm512_loadu_pd(a + 8)),
                              _mm512_add_pd(_mm512_loadu_pd(a + 16), _mm512_loadu_pd(a + 24)));
    return _mm512_reduce_add_pd(s);
}
#elif defined(FASTLN_X86) && VEC_BYTES == 32
static inline float hsum_f32(const float *a)
{
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a + 8)),
                             _mm256_add_ps(_mm256_loadu_ps(a + 16), _mm256_loadu_ps(a + 24)));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
static inline double hsum_f64(const double *a)
{
    __m256d s = _mm256_add_pd(_mm256_add_pd(_mm256_loadu_pd(a), _mm256_loadu_pd(a + 4)),
                              _mm256_add_pd(_mm256_loadu_pd(a + 8), _mm256_loadu_pd(a + 12)));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}
#else
#define HSUM_BY_COMPILER 1
#endif

/* ---- float16 and bfloat16 storage <-> float -------------------------- */

/* One value, round to nearest even (the tails of the vector loops, and the
 * generic path). NaN stays NaN (quiet), infinities and subnormals are kept. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    float f;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);          /* inf, NaN */
    } else if (e) {
        u = sign | ((e + 112) << 23) | (m << 13);   /* normal: rebias 15 -> 127 */
    } else {
        f = (float)m * 0x1p-24f;                     /* zero, subnormal: exact */
        memcpy(&u, &f, 4);
        u |= sign;
    }
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));   /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* 65520 and up: inf */
    if (a >= 0x38800000u)                                       /* a normal half, 2^-14 up */
        return (uint16_t)(sign | ((a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13));
    float v;                                                    /* subnormal half or 0 */
    memcpy(&v, &a, 4);
    return (uint16_t)(sign | (uint32_t)nearbyintf(v * 0x1p24f));
}

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* d[i] = s[i] as float, n values of half storage elem (FASTLN_F16 or
 * FASTLN_BF16). */
static inline void widen_half(int elem, float *d, const uint16_t *s, int64_t n)
{
    int64_t i = 0;
#if defined(FASTLN_X86) && VEC_BYTES == 64
    if (elem == FASTLN_F16)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    else
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_si512(d + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                           _mm256_loadu_si256((const __m256i *)(s + i))), 16));
#elif defined(FASTLN_X86) && VEC_BYTES == 32
    if (elem == FASTLN_F16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    else
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(
                                    _mm_loadu_si128((const __m128i *)(s + i))), 16));
#endif
    for (; i < n; i++) d[i] = elem == FASTLN_F16 ? f16_to_f32(s[i]) : bf16_to_f32(s[i]);
}

#if defined(FASTLN_X86) && VEC_BYTES == 64
/* Keeps v in a register: stops the compiler from folding a conversion into a
 * memory-destination form (VPMOVDW, VCVTPS2PH to memory), which some CPUs run
 * slowly. */
#define IN_REGISTER(v) __asm__("" : "+v"(v))

/* 16 floats to bfloat16, nearest even (NaN stays NaN): the high halves of
 * u + 0x7fff + lsb (of a NaN: u | quiet bit), gathered by VPERMW. */
static inline __m256i bf16_round512(__m512 f)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i odd = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    __m512i u = _mm512_castps_si512(f);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs), inf);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, half),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    __m256i h = _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd, r));
    IN_REGISTER(h);
    return h;
}

static inline __m256i f16_round512(__m512 f)
{
    __m256i h = _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    IN_REGISTER(h);
    return h;
}
#endif

/* d[i] = s[i] rounded to half storage elem (nearest even). bfloat16 by integer rounding:
 * AVX512-BF16's VCVTNEPS2BF16 would flush subnormals to zero. */
static inline void narrow_half(int elem, uint16_t *d, const float *s, int64_t n)
{
    int64_t i = 0;
#if defined(FASTLN_X86) && VEC_BYTES == 64
    if (elem == FASTLN_F16) {
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i), f16_round512(_mm512_loadu_ps(s + i)));
    } else {
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i), bf16_round512(_mm512_loadu_ps(s + i)));
    }
#elif defined(FASTLN_X86) && VEC_BYTES == 32
    if (elem == FASTLN_F16) {
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(d + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff);
        const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
        for (; i + 8 <= n; i += 8) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(s + i));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, half),
                                          _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
            __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
            r = _mm256_blendv_epi8(r, q, nan);
            _mm_storeu_si128((__m128i *)(d + i), _mm_packus_epi32(_mm256_castsi256_si128(r),
                                                                  _mm256_extracti128_si256(r, 1)));
        }
    }
#endif
    for (; i < n; i++) d[i] = elem == FASTLN_F16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
}

#if defined(FASTLN_X86) && VEC_BYTES == 64
/* ---- AVX-512 only -------------------------------------------------------- */

/* reduce16's tree in three steps, for callers that sum their rows in order
 * and combine them as they come (fewer vectors live, the same bits):
 * red_pair: rows 2q, 2q+1 -> per 128-bit lane, even and odd halves;
 * red_quad: two pairs (rows 4r .. 4r+3) -> per 128-bit lane;
 * red_final: the four quads -> lane k the sum of row k. */
static inline __m512 red_pair(__m512 s0, __m512 s1)
{
    return _mm512_add_ps(_mm512_unpacklo_ps(s0, s1), _mm512_unpackhi_ps(s0, s1));
}
static inline __m512 red_quad(__m512 b0, __m512 b1)
{
    __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(b0), _mm512_castps_pd(b1));
    __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(b0), _mm512_castps_pd(b1));
    return _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
}
static inline __m512 red_final(const __m512 *d)
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
static inline __m512 reduce16(const __m512 *s)
{
    __m512 b[8], d[4];
    for (int q = 0; q < 8; q++) b[q] = red_pair(s[2 * q], s[2 * q + 1]);
    for (int r = 0; r < 4; r++) d[r] = red_quad(b[2 * r], b[2 * r + 1]);
    return red_final(d);
}


/* Prefetches into L1 the n bytes that start ahead bytes after p, short of
 * end: in the loops over groups of sixteen rows, the rows a few groups on,
 * and in the long-row backward the part of the rows a few KiB on, where the
 * hardware prefetchers fall behind. always_inline: GCC drops a call to this
 * function that it does not inline, since a prefetch has no effect it can
 * see. */
static inline __attribute__((always_inline)) void pf_ahead(const void *p, int64_t n,
                                                           int64_t ahead, const void *end)
{
    const char *q = (const char *)p + ahead;
    const int64_t left = (const char *)end - q;
    for (int64_t o = 0; o < n && o < left; o += 64) _mm_prefetch(q + o, _MM_HINT_T0);
}

/* Prefetches into L1 the rb bytes of row k of the rows at pf */
static inline __attribute__((always_inline)) void pf_row(const char *pf, int k, int64_t rb)
{
    for (int64_t o = 0; o < rb; o += 64) _mm_prefetch(pf + k * rb + o, _MM_HINT_T0);
}

/* Prefetches for writing (PREFETCHW) the rb bytes at p: an output row's
 * lines, fetched while the row's sums still run, instead of by its stores */
static inline __attribute__((always_inline)) void pfw_row(const void *p, int64_t rb)
{
    for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_ET0);
}

/* The storage of a row's elements (elem): float (ELEM_F32), or half storage,
 * FASTLN_F16 or FASTLN_BF16 (fastln.h), converted in registers. */
#define ELEM_F32 0
static inline int64_t elem_bytes(int elem) { return elem ? 2 : 4; }

/* 16 values of half storage elem at p (lanes m), as floats */
static inline __attribute__((always_inline)) __m512 ld_half(
    int elem, const uint16_t *p, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if (elem == FASTLN_F16) return _mm512_cvtph_ps(h);
    /* bfloat16 i into the high half of lane i, zeros below: one permute
     * (the zero-extend and shift it replaces are two instructions) */
    const __m512i idx = _mm512_slli_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 16);
    return _mm512_castsi512_ps(
        _mm512_maskz_permutexvar_epi16(0xAAAAAAAA, idx, _mm512_zextsi256_si512(h)));
}

/* The narrowing of floats to half storage takes a second argument, bf16i: 1
 * where bfloat16 is rounded by AVX512-BF16's VCVTNEPS2BF16 (one instruction,
 * nearest even), 0 for the integer rounding (bf16_round512) and for
 * float16. The instruction reads subnormal inputs as 0 and flushes subnormal
 * results, so a vector holding a subnormal float takes the integer rounding
 * instead: the bits are the same either way. */

/* bf16i for the stores of elem on this CPU */
static inline int bf16_insn_for(int elem)
{
    return elem == FASTLN_BF16 && fastln_cpu_has_avx512bf16();
}

/* v as bfloat16 by VCVTNEPS2BF16, or by bf16_round512 where v holds a subnormal */
static inline __attribute__((always_inline)) __m256i bf16_by_insn(__m512 v)
{
    if (_mm512_fpclass_ps_mask(v, 0x20)) return bf16_round512(v);   /* 0x20: subnormal */
    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    IN_REGISTER(h);
    return h;
}

/* v as 16 values of half storage elem */
static inline __attribute__((always_inline)) __m256i narrow16(int elem, int bf16i, __m512 v)
{
    return elem == FASTLN_F16 ? f16_round512(v) : bf16i ? bf16_by_insn(v) : bf16_round512(v);
}

/* a, b as 32 values of half storage elem (a's first); bfloat16 with bf16i in
 * one VCVTNE2PS2BF16 where neither holds a subnormal */
static inline __attribute__((always_inline)) __m512i narrow32(int elem, int bf16i, __m512 a,
                                                              __m512 b)
{
    if (elem == FASTLN_BF16 && bf16i && !(_mm512_fpclass_ps_mask(a, 0x20) |
                                          _mm512_fpclass_ps_mask(b, 0x20))) {
        __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        IN_REGISTER(h);
        return h;
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(narrow16(elem, bf16i, a)),
                              narrow16(elem, bf16i, b), 1);
}

/* 16 values (lanes in m) to p; nt: a non-temporal store where p is aligned */
static inline __attribute__((always_inline)) void st_half(
    int elem, int bf16i, uint16_t *p, __m512 v, __mmask16 m, int nt)
{
    __m256i h = narrow16(elem, bf16i, v);
    if (m != (__mmask16)0xFFFF) _mm256_mask_storeu_epi16(p, m, h);
    else if (nt && !((uintptr_t)p & 31)) _mm256_stream_si256((__m256i *)p, h);
    else _mm256_storeu_si256((__m256i *)p, h);
}

/* ---- a float output streamed from registers ------------------------------
 * The rows [r0, r1) a sixteen-row kernel writes are one contiguous block of
 * its output. With rows of a multiple of 16 floats, ntw takes the block's
 * vectors in order and writes it with non-temporal stores of whole aligned
 * lines: a line is the end of one vector and the start of the next (one
 * vpermt2ps; NumPy's large arrays start 16 bytes into a line), and the
 * partial lines at the block's two ends get ordinary masked stores.
 * Against staging a group's rows in L1 and streaming them out with
 * stream_copy, this spares the staging copy; rows of 16 and 32 floats gain
 * nothing (the writer's work per vector weighs more there) and keep the
 * staging block, as do rows of other lengths. The half-storage forwards put
 * pairs of narrowed vectors (32 values, one line's worth) as the floats of
 * a vector (fwd16h_nv). */
typedef struct {
    float *p;          /* the next aligned line (the block's start + f0 until the first put) */
    __m512 carry;      /* the last vector put */
    __m512i idx;       /* lanes f0.. of carry, then lanes ..f0 - 1 of the next vector */
    int f0;            /* floats of the block before its first aligned line */
    int started;
} ntw;

/* Whether ntw writes a block of rows of H floats at dst: floats aligned as
 * floats, rows of 4 or more whole vectors */
static inline int ntw_ok(const float *dst, int64_t H)
{
    return H % 16 == 0 && H >= 64 && !((uintptr_t)dst & 3);
}

/* Whether ntw writes a block of half-storage rows of H values at dst, taken as
 * floats (two values each): rows of an even number of whole vectors, dst
 * aligned as floats */
static inline int ntw_ok16(const uint16_t *dst, int64_t H)
{
    return H % 32 == 0 && !((uintptr_t)dst & 3);
}

static inline void ntw_init(ntw *w, float *dst)
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
static inline __attribute__((always_inline)) void ntw_put(ntw *w, __m512 u)
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
static inline void ntw_put_n(ntw *w, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) ntw_put(w, _mm512_loadu_ps(src + i));
}

/* The tail: the last vector's floats from f0 on (none when nothing was put
 * or f0 is 0). The caller fences the streaming stores (stream_fence). */
static inline void ntw_finish(ntw *w)
{
    if (w->started)
        _mm512_mask_storeu_ps(w->p - w->f0, (__mmask16)~((1u << w->f0) - 1), w->carry);
}

#endif   /* AVX-512 */

#endif
