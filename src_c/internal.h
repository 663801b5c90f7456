/* Internal declarations shared by the dispatcher and the per-ISA kernel files. */
#ifndef FASTLN_INTERNAL_H
#define FASTLN_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "fastln.h"
#include "fastln_rnn.h"

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
static inline void omp_set_num_threads(int n) { (void)n; }
#endif

/* Outputs of at least this many bytes are written with non-temporal stores:
 * with the inputs they exceed the last-level cache (32 MiB here, shared
 * with other guests) and would only evict it (2 threads: (2048, 4096), 32
 * MiB out, 3.0 -> 1.5 ms). add + LayerNorm: s and y together (16 MiB of
 * them, 2 threads: (4096, 512) 0.35 -> 0.52 ms streamed, (8192, 256) 0.46 ->
 * 0.53 ms). Backward reads two arrays for each it writes, so it streams
 * sooner ((4096, 768) 2.4 -> 1.75 ms). The AVX-512 LayerNorm and RMSNorm
 * forwards of float32 and 16-bit rows, which stage their rows in L1 (or
 * stream long ones from registers), stream from FASTLN_STREAM_BYTES_AVX512,
 * where in and out fill the cache (2 threads, float32, 16 MiB out:
 * (262144, 16) 1.14 -> 0.66 ms, (65536, 64) 0.61 -> 0.37 ms, (4096, 1024)
 * 0.49 -> 0.43 ms, RMSNorm (262144, 16) 0.85 -> 0.44 ms, but (16384, 256)
 * 0.42-0.49 -> 0.49-0.51 ms; the same kernels of AVX2 and generic C, and
 * float64's, measured slower streamed there: AVX2 (262144, 16) 4.4 -> 6.5
 * ms, float64 (65536, 32) 0.67 -> 2.1 ms). Rows of at most
 * FASTLN_STREAM_ROW_BYTES qualify (they are staged in L1 where the kernel
 * stages them). */
#ifndef FASTLN_STREAM_BYTES
#define FASTLN_STREAM_BYTES (32.0 * 1024 * 1024)
#endif
#ifndef FASTLN_STREAM_BYTES_AVX512
#define FASTLN_STREAM_BYTES_AVX512 (16.0 * 1024 * 1024)
#endif
/* The AVX-512 LayerNorm and RMSNorm forwards of rows of at most
 * FASTLN_SHORT_ROW_BYTES stream from FASTLN_STREAM_BYTES_SHORT (add +
 * LayerNorm: twice it, s and y together): 16-bit rows on any number of
 * threads, float32 rows on one. Between 4 and 16 MiB out,
 * ordinary stores often ran far slower there (same-process A/B against 16
 * MiB, medians: bfloat16 LayerNorm, 1 thread (32768, 64) 1.08x, (65536, 64)
 * 1.15x, (16384, 256) 1.30-1.36x, 2 threads 1.13x, 1.29x, 1.42-1.51x; float32
 * on 1 thread, LayerNorm (32768, 64) 1.48x, (131072, 16) 1.76x, (16384, 128)
 * 1.20-2.10x, RMSNorm (32768, 64) 1.70x, (16384, 128) 1.44x, bfloat16 RMSNorm
 * (65536, 64) 1.44x). float32 on 2 threads measured 0.67-0.89x for RMSNorm
 * ((32768, 64), (16384, 128), (131072, 16)) and 0.82-1.45x for LayerNorm;
 * rows of 1 KiB 0.82-1.02x (float32 H = 256, bfloat16 H = 512, 1 and 2
 * threads): they keep FASTLN_STREAM_BYTES_AVX512. add + LayerNorm, against
 * 32 MiB of s and y: float32 on 1 thread (16384, 64) 1.59x, (32768, 64)
 * 2.01x, (131072, 16) 2.05x, (8192, 128) 1.10x; bfloat16 (32768, 64) 1.66x
 * and 1.41x (1, 2 threads), (16384, 128) 1.42x and 1.34x, (8192, 256) 1.60x
 * and 1.34x; float32 on 2 threads 0.64x at (8192, 128), 0.89x at (16384,
 * 64). */
#ifndef FASTLN_STREAM_BYTES_SHORT
#define FASTLN_STREAM_BYTES_SHORT (4.0 * 1024 * 1024)
#endif
#define FASTLN_SHORT_ROW_BYTES 512
/* The AVX-512 forwards of longer rows on one thread stream from 8 MiB out
 * (add + LayerNorm: 16 MiB of s and y), not 16 (32). Same-process A/B
 * against 16 MiB, 1 thread, medians of 15 turns: float32 LayerNorm (2048,
 * 1024) 1.02x, (4096, 512) 1.03x, (8192, 256) 1.14x, (1024, 2048) 1.19x,
 * (3072, 1024) 1.53x, (512, 4096) 1.35x, (1536, 2048) 1.69x; RMSNorm
 * 1.17-2.24x; add + LayerNorm 1.35-1.74x on the same shapes. bfloat16 and
 * float16, against 16 MiB: LayerNorm at 8 MiB out ((4096, 1024), (2048,
 * 2048), (8192, 512)) 0.94-1.07x, at 12 MiB 1.10-1.50x; RMSNorm 1.13-1.79x
 * and add + LayerNorm 1.40-1.53x at 8-12 MiB (bfloat16); from 4 MiB,
 * LayerNorm at 5 MiB measured 0.87x. On 2 threads 8 MiB measured 0.72-0.92x
 * in float32 at (2048, 1024), (4096, 512) and (1024, 2048): they keep 16
 * MiB. Measured while the machine ran in its slow state (README, Measured);
 * not yet measured in a fast one. */
#ifndef FASTLN_STREAM_BYTES_1T
#define FASTLN_STREAM_BYTES_1T (8.0 * 1024 * 1024)
#endif
#ifndef FASTLN_STREAM_BYTES_BWD
#define FASTLN_STREAM_BYTES_BWD (8.0 * 1024 * 1024)
#endif
/* The AVX-512 float32 backwards of rows of up to FASTLN_SHORT_BWD_H
 * elements (the sixteen-row kernel) stream dx from
 * FASTLN_STREAM_BYTES_BWD_SHORT: between 4 and 8 MiB of dx, ordinary stores
 * often ran far slower on one thread (dx's read-for-ownership and the rows'
 * reads competing in an L3 shared with other guests). Same-process A/B of
 * the LayerNorm backward against the 8 MiB threshold, dx 16 bytes into a
 * line, in two phases of the machine: 1 thread (12000, 128) 1.83x and 1.18x,
 * (100000, 16) 1.46x and 1.50x, (24000, 64) 1.13x, (50000, 32) 1.49x,
 * (12000, 96) 1.06x, at 4-5 MiB ((16384, 64), (20000, 64), (8500, 128),
 * (10000, 128)) 0.99-1.08x; 2 threads 1.19x and 1.02x, 1.26x and 0.96x,
 * 1.10x, 1.08x, 1.07x, and 0.97-1.03x. bfloat16 measured 0.91-0.95x (1 and 2
 * threads) in the second phase, and longer float rows 0.77-0.92x ((2048,
 * 768), (1500, 1024), (3000, 512), 2 threads): they keep 8 MiB. */
#ifndef FASTLN_STREAM_BYTES_BWD_SHORT
#define FASTLN_STREAM_BYTES_BWD_SHORT (4.0 * 1024 * 1024)
#endif
#define FASTLN_SHORT_BWD_H 128
#define FASTLN_STREAM_ROW_BYTES 32768

/* A backward whose x, dy and dx take at most this many bytes counts as hot
 * in the cache (kernels_impl.h, bwd_range; measured: at H = 4096 the grouped
 * rows win at 1.5 MiB, the fused sweep from 3 MiB on). */
#ifndef FASTLN_BWD_HOT_BYTES
#define FASTLN_BWD_HOT_BYTES (2.0 * 1024 * 1024)
#endif

/* Rows per backward block: depends on N only, never on the thread count,
 * so that dweight/dbias are reduced in the same order on any thread count.
 * Up to 16 blocks (rows / 16, 16 to 256 of them): each block's call and
 * partial sums cost time. Same-process A/B against up to 64 blocks (rows /
 * 64), 2 threads: (1024, 16) 1.22x, (2048, 16) 1.14x, (4096, 16) 1.03-1.21x,
 * (8192, 16) 1.09x, (4096, 64) 1.08x, (1024, 768) 1.46x, (4096, 768) 1.05x;
 * 1 thread (4096, 16) 1.06x. (Up to 32 blocks: 1.01-1.29x.) */
static inline int64_t fastln_row_block(int64_t N)
{
    int64_t rb = (N + 15) / 16;
    return rb < 16 ? 16 : rb > 256 ? 256 : rb;
}

/* Forward operations of the 16-bit storage kernels */
#define FASTLN_OP_LN 0
#define FASTLN_OP_RMS 1
#define FASTLN_OP_ADD 2

/* One instruction-set path: the same kernels compiled for one target.
 * Sizes N, H; nt = threads to use (1 = serial, no OpenMP region); the last
 * argument, stream, asks for non-temporal stores of the outputs. */
typedef struct {
    const char *name;
    int (*ln_f32)(float *, float *, float *, const float *, const float *, const float *,
                  int64_t, int64_t, double, int, int);
    int (*ln_f64)(double *, double *, double *, const double *, const double *,
                  const double *, int64_t, int64_t, double, int, int);
    int (*ln_bwd_f32)(float *, float *, float *, const float *, const float *,
                      const float *, const float *, const float *, int64_t, int64_t, int, int);
    int (*ln_bwd_f64)(double *, double *, double *, const double *, const double *,
                      const double *, const double *, const double *, int64_t, int64_t, int, int);
    int (*add_ln_f32)(float *, float *, float *, float *, const float *, const float *,
                      const float *, const float *, int64_t, int64_t, double, int, int);
    int (*add_ln_f64)(double *, double *, double *, double *, const double *,
                      const double *, const double *, const double *, int64_t, int64_t,
                      double, int, int);
    int (*rms_f32)(float *, float *, const float *, const float *, int64_t, int64_t,
                   double, int, int);
    int (*rms_f64)(double *, double *, const double *, const double *, int64_t, int64_t,
                   double, int, int);
    int (*rms_bwd_f32)(float *, float *, const float *, const float *, const float *,
                       const float *, int64_t, int64_t, int, int);
    int (*rms_bwd_f64)(double *, double *, const double *, const double *, const double *,
                       const double *, int64_t, int64_t, int, int);
    /* float16/bfloat16 storage (kind FASTLN_F16 or FASTLN_BF16), float math:
     * forward op FASTLN_OP_*; backward: RMSNorm when dbias is NULL */
    int (*half_fwd)(int op, int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                    const uint16_t *x, const uint16_t *res, const float *w, const float *b,
                    int64_t N, int64_t H, double eps, int nt, int stream);
    int (*half_bwd)(int kind, uint16_t *dx, float *dw, float *db, const uint16_t *dy,
                    const uint16_t *x, const float *mean, const float *rstd, const float *w,
                    int64_t N, int64_t H, int nt, int stream);
    /* LN-RNN layer (rnn_engine.h); nt as above */
    int (*rnn_fwd_f32)(const fastln_rnn_args *, int);
    int (*rnn_fwd_f64)(const fastln_rnn_args *, int);
    int (*rnn_bwd_f32)(const fastln_rnn_args *, int);
    int (*rnn_bwd_f64)(const fastln_rnn_args *, int);
    /* the streaming threshold (bytes out) of this path's float32 and 16-bit
     * LayerNorm and RMSNorm forwards, and of the float32 backwards' dx for
     * rows of up to FASTLN_SHORT_BWD_H elements */
    double stream_bytes;
    double stream_bytes_bwd_short;
    /* the forwards' threshold for rows of up to FASTLN_SHORT_ROW_BYTES
     * (16-bit, or float32 on one thread; add + LayerNorm: twice it, for s
     * and y together), or 0: none */
    double stream_bytes_short;
} fastln_kernel_table;

extern const fastln_kernel_table fastln_kernels_generic;
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define FASTLN_X86 1
extern const fastln_kernel_table fastln_kernels_avx2;
extern const fastln_kernel_table fastln_kernels_avx512;
#endif

/* Whether the CPU has AVX512-BF16 (dispatch.c). */
int fastln_cpu_has_avx512bf16(void);

/* The path in use (dispatch.c). */
const fastln_kernel_table *fastln_kernels(void);

/* ---- LN-RNN helpers shared by every path (rnn.c) ---- */

/* Where each cached array of one layer starts, in elements, or -1 if unused:
 * xih, xhh, act (T, B, G): normalized A_ih, normalized A_hh, activations
 * (GRU only: LSTM backward recomputes its gates from xih and xhh, which costs
 * less than writing and reading 4H more values per row and step);
 * hseq, cseq (T+1, B, H): h_{t-1} and c_{t-1} at index t; xc (T, B, H): the
 * normalized c (LSTM); rstd (T, B, nrstd). A plain LSTM keeps its gates'
 * pre-activations in xih, and h, c; a plain RNN only h.
 * fastln_rnn_layout_for returns FASTLN_EINVAL for an unknown cell. */
typedef struct {
    int cell, plain;   /* the cell without FASTLN_CELL_PLAIN, and that flag */
    int gates, nrstd, split;   /* split: dA_ih and dA_hh are separate arrays */
    int64_t G, gw, xih, xhh, act, hseq, cseq, xc, rstd, size;   /* gw: see rnn_cells.h */
} fastln_rnn_layout;
int fastln_rnn_layout_for(fastln_rnn_layout *L, int cell, int64_t T, int64_t B, int64_t H);

/* Row-major C (M, N) = alpha * op(A) op(B) + beta * C through BLAS, or a C
 * loop when none is set. ta, tb: 'N' or 'T'. Sizes must fit in int. */
void fastln_gemm_f32(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc);
void fastln_gemm_f64(char ta, char tb, int64_t M, int64_t N, int64_t K, double alpha,
                     const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                     double *C, int64_t ldc);

/* Packed weights for the recurrent kernels: panels of FASTLN_NR columns of
 * the product, each (K, FASTLN_NR) row-major, zero-padded past N.
 * pack_nt: W is (N, K), for C = A W^T;  pack_nn: W is (K, N), for C = A W. */
#define FASTLN_NR 32
int64_t fastln_packed_size(int64_t N, int64_t K);
void fastln_pack_nt(float *P, const float *W, int64_t N, int64_t K);
void fastln_pack_nn(float *P, const float *W, int64_t K, int64_t N);

/* dst = src over the threads a kernel would use (the benchmarks' ceiling). */
void fastln_parallel_copy(void *dst, const void *src, int64_t nbytes, int nt_stores);

#endif
