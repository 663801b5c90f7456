/*
 * paths/: the instruction-set paths. Each compiles every kernel of norm/,
 * gemm/ and rnn/ for one target (kernels.h, once per path: generic.c,
 * avx2.c, avx512.c) into a table of functions, fastln_kernel_table, below;
 * select.c chooses the path at first use (the CPU, FASTLN_ISA) and holds
 * fastln_get_isa, fastln_set_isa and fastln_isa_supported. The entry points
 * (api/) call the kernels through the table of the path in use.
 * paths/ includes every folder but api/ (the public headers aside).
 */
#ifndef FASTLN_TABLE_H
#define FASTLN_TABLE_H

#include <stdint.h>
#include "api/fastln_rnn.h"
#include "isa/isa.h"
#include "norm/norm.h"

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
    int (*half_fwd)(fastln_norm_op op, int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
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
    /* channels-first (N, C, S) LayerNorm, or RMSNorm with rms (norm/channels.h) */
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
    /* LN-RNN layer (rnn/forward.h, backward.h); nt as above */
    int (*rnn_fwd_f32)(const fastln_rnn_args *, int);
    int (*rnn_fwd_f64)(const fastln_rnn_args *, int);
    int (*rnn_bwd_f32)(const fastln_rnn_args *, int);
    int (*rnn_bwd_f64)(const fastln_rnn_args *, int);
    /* float <-> half storage (norm/half.h) */
    int (*half_convert)(int elem, int widen, void *dst, const void *src, int64_t n, int nt);
    /* fastln_rnn_pack on this path (out NULL: the size; see rnn/pack.h) */
    int64_t (*rnn_pack)(void *out, int64_t size, int cell, int wtype, int64_t input,
                        int64_t hidden, int64_t proj, const void *w_ih, const void *w_hh,
                        const void *w_hr, int nt);
} fastln_kernel_table;

extern const fastln_kernel_table fastln_kernels_generic;
#ifdef FASTLN_X86
extern const fastln_kernel_table fastln_kernels_avx2;
extern const fastln_kernel_table fastln_kernels_avx512;
#endif

/* The path in use (select.c). */
const fastln_kernel_table *fastln_kernels(void);

#endif
