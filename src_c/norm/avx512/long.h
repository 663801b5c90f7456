/*
 * The pieces shared by the long-row kernels of AVX-512 (long_fwd.c,
 * long_bwd.c): loads and stores of a row's elements in any storage,
 * the lane masks of a chunk's tail, the horizontal sum in the lane order of
 * the one-row code (norm/stats.h), and the staging row of streamed rows.
 */
#include "isa/simd.h"

/* Streamed forward rows of up to this many bytes (backward: shorter, see
 * fastln_avx512_long_bwd) are written to an L1 staging row and streamed out
 * after it: for such rows the y sweep's own non-temporal stores, which start
 * and end on partial lines, are slower; for longer rows they are faster.
 * add + LayerNorm streams both s and y from the sweep. */
#define STAGE_ROW_BYTES 4096

static inline __attribute__((always_inline)) __m512 ld_k(
    int elem, const void *p, int64_t i, __mmask16 m)
{
    return elem == ELEM_F32 ? _mm512_maskz_loadu_ps(m, (const float *)p + i)
                            : ld_half(elem, (const uint16_t *)p + i, m);
}

/* lanes m of v to element i of p; nt: non-temporal where aligned */
static inline __attribute__((always_inline)) void st_k(
    int elem, int bf16i, void *p, int64_t i, __m512 v, __mmask16 m, int nt)
{
    if (elem != ELEM_F32) {
        st_half(elem, bf16i, (uint16_t *)p + i, v, m, nt);
        return;
    }
    float *q = (float *)p + i;
    if (m != (__mmask16)0xFFFF) _mm512_mask_storeu_ps(q, m, v);
    else if (nt && !((uintptr_t)q & 63)) _mm512_stream_ps(q, v);
    else _mm512_storeu_ps(q, v);
}

/* In the last, partial 64 elements at i of a chunk of n: the lanes of
 * accumulator k (elements i + 16k .. i + 16k + 15) that lie in the chunk */
#define TAILMASK(n, i, k) (n - i - 16 * (k) >= 16 ? (__mmask16)0xFFFF                 \
                           : n - i <= 16 * (k) ? (__mmask16)0                         \
                           : (__mmask16)((1u << (n - i - 16 * (k))) - 1))

/* The sum of the 64 lanes of a[0..3], as hsum adds sum_shifted's acc[64] */
static inline float hsum4(const __m512 *a)
{
    float acc[64];
    for (int q = 0; q < 4; q++) _mm512_storeu_ps(acc + 16 * q, a[q]);
    return SFX(hsum)(acc);
}

