/*
 * gemm/: the matrix products of the recurrent engine, the engine's own (no
 * BLAS): every element of a product one sum over k in a fixed order.
 *   gemm.h     the float and double panels (FASTLN_NR columns each) and
 *              their packers (pack.c)
 *   packed.h   C (+)= A W over packed panels, for float and double on every
 *              path; the large products of a layer (gemm_big)
 *   bf16.h     bfloat16 weights: pair panels, VDPBF16PS and AMX tiles
 *              (AVX-512, float)
 *   int8.h     int8 weights: quad panels (fastln_i8_quad), rows of A
 *              quantized at run time, exact int32 sums (float)
 * packed.h, bf16.h and int8.h are written once per (element type, ISA) and
 * compiled by each instruction-set path (through rnn/products.h).
 * gemm/ includes isa/, runtime/ and the public headers.
 */
#ifndef FASTLN_GEMM_H
#define FASTLN_GEMM_H

#include <stdint.h>

/* Packed weights (packed.h): panels of NR columns of the product, each
 * (K, NR) row-major, zero-padded past N; a panel row is 128 bytes,
 * FASTLN_NR floats or FASTLN_NR_F64 doubles. pack_nt: W is (N, K), for
 * C = A W^T;  pack_nn: W is (K, N), for C = A W; W's rows ldw apart. The
 * packers share the panels among the threads of an enclosing parallel
 * region (orphaned omp for, with its barrier), and run serially outside
 * one. */
#define FASTLN_NR 32
#define FASTLN_NR_F64 16
int64_t fastln_packed_size(int64_t N, int64_t K);
void fastln_pack_nt(float *P, const float *W, int64_t N, int64_t K, int64_t ldw);
void fastln_pack_nn(float *P, const float *W, int64_t K, int64_t N, int64_t ldw);
int64_t fastln_packed_size_f64(int64_t N, int64_t K);
void fastln_pack_nt_f64(double *P, const double *W, int64_t N, int64_t K, int64_t ldw);
void fastln_pack_nn_f64(double *P, const double *W, int64_t K, int64_t N, int64_t ldw);

/* The operands of packed_gemm_any (packed.h): values of T against panels
 * of T, or bfloat16 rows against bfloat16 pair panels (bf16.h) by
 * VDPBF16PS or on AMX tiles */
typedef enum { FASTLN_GEMM_T, FASTLN_GEMM_BF16, FASTLN_GEMM_AMX } fastln_gemm_kind;

/* The int8 quad panels (int8.h): W (N, K) int8 in panels of FASTLN_NR
 * columns, K rounded up to whole quads of 4, zero-padded past K and N. A
 * panel is a run of quads, quad q holding the values k = 4q .. 4q+3 of
 * each of its columns, column j (row n = panel * FASTLN_NR + j of W) at
 * col[j]: so one 64-byte vector holds sixteen columns' quads, the operand
 * of VPDPBUSD. */
typedef struct {
    int8_t col[FASTLN_NR][4];
} fastln_i8_quad;

/* How an x86 int8 tile adds a quad of k (int8.h): VPMADDWD on the bytes
 * widened to 16 bits, or VPDPBUSD (AVX512-VNNI) */
typedef enum { FASTLN_I8_MADD, FASTLN_I8_VNNI } fastln_i8_kernel;

#endif
