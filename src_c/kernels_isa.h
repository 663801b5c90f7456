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
    CAT3(rnn_forward, _f32_, ISA),         CAT3(rnn_forward, _f64_, ISA),
    CAT3(rnn_backward, _f32_, ISA),        CAT3(rnn_backward, _f64_, ISA),
};
