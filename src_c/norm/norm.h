/*
 * norm/: LayerNorm and RMSNorm, written once per (element type, ISA) and
 * compiled by each instruction-set path (paths/kernels.h includes them in
 * this order, each needing those before it):
 *   sums.h       the lane sums of the row statistics
 *   stats.h      a row's forward statistics and normalize sweep
 *   bwd_stats.h  a row's backward scalars
 *   rows.h       the portable row kernels: forward and backward over a range
 *                of rows
 *   range.h      the row kernels of a path: the AVX-512 float kernels
 *                (avx512/) or rows.h's
 *   add.h        the fused residual add + norm, and its backward
 *   half.h       float16 and bfloat16 storage
 *   drivers.h    the rows of a call split over threads: the kernel table's
 *                norm functions
 *   channels.h   channels-first (N, C, S) LayerNorm and RMSNorm
 *   avx512/      the float row kernels of the AVX-512 path, compiled apart
 * This header: what the entry points (api/norm.c) hand to the kernels.
 * norm/ includes isa/, runtime/ and the public headers.
 */
#ifndef FASTLN_NORM_H
#define FASTLN_NORM_H

#include <stdint.h>

/* The forward operations of the float16/bfloat16 storage kernels */
typedef enum { FASTLN_OP_LN, FASTLN_OP_RMS, FASTLN_OP_ADD } fastln_norm_op;

/* A general fused add + norm (add.h): s = x + res[n % R] (+ bi), y =
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

#endif
