/*
 * The SIMD vocabulary of the kernels written once for every path: vectors of
 * the path's width (VEC_BYTES) holding values of T, and on x86 paths of 256
 * or 512 bits (HAVE_IVEC) vectors of int32, with their operations.
 * type_begin.h includes it once T is chosen; type_end.h undoes it.
 *   SFX(vec)   VL values of T
 *     V_ZERO()  V_LOAD(p)  V_STORE(p, v)  V_SET1(x)
 *     V_ADD(a, b)  V_MUL(a, b)  V_FMA(a, b, c) = a * b + c, one rounding
 *   SFX(ivec)  VIL int32 (HAVE_IVEC)
 *     VI_ZERO()  VI_LOAD(p)  VI_STORE(p, v)  VI_SET1(x)  VI_ADD(a, b)
 *     VI_AND(a, b)  VI_SLL16(a, n), VI_SRL16(a, n), VI_SRA16(a, n): shifts of
 *     the 16-bit halves; VI_MADD16(a, b): the pairs of 16-bit products summed
 *     into int32 (VPMADDWD); VI_TO_V(a): as float (T float only)
 * Unaligned loads and stores.
 */
#if defined(FASTLN_X86)
#include <immintrin.h>
#endif

#if defined(FASTLN_X86) && VEC_BYTES == 64 && IS_F32
typedef __m512 SFX(vec);
#define V_ZERO() _mm512_setzero_ps()
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps((p), (v))
#define V_SET1(x) _mm512_set1_ps(x)
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_MUL(a, b) _mm512_mul_ps((a), (b))
#elif defined(FASTLN_X86) && VEC_BYTES == 64
typedef __m512d SFX(vec);
#define V_ZERO() _mm512_setzero_pd()
#define V_LOAD(p) _mm512_loadu_pd(p)
#define V_STORE(p, v) _mm512_storeu_pd((p), (v))
#define V_SET1(x) _mm512_set1_pd(x)
#define V_FMA(a, b, c) _mm512_fmadd_pd((a), (b), (c))
#define V_ADD(a, b) _mm512_add_pd((a), (b))
#define V_MUL(a, b) _mm512_mul_pd((a), (b))
#elif defined(FASTLN_X86) && VEC_BYTES == 32 && IS_F32
typedef __m256 SFX(vec);
#define V_ZERO() _mm256_setzero_ps()
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps((p), (v))
#define V_SET1(x) _mm256_set1_ps(x)
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_MUL(a, b) _mm256_mul_ps((a), (b))
#elif defined(FASTLN_X86) && VEC_BYTES == 32
typedef __m256d SFX(vec);
#define V_ZERO() _mm256_setzero_pd()
#define V_LOAD(p) _mm256_loadu_pd(p)
#define V_STORE(p, v) _mm256_storeu_pd((p), (v))
#define V_SET1(x) _mm256_set1_pd(x)
#define V_FMA(a, b, c) _mm256_fmadd_pd((a), (b), (c))
#define V_ADD(a, b) _mm256_add_pd((a), (b))
#define V_MUL(a, b) _mm256_mul_pd((a), (b))
#else
/* The generic path: GCC's vector extensions, which compile to the target's
 * vectors (SSE2, NEON) or to scalars. a * b + c is one instruction where the
 * target fuses it, the same one for every element. */
typedef T SFX(vec) __attribute__((vector_size(VEC_BYTES)));
static inline SFX(vec) SFX(vload)(const T *p)
{
    SFX(vec) v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void SFX(vstore)(T *p, SFX(vec) v) { memcpy(p, &v, sizeof v); }
static inline SFX(vec) SFX(vset1)(T x)
{
    SFX(vec) v;
    for (int i = 0; i < (int)(VEC_BYTES / sizeof(T)); i++) v[i] = x;
    return v;
}
#define V_ZERO() ((SFX(vec)){0})
#define V_LOAD(p) SFX(vload)(p)
#define V_STORE(p, v) SFX(vstore)((p), (v))
#define V_SET1(x) SFX(vset1)(x)
#define V_FMA(a, b, c) ((a) * (b) + (c))
#define V_ADD(a, b) ((a) + (b))
#define V_MUL(a, b) ((a) * (b))
#endif
#define VL ((int)(VEC_BYTES / sizeof(T)))

#if defined(FASTLN_X86) && VEC_BYTES == 64
#define HAVE_IVEC 1
typedef __m512i SFX(ivec);
#define VIL 16
#define VI_ZERO() _mm512_setzero_si512()
#define VI_LOAD(p) _mm512_loadu_si512((const void *)(p))
#define VI_STORE(p, v) _mm512_storeu_si512((void *)(p), (v))
#define VI_SET1(x) _mm512_set1_epi32(x)
#define VI_ADD(a, b) _mm512_add_epi32((a), (b))
#define VI_AND(a, b) _mm512_and_si512((a), (b))
#define VI_SLL16(a, n) _mm512_slli_epi16((a), (n))
#define VI_SRL16(a, n) _mm512_srli_epi16((a), (n))
#define VI_SRA16(a, n) _mm512_srai_epi16((a), (n))
#define VI_MADD16(a, b) _mm512_madd_epi16((a), (b))
#if IS_F32
#define VI_TO_V(a) _mm512_cvtepi32_ps(a)
#endif
#elif defined(FASTLN_X86) && VEC_BYTES == 32
#define HAVE_IVEC 1
typedef __m256i SFX(ivec);
#define VIL 8
#define VI_ZERO() _mm256_setzero_si256()
#define VI_LOAD(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define VI_STORE(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), (v))
#define VI_SET1(x) _mm256_set1_epi32(x)
#define VI_ADD(a, b) _mm256_add_epi32((a), (b))
#define VI_AND(a, b) _mm256_and_si256((a), (b))
#define VI_SLL16(a, n) _mm256_slli_epi16((a), (n))
#define VI_SRL16(a, n) _mm256_srli_epi16((a), (n))
#define VI_SRA16(a, n) _mm256_srai_epi16((a), (n))
#define VI_MADD16(a, b) _mm256_madd_epi16((a), (b))
#if IS_F32
#define VI_TO_V(a) _mm256_cvtepi32_ps(a)
#endif
#else
#define HAVE_IVEC 0
#endif
