/*
 * The lane sums of the row statistics, written once per (element type, ISA)
 * (isa/type_begin.h): sums are taken in NACC independent lanes (four vector
 * registers of VEC_BYTES) per chunk of CHUNK elements, and the chunk sums
 * are added in double. The AVX-512 kernels (norm/avx512/) keep these lanes, so
 * that their rows get the bits of the one-row code.
 */
#include "isa/simd.h"

#define NACC ((int)(4 * VEC_BYTES / sizeof(T)))
#define CHUNK 1024

/* Zeroes NACC accumulators. On AVX2 (128 bytes) GCC turns the plain loop,
 * in float, into a memset that it expands as rep stos, whose start-up cost
 * is near that of a whole row's sums for rows of a few vectors: four vector
 * stores instead. */
static inline void SFX(acc_zero)(T *acc)
{
#if HAVE_IVEC && VEC_BYTES == 32
    SFX(ivec) z = VI_ZERO(), *a = (SFX(ivec) *)acc;
    VI_STORE(a, z);
    VI_STORE(a + 1, z);
    VI_STORE(a + 2, z);
    VI_STORE(a + 3, z);
#else
    for (int k = 0; k < NACC; k++) acc[k] = 0;
#endif
}

/* acc[0] + ... + acc[NACC-1] as a vector reduction, not a serial chain */
static inline T SFX(hsum)(const T *acc)
{
#ifdef HSUM_BY_COMPILER
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int k = 0; k < NACC; k++) s += acc[k];
    return s;
#else
    return HSUM(acc);
#endif
}

/* sum over the row of (x[i] - shift) */
