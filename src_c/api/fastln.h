/*
 * fastln: Layer Normalization and RMS Normalization kernels for CPUs.
 *
 * Plain C99, no Python. Every kernel works on a row-major, contiguous (N, H)
 * matrix: N rows (samples), H elements per row (the normalized size).
 *
 * Shape legend
 *   x, y, dy, dx, residual, s   (N, H)
 *   mean, rstd                  (N)       may be NULL in forward kernels
 *   weight, bias                (H)       may be NULL: gain 1, bias 0
 *   dweight, dbias              (H)       always written
 *
 * Math (Ba, Kiros & Hinton 2016):
 *   mean = sum(x)/H; var = sum((x-mean)^2)/H; rstd = 1/sqrt(var+eps)
 *   y = (x-mean)*rstd*weight + bias
 *   RMSNorm: rstd = 1/sqrt(sum(x^2)/H + eps); y = x*rstd*weight
 *
 * Outputs come first in every signature, then inputs, then sizes.
 * An output may alias an input of the same shape exactly (in place), never
 * partially, and never weight, bias, mean or rstd. N >= 0 and H >= 1. Every
 * function returns FASTLN_OK (0), FASTLN_EINVAL for bad sizes, or
 * FASTLN_ENOMEM when scratch memory could not be allocated. All functions are thread-safe and may be called
 * concurrently; each runs its own OpenMP team.
 *
 * Results are bitwise identical for any thread count: dweight and dbias are
 * reduced over fixed row blocks in a fixed order.
 */
#ifndef FASTLN_H
#define FASTLN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FASTLN_OK 0
#define FASTLN_ENOMEM 1   /* scratch memory could not be allocated */
#define FASTLN_EINVAL 2   /* N < 0 or H < 1 */

/* ---- LayerNorm ---- */
int fastln_layer_norm_f32(float *y, float *mean, float *rstd,
                          const float *x, const float *weight, const float *bias,
                          int64_t N, int64_t H, double eps);
int fastln_layer_norm_f64(double *y, double *mean, double *rstd,
                          const double *x, const double *weight, const double *bias,
                          int64_t N, int64_t H, double eps);

/* dx = rstd*(g - mean(g) - xhat*mean(g*xhat)), g = dy*weight,
 * xhat = (x - m)*rstd with m = mean + mean(x - mean) (repairs a rounded mean). */
int fastln_layer_norm_backward_f32(float *dx, float *dweight, float *dbias,
                                   const float *dy, const float *x, const float *mean,
                                   const float *rstd, const float *weight,
                                   int64_t N, int64_t H);
int fastln_layer_norm_backward_f64(double *dx, double *dweight, double *dbias,
                                   const double *dy, const double *x, const double *mean,
                                   const double *rstd, const double *weight,
                                   int64_t N, int64_t H);

/* ---- Fused residual add + LayerNorm: s = x + residual; y = LN(s) ---- */
int fastln_add_layer_norm_f32(float *y, float *s, float *mean, float *rstd,
                              const float *x, const float *residual,
                              const float *weight, const float *bias,
                              int64_t N, int64_t H, double eps);
int fastln_add_layer_norm_f64(double *y, double *s, double *mean, double *rstd,
                              const double *x, const double *residual,
                              const double *weight, const double *bias,
                              int64_t N, int64_t H, double eps);

/* ---- Fused residual add + norm, general: s = x + residual[n % R]
 * (+ input_bias); y = LN(s) with rms 0, RMSNorm(s) with rms 1 (mean and bias
 * unused). residual (R, H) with N a multiple of R >= 1 (R = N: a residual
 * row per row; R = 1: one row for every row; with N = 0, R may be 0);
 * input_bias (H) or NULL. y is bitwise
 * the LayerNorm or RMSNorm of s. y and s may be x, and s the residual when
 * R = N. ---- */
int fastln_add_norm_f32(int rms, float *y, float *s, float *mean, float *rstd,
                        const float *x, const float *residual, int64_t R,
                        const float *input_bias, const float *weight, const float *bias,
                        int64_t N, int64_t H, double eps);
int fastln_add_norm_f64(int rms, double *y, double *s, double *mean, double *rstd,
                        const double *x, const double *residual, int64_t R,
                        const double *input_bias, const double *weight, const double *bias,
                        int64_t N, int64_t H, double eps);

/* Its backward: dsum = dx of the norm at s (fastln_layer_norm_backward, or
 * fastln_rms_norm_backward with rms: mean and dbias unused) + ds, the
 * incoming gradient of s (may be NULL); dinput_bias (H, may be NULL): the
 * column sums of dsum, reduced as dweight is. dsum may be dy, s or ds. */
int fastln_add_norm_backward_f32(int rms, float *dsum, float *dweight, float *dbias,
                                 float *dinput_bias, const float *dy, const float *s,
                                 const float *ds, const float *mean, const float *rstd,
                                 const float *weight, int64_t N, int64_t H);
int fastln_add_norm_backward_f64(int rms, double *dsum, double *dweight, double *dbias,
                                 double *dinput_bias, const double *dy, const double *s,
                                 const double *ds, const double *mean, const double *rstd,
                                 const double *weight, int64_t N, int64_t H);

/* ---- RMSNorm ---- */
int fastln_rms_norm_f32(float *y, float *rstd, const float *x, const float *weight,
                        int64_t N, int64_t H, double eps);
int fastln_rms_norm_f64(double *y, double *rstd, const double *x, const double *weight,
                        int64_t N, int64_t H, double eps);

/* ---- Channels first: x, y (N, C, S) contiguous, normalized over the C
 * channels at each of the N * S positions (axis 1 of (N, C, *spatial));
 * mean, rstd (N, S) or NULL; weight, bias (C) or NULL. y may be x. ---- */
int fastln_layer_norm_channels_f32(float *y, float *mean, float *rstd, const float *x,
                                   const float *weight, const float *bias,
                                   int64_t N, int64_t C, int64_t S, double eps);
int fastln_layer_norm_channels_f64(double *y, double *mean, double *rstd, const double *x,
                                   const double *weight, const double *bias,
                                   int64_t N, int64_t C, int64_t S, double eps);
int fastln_rms_norm_channels_f32(float *y, float *rstd, const float *x, const float *weight,
                                 int64_t N, int64_t C, int64_t S, double eps);
int fastln_rms_norm_channels_f64(double *y, double *rstd, const double *x,
                                 const double *weight, int64_t N, int64_t C, int64_t S,
                                 double eps);

/* Their backward, as fastln_layer_norm_backward and fastln_rms_norm_backward
 * on the same (N, C, S) layout: dx, dy like x; dweight, dbias (C). dx may be
 * x or dy. */
int fastln_layer_norm_channels_backward_f32(float *dx, float *dweight, float *dbias,
                                            const float *dy, const float *x, const float *mean,
                                            const float *rstd, const float *weight, int64_t N,
                                            int64_t C, int64_t S);
int fastln_layer_norm_channels_backward_f64(double *dx, double *dweight, double *dbias,
                                            const double *dy, const double *x,
                                            const double *mean, const double *rstd,
                                            const double *weight, int64_t N, int64_t C,
                                            int64_t S);
int fastln_rms_norm_channels_backward_f32(float *dx, float *dweight, const float *dy,
                                          const float *x, const float *rstd,
                                          const float *weight, int64_t N, int64_t C, int64_t S);
int fastln_rms_norm_channels_backward_f64(double *dx, double *dweight, const double *dy,
                                          const double *x, const double *rstd,
                                          const double *weight, int64_t N, int64_t C,
                                          int64_t S);

/* dx = rstd*(g - xhat*mean(g*xhat)), g = dy*weight, xhat = x*rstd */
int fastln_rms_norm_backward_f32(float *dx, float *dweight,
                                 const float *dy, const float *x, const float *rstd,
                                 const float *weight, int64_t N, int64_t H);
int fastln_rms_norm_backward_f64(double *dx, double *dweight,
                                 const double *dy, const double *x, const double *rstd,
                                 const double *weight, int64_t N, int64_t H);

/* ---- float16 and bfloat16 storage ---- */
/* The same kernels with x, y, dy, dx, residual and s in 16-bit storage:
 * kind FASTLN_F16 (IEEE binary16) or FASTLN_BF16 (bfloat16), as bit patterns.
 * The math is float32; mean, rstd, weight, bias, input_bias, dweight and dbias
 * are float.
 * Outputs are rounded to nearest even (add_layer_norm normalizes the float
 * sum x + residual, and returns it rounded). FASTLN_EINVAL also for an
 * unknown kind. */
#define FASTLN_F16 1
#define FASTLN_BF16 2

int fastln_layer_norm_half(int kind, uint16_t *y, float *mean, float *rstd, const uint16_t *x,
                           const float *weight, const float *bias, int64_t N, int64_t H,
                           double eps);
int fastln_layer_norm_backward_half(int kind, uint16_t *dx, float *dweight, float *dbias,
                                    const uint16_t *dy, const uint16_t *x, const float *mean,
                                    const float *rstd, const float *weight, int64_t N,
                                    int64_t H);
int fastln_add_layer_norm_half(int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                               const uint16_t *x, const uint16_t *residual, const float *weight,
                               const float *bias, int64_t N, int64_t H, double eps);
int fastln_add_norm_half(int kind, int rms, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                         const uint16_t *x, const uint16_t *residual, int64_t R,
                         const float *input_bias, const float *weight, const float *bias,
                         int64_t N, int64_t H, double eps);
int fastln_rms_norm_half(int kind, uint16_t *y, float *rstd, const uint16_t *x,
                         const float *weight, int64_t N, int64_t H, double eps);
int fastln_rms_norm_backward_half(int kind, uint16_t *dx, float *dweight, const uint16_t *dy,
                                  const uint16_t *x, const float *rstd, const float *weight,
                                  int64_t N, int64_t H);

/* ---- Threads ---- */
/* n > 0: later calls use n threads (process-wide); n <= 0: the OpenMP default,
 * omp_get_max_threads(). The OpenMP setting itself is left alone. */
void fastln_set_num_threads(int n);
/* The last n > 0 given to fastln_set_num_threads, or 0. */
int fastln_get_requested_threads(void);
/* Threads a large call would use now: the requested count, or the OpenMP
 * default; where the calling thread's OpenMP limit was lowered after the
 * library loaded (threadpoolctl's threadpool_limits, omp_set_num_threads),
 * that limit caps it. Small calls run on one thread whatever this says, and
 * so does every call in a child process forked after the library loaded
 * (libgomp's thread pool does not survive fork). */
int fastln_get_num_threads(void);
int fastln_has_openmp(void);

/* ---- Instruction-set dispatch ---- */
/* The path in use: "avx512", "avx2" or "generic". Chosen at first use from the
 * CPU and the FASTLN_ISA environment variable. */
const char *fastln_get_isa(void);
/* Forces a path; returns 0, or -1 when the name is unknown or the CPU lacks it.
 * Names are case-insensitive here and in fastln_isa_supported. */
int fastln_set_isa(const char *name);
/* 1 when this CPU (and OS) can run the named path. */
int fastln_isa_supported(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* FASTLN_H */
