/*
 * Opens the code of one instruction-set path: every function from here to
 * isa_end.h is compiled for that target. The includer defines:
 *   ISA          the path's suffix (generic, avx2, avx512)
 *   ISA_TARGET   the GCC/clang target string, or leaves it undefined (generic)
 *   ISA_HAS_FMA  1 when the target has fused multiply-add
 *   VEC_BYTES    the vector register width in bytes
 * Then type_begin.h selects the element type of the kernels that follow;
 * the SIMD helpers (simd.h) come after this file, which sets their target.
 */
#include "isa/isa.h"

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

#if ISA_HAS_FMA
#define FMA_f32(a, b, c) __builtin_fmaf((a), (b), (c))
#define FMA_f64(a, b, c) __builtin_fma((a), (b), (c))
#else
#define FMA_f32(a, b, c) ((a) * (b) + (c))
#define FMA_f64(a, b, c) ((a) * (b) + (c))
#endif
