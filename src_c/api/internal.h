/* Internal declarations shared by the dispatcher and the per-ISA kernel files. */
#ifndef FASTLN_INTERNAL_H
#define FASTLN_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "api/fastln.h"
#include "api/fastln_rnn.h"
#include "runtime/policy.h"

#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
static inline void omp_set_num_threads(int n) { (void)n; }
#endif

/* p rounded up to a multiple of 64 bytes (a block allocated with 64 bytes to
 * spare): vectors and AMX tile rows read from there are whole cache lines */
static inline void *fastln_align64(void *p) { return (char *)p + (-(uintptr_t)p & 63); }

/* Forward operations of the 16-bit storage kernels */
#define FASTLN_OP_LN 0
#define FASTLN_OP_RMS 1
#define FASTLN_OP_ADD 2

/* A general fused add + norm (norm_add.h): s = x + res[n % R] (+ bi), y =
 * LayerNorm(s), or RMSNorm(s) with rms (mean, b unused). elem 0: x, res,
 * y, s of the kernel's type; FASTLN_F16, FASTLN_BF16: half storage (float
 * kernels only). mean, rstd, bi, w, b are of the kernel's type; any may be
 * NULL but x, res, y, s. */
typedef struct {
    int rms, elem;
    void *y, *s, *mean, *rstd;
    const void *x, *res, *bi, *w, *b;
    int64_t N, H, R;
    double eps;
} fastln_add_args;

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
    /* the general fused add + norm, and the fused add's backward: dx plus ds,
     * di the column sums of that dx; LayerNorm with db, else RMSNorm; ds
     * and di may be NULL */
    int (*add_norm_f32)(const fastln_add_args *, int nt, int stream);
    int (*add_norm_f64)(const fastln_add_args *, int nt, int stream);
    int (*add_bwd_f32)(float *dx, float *dw, float *db, float *di, const float *dy,
                       const float *x, const float *ds, const float *mean, const float *rstd,
                       const float *w, int64_t N, int64_t H, int nt, int stream);
    int (*add_bwd_f64)(double *dx, double *dw, double *db, double *di, const double *dy,
                       const double *x, const double *ds, const double *mean,
                       const double *rstd, const double *w, int64_t N, int64_t H, int nt,
                       int stream);
    /* channels-first (N, C, S) LayerNorm, or RMSNorm with rms (norm_channels.h) */
    int (*cf_f32)(float *, float *, float *, const float *, const float *, const float *,
                  int64_t, int64_t, int64_t, double, int, int, int);
    int (*cf_f64)(double *, double *, double *, const double *, const double *,
                  const double *, int64_t, int64_t, int64_t, double, int, int, int);
    /* its backward: dx, dweight, dbias, dy, x, mean, rstd, weight (RMSNorm
     * where mean is NULL), N, C, S, nt, stream */
    int (*cf_bwd_f32)(float *, float *, float *, const float *, const float *, const float *,
                      const float *, const float *, int64_t, int64_t, int64_t, int, int);
    int (*cf_bwd_f64)(double *, double *, double *, const double *, const double *,
                      const double *, const double *, const double *, int64_t, int64_t,
                      int64_t, int, int);
    /* LN-RNN layer (rnn_engine.h); nt as above */
    int (*rnn_fwd_f32)(const fastln_rnn_args *, int);
    int (*rnn_fwd_f64)(const fastln_rnn_args *, int);
    int (*rnn_bwd_f32)(const fastln_rnn_args *, int);
    int (*rnn_bwd_f64)(const fastln_rnn_args *, int);
    /* float <-> half storage (norm_half.h) */
    int (*half_convert)(int elem, int widen, void *dst, const void *src, int64_t n, int nt);
    /* fastln_rnn_pack on this path (out NULL: the size; see rnn_pack.h) */
    int64_t (*rnn_pack)(void *out, int64_t size, int cell, int wtype, int64_t input,
                        int64_t hidden,
                        const void *w_ih, const void *w_hh, int nt);
} fastln_kernel_table;

extern const fastln_kernel_table fastln_kernels_generic;
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#define FASTLN_X86 1
extern const fastln_kernel_table fastln_kernels_avx2;
extern const fastln_kernel_table fastln_kernels_avx512;
#endif

/* Whether the CPU has AVX512-BF16; whether this process may use AMX-BF16
 * tiles (dispatch.c). */
int fastln_cpu_has_avx512bf16(void);
int fastln_cpu_has_amx_bf16(void);
int fastln_cpu_has_avx512vnni(void);

/* Where a bfloat16 layer's products run on the path in use, as the engine
 * chooses (rnn_pack.h: pair panels on the AVX-512 path of a CPU with
 * AVX512-BF16, on AMX tiles where they are usable): "AMX", "AVX512-BF16",
 * or "float32" (weights widened into the float kernels' panels) (rnn.c). */
const char *fastln_rnn_bf16_products(void);
const char *fastln_rnn_int8_products(void);

/* The default thread count where none is set and OpenMP's is unchanged
 * since load; 0: OpenMP's (dispatch.c). */
void fastln_set_default_threads(int n);

/* dst (n) = src (n) converted between float and half storage kind
 * (FASTLN_F16, FASTLN_BF16): with widen uint16_t to float, else float to
 * uint16_t, nearest even; on the threads of a kernel on n values
 * (dispatch.c). FASTLN_EINVAL for a bad kind or n < 0. */
int fastln_half_convert(int kind, int widen, void *dst, const void *src, int64_t n);

/* The path in use (dispatch.c). */
const fastln_kernel_table *fastln_kernels(void);

/* ---- LN-RNN helpers shared by every path (rnn.c) ---- */

/* Where each cached array of one layer starts, in elements, or -1 if unused:
 * xih, xhh, act (T, B, G): normalized A_ih, normalized A_hh, activations
 * (GRU only: LSTM backward recomputes its gates from xih and xhh, which costs
 * less than writing and reading 4H more values per row and step);
 * hseq, cseq (T+1, B, H): h_{t-1} and c_{t-1} at index t; xc (T, B, H): the
 * normalized c (LSTM), h W_hn^T + bias_hn (plain GRU) or r h (RESET_FIRST); rstd (T, B,
 * nrstd). A plain LSTM keeps its gates' pre-activations in xih, and h, c; a
 * plain GRU its gates (r, z, n) in act; a plain RNN only h. Indexed by step,
 * which is time run backwards in a reverse layer.
 * fastln_rnn_layout_for returns FASTLN_EINVAL for an unknown cell. */
typedef struct {
    int cell, plain;   /* the cell without FASTLN_CELL_PLAIN, and that flag */
    int reset_first;   /* FASTLN_CELL_RESET_FIRST (plain GRU): xc holds r h_{t-1} */
    int gates, nrstd, split;   /* split: dA_ih and dA_hh are separate arrays */
    int64_t G, gw, xih, xhh, act, hseq, cseq, xc, rstd, size;   /* gw: see rnn_cells.h */
} fastln_rnn_layout;
int fastln_rnn_layout_for(fastln_rnn_layout *L, int cell, int64_t T, int64_t B, int64_t H);

/* Packed weights for the recurrent engine's products (gemm_packed.h):
 * panels of NR columns of the product, each (K, NR) row-major, zero-padded
 * past N; a panel row is 128 bytes, FASTLN_NR floats or FASTLN_NR_F64
 * doubles. pack_nt: W is (N, K), for C = A W^T;  pack_nn: W is (K, N), for
 * C = A W; W's rows ldw apart. */
#define FASTLN_NR 32
#define FASTLN_NR_F64 16
int64_t fastln_packed_size(int64_t N, int64_t K);
void fastln_pack_nt(float *P, const float *W, int64_t N, int64_t K, int64_t ldw);
void fastln_pack_nn(float *P, const float *W, int64_t K, int64_t N, int64_t ldw);
int64_t fastln_packed_size_f64(int64_t N, int64_t K);
void fastln_pack_nt_f64(double *P, const double *W, int64_t N, int64_t K, int64_t ldw);
void fastln_pack_nn_f64(double *P, const double *W, int64_t K, int64_t N, int64_t ldw);

/* The header of fastln_rnn_pack's output: what it packed, and how (the
 * format of one path's kernels). The engine uses packed weights only when
 * all of it matches the layer and the path. */
#define FASTLN_PACK_MAGIC 0x504e4c46u   /* "FLNP" */
#define FASTLN_PACK_F32 1               /* float panels (fastln_pack_nt) */
#define FASTLN_PACK_BF16 2              /* bfloat16 pair panels (gemm_bf16.h) */
#define FASTLN_PACK_I8 3                /* int8 quad panels (gemm_int8.h) */
#define FASTLN_PACK_F64 4               /* double panels (fastln_pack_nt_f64) */
typedef struct {
    uint32_t magic;
    int32_t format, cell, reserved;
    int64_t input, hidden;
    char pad[32];   /* the parts start 64 bytes in */
} fastln_rnn_pack_header;

/* dst = src over the threads a kernel would use (the benchmarks' ceiling). */
void fastln_parallel_copy(void *dst, const void *src, int64_t nbytes, int nt_stores);

#endif
