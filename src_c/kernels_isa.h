/*
 * Compiles kernels_impl.h for one instruction set, for float and double, and
 * defines that path's kernel table. The includer defines:
 *   ISA          the path's suffix (generic, avx2, avx512)
 *   ISA_TARGET   the GCC/clang target string, or leaves it undefined (generic)
 *   ISA_HAS_FMA  1 when the target has fused multiply-add
 *   VEC_BYTES    the vector register width in bytes
 */
#include "internal.h"

#define CAT3_(a, b, c) a##b##c
#define CAT3(a, b, c) CAT3_(a, b, c)

/* _Pragma, because #pragma does not expand the ISA_TARGET macro */
#define PRAGMA_(x) _Pragma(#x)
#define PRAGMA(x) PRAGMA_(x)
#ifdef ISA_TARGET
#if defined(__clang__)
PRAGMA(clang attribute push(__attribute__((target(ISA_TARGET))), apply_to = function))
#elif defined(__GNUC__)
#pragma GCC push_options
PRAGMA(GCC target(ISA_TARGET))
#endif
#endif

/* Non-temporal copy of nbytes: ordinary stores up to the first aligned
 * vector, streaming stores for whole vectors, ordinary stores for the tail. */
#if defined(FASTLN_X86) && VEC_BYTES >= 16
#include <immintrin.h>
static void stream_copy(void *dst, const void *src, size_t nbytes)
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
static void stream_fence(void) { _mm_sfence(); }
#else
static void stream_copy(void *dst, const void *src, size_t nbytes) { memcpy(dst, src, nbytes); }
static void stream_fence(void) {}
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

/* d[i] = s[i] as float, n values of kind FASTLN_F16 or FASTLN_BF16. */
static void widen_half(int kind, float *d, const uint16_t *s, int64_t n)
{
    int64_t i = 0;
#if defined(FASTLN_X86) && VEC_BYTES == 64
    if (kind == FASTLN_F16)
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
    else
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_si512(d + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(
                                           _mm256_loadu_si256((const __m256i *)(s + i))), 16));
#elif defined(FASTLN_X86) && VEC_BYTES == 32
    if (kind == FASTLN_F16)
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    else
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(
                                    _mm_loadu_si128((const __m128i *)(s + i))), 16));
#endif
    for (; i < n; i++) d[i] = kind == FASTLN_F16 ? f16_to_f32(s[i]) : bf16_to_f32(s[i]);
}

#if defined(FASTLN_X86) && VEC_BYTES == 64
/* Keeps v in a register: stops the compiler from folding a conversion into a
 * memory-destination form (VPMOVDW, VCVTPS2PH to memory: slow on AMD Zen 4). */
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

/* d[i] = s[i] rounded to kind (nearest even). bfloat16 by integer rounding:
 * AVX512-BF16's VCVTNEPS2BF16 would flush subnormals to zero. */
static void narrow_half(int kind, uint16_t *d, const float *s, int64_t n)
{
    int64_t i = 0;
#if defined(FASTLN_X86) && VEC_BYTES == 64
    if (kind == FASTLN_F16) {
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i), f16_round512(_mm512_loadu_ps(s + i)));
    } else {
        for (; i + 16 <= n; i += 16)
            _mm256_storeu_si256((__m256i *)(d + i), bf16_round512(_mm512_loadu_ps(s + i)));
    }
#elif defined(FASTLN_X86) && VEC_BYTES == 32
    if (kind == FASTLN_F16) {
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
    for (; i < n; i++) d[i] = kind == FASTLN_F16 ? f32_to_f16(s[i]) : f32_to_bf16(s[i]);
}

#if ISA_HAS_FMA
#define FMA_f32(a, b, c) __builtin_fmaf((a), (b), (c))
#define FMA_f64(a, b, c) __builtin_fma((a), (b), (c))
#else
#define FMA_f32(a, b, c) ((a) * (b) + (c))
#define FMA_f64(a, b, c) ((a) * (b) + (c))
#endif

#define T float
#define SFX(f) CAT3(f, _f32_, ISA)
#define FMA FMA_f32
#define HSUM hsum_f32
#define IS_F32 1
#define GEMM fastln_gemm_f32
#include "kernels_impl.h"
#include "rnn_impl.h"
#undef IS_F32
#undef GEMM
#undef T
#undef SFX
#undef FMA
#undef HSUM

#define T double
#define SFX(f) CAT3(f, _f64_, ISA)
#define FMA FMA_f64
#define HSUM hsum_f64
#define IS_F32 0
#define GEMM fastln_gemm_f64
#include "kernels_impl.h"
#include "rnn_impl.h"
#undef IS_F32
#undef GEMM
#undef T
#undef SFX
#undef FMA
#undef HSUM

#ifdef ISA_TARGET
#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif

#define STR_(s) #s
#define STR(s) STR_(s)

const fastln_kernel_table CAT3(fastln_kernels_, ISA, ) = {
    STR(ISA),
    CAT3(layer_norm, _f32_, ISA),          CAT3(layer_norm, _f64_, ISA),
    CAT3(layer_norm_backward, _f32_, ISA), CAT3(layer_norm_backward, _f64_, ISA),
    CAT3(add_layer_norm, _f32_, ISA),      CAT3(add_layer_norm, _f64_, ISA),
    CAT3(rms_norm, _f32_, ISA),            CAT3(rms_norm, _f64_, ISA),
    CAT3(rms_norm_backward, _f32_, ISA),   CAT3(rms_norm_backward, _f64_, ISA),
    CAT3(half_fwd, _f32_, ISA),            CAT3(half_bwd, _f32_, ISA),
    CAT3(rnn_forward, _f32_, ISA),         CAT3(rnn_forward, _f64_, ISA),
    CAT3(rnn_backward, _f32_, ISA),        CAT3(rnn_backward, _f64_, ISA),
#if VEC_BYTES == 64
    FASTLN_STREAM_BYTES_AVX512,
    FASTLN_STREAM_BYTES_BWD_SHORT,
    FASTLN_STREAM_BYTES_SHORT,
#else
    FASTLN_STREAM_BYTES,
    FASTLN_STREAM_BYTES_BWD,
    0,
#endif
};
