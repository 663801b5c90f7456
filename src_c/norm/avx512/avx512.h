/*
 * norm/avx512/: the float row kernels of the AVX-512 path, one family per
 * file, for rows of float or of float16/bfloat16 storage converted in
 * registers, each file compiled for AVX-512 apart from the path's other code:
 *   rows16_fwd.c       forwards, float rows of up to FWD16_MAX_H, sixteen at a time
 *   rows16_fwd_half.c  the same for float16/bfloat16 rows
 *   rows16_bwd.c       backward, rows of up to BWD16_MAX_H, sixteen at a time
 *   long_fwd.c         forwards of longer rows, one sweep a row
 *   long_bwd.c         backward of longer rows, one sweep a row
 *   rows16.h, rows16_fwd.h, long.h   the pieces their families share
 * This header declares them. paths/avx512.c calls them from its row ranges
 * (norm/range.h, add.h, half.h) and gives them the one-row code they fall
 * back to (norm/rows.h). The kernels include isa/, runtime/, the public
 * headers and the lane sums and statistics of norm/ (sums.h, stats.h,
 * bwd_stats.h), so that their rows get the bits of the one-row code.
 *
 * elem: the storage of x, y, dx, dy, residual and s: ELEM_F32, FASTLN_F16 or
 * FASTLN_BF16. mean, rstd, weight, bias and the dweight/dbias partials pw, pb
 * are float. Rows [r0, r1) of H elements; pb == NULL: RMSNorm backward.
 * stream: non-temporal stores of the outputs (fenced before returning).
 */
#ifndef FASTLN_AVX512_H
#define FASTLN_AVX512_H
#include <stdint.h>
#include "runtime/policy.h"


#define BWD16_MAX_H 128   /* the backward goes sixteen rows at a time up to this */
#define FWD16_MAX_H 256   /* the forwards go sixteen rows at a time up to this */
#if BWD16_MAX_H != FASTLN_SHORT_BWD_H   /* the backward's streaming threshold follows it */
#error "BWD16_MAX_H and FASTLN_SHORT_BWD_H differ"
#endif

/* LayerNorm (rms 0), RMSNorm (rms 1) or, with res, add + LayerNorm (y and
 * s = x + res) of float rows, H <= FWD16_MAX_H */
void fastln_avx512_fwd_rows16(int rms, float *y, float *s, float *mean, float *rstd,
                              const float *x, const float *res, const float *w, const float *b,
                              int64_t r0, int64_t r1, int64_t H, double eps, int stream);

/* The same of float16/bfloat16 rows; buf: 17H floats of scratch */
void fastln_avx512_fwd_rows16_half(int rms, int elem, uint16_t *y, uint16_t *s, float *mean,
                                   float *rstd, const uint16_t *x, const uint16_t *res,
                                   const float *w, const float *b, int64_t r0, int64_t r1,
                                   int64_t H, double eps, int stream, float *buf);

/* LayerNorm or RMSNorm backward, H <= BWD16_MAX_H: dx, and the rows' dy*xhat
 * (and dy) added to pw (pb); rows up to re >= r1 may be prefetched */
void fastln_avx512_bwd_rows16(int elem, void *dx, float *pw, float *pb, const void *dy,
                              const void *x, const float *mean, const float *rstd,
                              const float *w, int64_t r0, int64_t r1, int64_t re, int64_t H,
                              int stream);

/* The forwards of rows longer than FWD16_MAX_H, as fastln_avx512_fwd_rows16,
 * and with res and rms add + RMSNorm; buf: 2H floats of scratch for
 * float16/bfloat16 rows */
void fastln_avx512_long_fwd(int elem, int rms, void *y, void *s, float *mean, float *rstd,
                            const void *x, const void *res, const float *w, const float *b,
                            int64_t r0, int64_t r1, int64_t H, double eps, float *buf,
                            int stream);

/* The backward of rows longer than BWD16_MAX_H, as fastln_avx512_bwd_rows16;
 * buf as fastln_avx512_long_fwd's */
void fastln_avx512_long_bwd(int elem, void *dx, float *pw, float *pb, const void *dy,
                            const void *x, const float *mean, const float *rstd,
                            const float *w, int64_t r0, int64_t r1, int64_t H, float *buf,
                            int stream);

/* One row of the portable float kernels (norm/rows.h, in paths/avx512.c):
 * the rows whose float statistics the kernels above cannot trust */
void fastln_avx512_ln_row(float *y, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int64_t H, double eps);
void fastln_avx512_rms_row(float *y, float *rstd, const float *x, const float *w, int64_t H,
                           double eps);

#endif
