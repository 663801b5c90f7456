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
#include "kernels_impl.h"
#undef T
#undef SFX
#undef FMA

#define T double
#define SFX(f) CAT3(f, _f64_, ISA)
#define FMA FMA_f64
#include "kernels_impl.h"
#undef T
#undef SFX
#undef FMA

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
};
