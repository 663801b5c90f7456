/*
 * The float and double panels of the packed products (gemm.h), the same on
 * every path.
 */
#include <string.h>
#include "gemm/gemm.h"
#include "isa/isa.h"
#if defined(FASTLN_X86)
#include <xmmintrin.h>
#endif

int64_t fastln_packed_size(int64_t N, int64_t K)
{
    return (N + FASTLN_NR - 1) / FASTLN_NR * K * FASTLN_NR;
}

/* Panels are shared among the threads of an enclosing parallel region
 * (orphaned omp for, with its barrier); serial outside one. Row n of W
 * becomes column j of its panel: on x86, 4 rows and 4 values of k at a
 * time through a 4 x 4 transpose in SSE registers (the baseline of every
 * x86-64 build), which makes packing a small matrix, as a single step with
 * writable weights needs, cost a fraction of the scalar copy. */
void fastln_pack_nt(float *P, const float *W, int64_t N, int64_t K, int64_t ldw)
{
    int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        float *panel = P + p * K * FASTLN_NR;
        for (int j = 0; j < FASTLN_NR; j += 4) {
            int64_t n = p * FASTLN_NR + j, k = 0;
#if defined(FASTLN_X86)
            if (n + 4 <= N)
                for (; k + 4 <= K; k += 4) {
                    const float *w = W + n * ldw + k;
                    __m128 r0 = _mm_loadu_ps(w), r1 = _mm_loadu_ps(w + ldw);
                    __m128 r2 = _mm_loadu_ps(w + 2 * ldw), r3 = _mm_loadu_ps(w + 3 * ldw);
                    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                    float *d = panel + k * FASTLN_NR + j;
                    _mm_storeu_ps(d, r0);
                    _mm_storeu_ps(d + FASTLN_NR, r1);
                    _mm_storeu_ps(d + 2 * FASTLN_NR, r2);
                    _mm_storeu_ps(d + 3 * FASTLN_NR, r3);
                }
#endif
            for (; k < K; k++)
                for (int i = 0; i < 4; i++)
                    panel[k * FASTLN_NR + j + i] = n + i < N ? W[(n + i) * ldw + k] : 0.0f;
        }
    }
}

/* Panels of nr columns from W (K, N), element size es: panel row k is a
 * slice of row k of W, zero past N (all-zero bytes: 0.0 in float and
 * double). Shared by the team as fastln_pack_nt. */
static void pack_nn_any(char *P, const char *W, int64_t K, int64_t N, int64_t ldw, size_t es,
                        int64_t nr)
{
    int64_t np = (N + nr - 1) / nr;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        char *panel = P + (size_t)(p * K * nr) * es;
        int64_t n0 = p * nr, w = N - n0 < nr ? N - n0 : nr;
        for (int64_t k = 0; k < K; k++) {
            char *row = panel + (size_t)(k * nr) * es;
            memcpy(row, W + (size_t)(k * ldw + n0) * es, (size_t)w * es);
            memset(row + (size_t)w * es, 0, (size_t)(nr - w) * es);
        }
    }
}

void fastln_pack_nn(float *P, const float *W, int64_t K, int64_t N, int64_t ldw)
{
    pack_nn_any((char *)P, (const char *)W, K, N, ldw, sizeof(float), FASTLN_NR);
}

int64_t fastln_packed_size_f64(int64_t N, int64_t K)
{
    return (N + FASTLN_NR_F64 - 1) / FASTLN_NR_F64 * K * FASTLN_NR_F64;
}

/* The double panels, as fastln_pack_nt makes the float ones: a panel's row
 * k holds W[n][k] for its FASTLN_NR_F64 rows n, zero past N. */
void fastln_pack_nt_f64(double *P, const double *W, int64_t N, int64_t K, int64_t ldw)
{
    int64_t np = (N + FASTLN_NR_F64 - 1) / FASTLN_NR_F64;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        double *panel = P + p * K * FASTLN_NR_F64;
        int64_t n0 = p * FASTLN_NR_F64, w = N - n0 < FASTLN_NR_F64 ? N - n0 : FASTLN_NR_F64;
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < FASTLN_NR_F64; j++)
                panel[k * FASTLN_NR_F64 + j] = j < w ? W[(n0 + j) * ldw + k] : 0.0;
    }
}

void fastln_pack_nn_f64(double *P, const double *W, int64_t K, int64_t N, int64_t ldw)
{
    pack_nn_any((char *)P, (const char *)W, K, N, ldw, sizeof(double), FASTLN_NR_F64);
}
