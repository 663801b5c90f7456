/*
 * The entry points of the normalization kernels (fastln.h): check the
 * arguments, take the run-time policy's plan for the call (threads,
 * streaming stores) and forward to the path in use.
 */
#include "api/internal.h"
#include "paths/table.h"
#include "runtime/policy.h"
#ifdef FASTLN_X86
#include <emmintrin.h>
#endif

/* The path in use */
static inline const fastln_kernel_table *kt(void) { return fastln_kernels(); }

/* ---- the policy's plan for a call ---- */

static int path_of(const fastln_kernel_table *t)
{
#ifdef FASTLN_X86
    if (t == &fastln_kernels_avx512) return FASTLN_PATH_AVX512;
    if (t == &fastln_kernels_avx2) return FASTLN_PATH_AVX2;
#endif
    (void)t;
    return FASTLN_PATH_GENERIC;
}

/* Threads and streaming for a call of kind FASTLN_CALL_* on N rows of H
 * elements of elsize bytes, on the path in use */
static fastln_plan plan_for(int kind, int64_t N, int64_t H, int elsize)
{
    const int threads = fastln_serial(N, H) ? 1 : fastln_get_num_threads();
    return fastln_policy(kind, N, H, elsize, path_of(kt()), threads, fastln_caches_get());
}

/* ---- kernels ---- */

int fastln_layer_norm_f32(float *y, float *mean, float *rstd, const float *x,
                          const float *weight, const float *bias, int64_t N, int64_t H,
                          double eps)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_FWD, N, H, sizeof(float));
    return kt()->ln_f32(y, mean, rstd, x, weight, bias, N, H, eps, p.threads, p.stream);
}

int fastln_layer_norm_f64(double *y, double *mean, double *rstd, const double *x,
                          const double *weight, const double *bias, int64_t N, int64_t H,
                          double eps)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_FWD, N, H, sizeof(double));
    return kt()->ln_f64(y, mean, rstd, x, weight, bias, N, H, eps, p.threads, p.stream);
}

/* Channels first: the positions N * S are the rows, C their length. */
#define CHANNELS(q, name, T, fn, rms)                                                       \
    q int name(T *y, T *mean, T *rstd, const T *x, const T *weight, const T *bias, int64_t N, \
             int64_t C, int64_t S, double eps)                                              \
    {                                                                                       \
        if (N < 0 || C < 1 || S < 1 || (N > 0 && C > INT64_MAX / N / S)) return FASTLN_EINVAL; \
        const fastln_plan p = plan_for(FASTLN_CALL_FWD, N * S, C, sizeof(T));              \
        return kt()->fn(y, mean, rstd, x, weight, bias, N, C, S, eps, rms, p.threads,      \
                        p.stream && (const T *)y != x);                                     \
    }
CHANNELS(, fastln_layer_norm_channels_f32, float, cf_f32, 0)
CHANNELS(, fastln_layer_norm_channels_f64, double, cf_f64, 0)
CHANNELS(static, rms_channels_f32, float, cf_f32, 1)
CHANNELS(static, rms_channels_f64, double, cf_f64, 1)
#undef CHANNELS

int fastln_rms_norm_channels_f32(float *y, float *rstd, const float *x, const float *weight,
                                 int64_t N, int64_t C, int64_t S, double eps)
{
    return rms_channels_f32(y, NULL, rstd, x, weight, NULL, N, C, S, eps);
}

int fastln_rms_norm_channels_f64(double *y, double *rstd, const double *x,
                                 const double *weight, int64_t N, int64_t C, int64_t S,
                                 double eps)
{
    return rms_channels_f64(y, NULL, rstd, x, weight, NULL, N, C, S, eps);
}

/* Their backward; RMSNorm where mean is NULL */
#define CHANNELS_BWD(name, T, fn)                                                              \
    int name(T *dx, T *dweight, T *dbias, const T *dy, const T *x, const T *mean,             \
             const T *rstd, const T *weight, int64_t N, int64_t C, int64_t S)                  \
    {                                                                                          \
        if (N < 0 || C < 1 || S < 1 || (N > 0 && C > INT64_MAX / N / S)) return FASTLN_EINVAL; \
        const fastln_plan p = plan_for(FASTLN_CALL_BWD, N * S, C, sizeof(T));                  \
        return kt()->fn(dx, dweight, mean ? dbias : NULL, dy, x, mean, rstd, weight, N, C, S,  \
                        p.threads, p.stream && (const T *)dx != x && (const T *)dx != dy);     \
    }
CHANNELS_BWD(fastln_layer_norm_channels_backward_f32, float, cf_bwd_f32)
CHANNELS_BWD(fastln_layer_norm_channels_backward_f64, double, cf_bwd_f64)
#undef CHANNELS_BWD

int fastln_rms_norm_channels_backward_f32(float *dx, float *dweight, const float *dy,
                                          const float *x, const float *rstd,
                                          const float *weight, int64_t N, int64_t C, int64_t S)
{
    return fastln_layer_norm_channels_backward_f32(dx, dweight, NULL, dy, x, NULL, rstd, weight,
                                                   N, C, S);
}

int fastln_rms_norm_channels_backward_f64(double *dx, double *dweight, const double *dy,
                                          const double *x, const double *rstd,
                                          const double *weight, int64_t N, int64_t C, int64_t S)
{
    return fastln_layer_norm_channels_backward_f64(dx, dweight, NULL, dy, x, NULL, rstd, weight,
                                                   N, C, S);
}

int fastln_layer_norm_backward_f32(float *dx, float *dweight, float *dbias, const float *dy,
                                   const float *x, const float *mean, const float *rstd,
                                   const float *weight, int64_t N, int64_t H)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, sizeof(float));
    return kt()->ln_bwd_f32(dx, dweight, dbias, dy, x, mean, rstd, weight, N, H, p.threads,
                            p.stream);
}

int fastln_layer_norm_backward_f64(double *dx, double *dweight, double *dbias,
                                   const double *dy, const double *x, const double *mean,
                                   const double *rstd, const double *weight, int64_t N,
                                   int64_t H)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, sizeof(double));
    return kt()->ln_bwd_f64(dx, dweight, dbias, dy, x, mean, rstd, weight, N, H, p.threads,
                            p.stream);
}

int fastln_add_layer_norm_f32(float *y, float *s, float *mean, float *rstd, const float *x,
                              const float *residual, const float *weight, const float *bias,
                              int64_t N, int64_t H, double eps)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_ADD, N, H, sizeof(float));
    return kt()->add_ln_f32(y, s, mean, rstd, x, residual, weight, bias, N, H, eps, p.threads,
                            p.stream);
}

int fastln_add_layer_norm_f64(double *y, double *s, double *mean, double *rstd,
                              const double *x, const double *residual, const double *weight,
                              const double *bias, int64_t N, int64_t H, double eps)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_ADD, N, H, sizeof(double));
    return kt()->add_ln_f64(y, s, mean, rstd, x, residual, weight, bias, N, H, eps, p.threads,
                            p.stream);
}

/* The general fused add; without its extras (R = N, no input bias, LayerNorm)
 * the add + LayerNorm kernels, whose y is the same LayerNorm of s */
#define ADD_NORM(name, T, fn, add_fn)                                                          \
    int name(int rms, T *y, T *s, T *mean, T *rstd, const T *x, const T *residual, int64_t R, \
             const T *input_bias, const T *weight, const T *bias, int64_t N, int64_t H,       \
             double eps)                                                                       \
    {                                                                                          \
        if (N < 0 || H < 1 || R < (N > 0) || (R > 0 && N % R != 0)) return FASTLN_EINVAL;      \
        const fastln_plan p = plan_for(FASTLN_CALL_ADD, N, H, sizeof(T));                      \
        if (!rms && R == N && !input_bias)                                                     \
            return kt()->add_fn(y, s, mean, rstd, x, residual, weight, bias, N, H, eps,        \
                                p.threads, p.stream);                                          \
        const fastln_add_args a = {rms, 0, y, s, mean, rstd, x, residual, input_bias,          \
                                   weight, bias, N, H, R, eps};                                \
        return kt()->fn(&a, p.threads, p.stream);                                              \
    }
ADD_NORM(fastln_add_norm_f32, float, add_norm_f32, add_ln_f32)
ADD_NORM(fastln_add_norm_f64, double, add_norm_f64, add_ln_f64)
#undef ADD_NORM

#define ADD_NORM_BWD(name, T, fn)                                                              \
    int name(int rms, T *dsum, T *dweight, T *dbias, T *dinput_bias, const T *dy, const T *s, \
             const T *ds, const T *mean, const T *rstd, const T *weight, int64_t N, int64_t H) \
    {                                                                                          \
        if (N < 0 || H < 1) return FASTLN_EINVAL;                                              \
        const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, sizeof(T));                      \
        return kt()->fn(dsum, dweight, rms ? NULL : dbias, dinput_bias, dy, s, ds,             \
                        rms ? NULL : mean, rstd, weight, N, H, p.threads, p.stream);           \
    }
ADD_NORM_BWD(fastln_add_norm_backward_f32, float, add_bwd_f32)
ADD_NORM_BWD(fastln_add_norm_backward_f64, double, add_bwd_f64)
#undef ADD_NORM_BWD

int fastln_rms_norm_f32(float *y, float *rstd, const float *x, const float *weight,
                        int64_t N, int64_t H, double eps)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_FWD, N, H, sizeof(float));
    return kt()->rms_f32(y, rstd, x, weight, N, H, eps, p.threads, p.stream);
}

int fastln_rms_norm_f64(double *y, double *rstd, const double *x, const double *weight,
                        int64_t N, int64_t H, double eps)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_FWD, N, H, sizeof(double));
    return kt()->rms_f64(y, rstd, x, weight, N, H, eps, p.threads, p.stream);
}

int fastln_rms_norm_backward_f32(float *dx, float *dweight, const float *dy, const float *x,
                                 const float *rstd, const float *weight, int64_t N, int64_t H)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, sizeof(float));
    return kt()->rms_bwd_f32(dx, dweight, dy, x, rstd, weight, N, H, p.threads, p.stream);
}

int fastln_rms_norm_backward_f64(double *dx, double *dweight, const double *dy,
                                 const double *x, const double *rstd, const double *weight,
                                 int64_t N, int64_t H)
{
    if (N < 0 || H < 1) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, sizeof(double));
    return kt()->rms_bwd_f64(dx, dweight, dy, x, rstd, weight, N, H, p.threads, p.stream);
}

/* ---- float16 and bfloat16 storage ---- */

#define HALF_OK(kind) ((kind) == FASTLN_F16 || (kind) == FASTLN_BF16)

int fastln_layer_norm_half(int kind, uint16_t *y, float *mean, float *rstd, const uint16_t *x,
                           const float *weight, const float *bias, int64_t N, int64_t H,
                           double eps)
{
    if (N < 0 || H < 1 || !HALF_OK(kind)) return FASTLN_EINVAL;
    if (N == 0) return FASTLN_OK;
    const fastln_plan p = plan_for(FASTLN_CALL_FWD, N, H, 2);
    return kt()->half_fwd(FASTLN_OP_LN, kind, y, NULL, mean, rstd, x, NULL, weight, bias, N, H,
                          eps, p.threads, p.stream);
}

int fastln_rms_norm_half(int kind, uint16_t *y, float *rstd, const uint16_t *x,
                         const float *weight, int64_t N, int64_t H, double eps)
{
    if (N < 0 || H < 1 || !HALF_OK(kind)) return FASTLN_EINVAL;
    if (N == 0) return FASTLN_OK;
    const fastln_plan p = plan_for(FASTLN_CALL_FWD, N, H, 2);
    return kt()->half_fwd(FASTLN_OP_RMS, kind, y, NULL, NULL, rstd, x, NULL, weight, NULL, N,
                          H, eps, p.threads, p.stream);
}

int fastln_add_layer_norm_half(int kind, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                               const uint16_t *x, const uint16_t *residual, const float *weight,
                               const float *bias, int64_t N, int64_t H, double eps)
{
    if (N < 0 || H < 1 || !HALF_OK(kind)) return FASTLN_EINVAL;
    if (N == 0) return FASTLN_OK;
    const fastln_plan p = plan_for(FASTLN_CALL_ADD, N, H, 2);
    return kt()->half_fwd(FASTLN_OP_ADD, kind, y, s, mean, rstd, x, residual, weight, bias, N,
                          H, eps, p.threads, p.stream);
}

int fastln_add_norm_half(int kind, int rms, uint16_t *y, uint16_t *s, float *mean, float *rstd,
                         const uint16_t *x, const uint16_t *residual, int64_t R,
                         const float *input_bias, const float *weight, const float *bias,
                         int64_t N, int64_t H, double eps)
{
    if (!rms && R == N && !input_bias)
        return fastln_add_layer_norm_half(kind, y, s, mean, rstd, x, residual, weight, bias, N,
                                          H, eps);
    if (N < 0 || H < 1 || R < (N > 0) || (R > 0 && N % R != 0) || !HALF_OK(kind))
        return FASTLN_EINVAL;
    if (N == 0) return FASTLN_OK;
    const fastln_plan p = plan_for(FASTLN_CALL_ADD, N, H, 2);
    const fastln_add_args a = {rms, kind, y, s, mean, rstd, x, residual, input_bias, weight,
                               bias, N, H, R, eps};
    return kt()->add_norm_f32(&a, p.threads, p.stream);
}

int fastln_layer_norm_backward_half(int kind, uint16_t *dx, float *dweight, float *dbias,
                                    const uint16_t *dy, const uint16_t *x, const float *mean,
                                    const float *rstd, const float *weight, int64_t N,
                                    int64_t H)
{
    if (N < 0 || H < 1 || !HALF_OK(kind)) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, 2);
    return kt()->half_bwd(kind, dx, dweight, dbias, dy, x, mean, rstd, weight, N, H, p.threads,
                          p.stream);
}

int fastln_rms_norm_backward_half(int kind, uint16_t *dx, float *dweight, const uint16_t *dy,
                                  const uint16_t *x, const float *rstd, const float *weight,
                                  int64_t N, int64_t H)
{
    if (N < 0 || H < 1 || !HALF_OK(kind)) return FASTLN_EINVAL;
    const fastln_plan p = plan_for(FASTLN_CALL_BWD, N, H, 2);
    return kt()->half_bwd(kind, dx, dweight, NULL, dy, x, NULL, rstd, weight, N, H, p.threads,
                          p.stream);
}

/* ---- bandwidth ceiling for the benchmarks ---- */

/* memcpy, or with nt a copy with non-temporal stores (SSE2, every x86-64) */
static void copy_bytes(char *dst, const char *src, size_t n, int nt)
{
#ifdef FASTLN_X86
    if (nt) {
        size_t head = (size_t)(-(uintptr_t)dst & 15);
        if (head > n) head = n;
        memcpy(dst, src, head);
        size_t i = head;
        for (; i + 64 <= n; i += 64)
            for (int k = 0; k < 64; k += 16)
                _mm_stream_si128((__m128i *)(dst + i + k),
                                 _mm_loadu_si128((const __m128i *)(src + i + k)));
        _mm_sfence();
        memcpy(dst + i, src + i, n - i);
        return;
    }
#endif
    (void)nt;
    memcpy(dst, src, n);
}

int fastln_half_convert(int kind, int widen, void *dst, const void *src, int64_t n)
{
    if (n < 0 || !HALF_OK(kind)) return FASTLN_EINVAL;
    if (n == 0) return FASTLN_OK;
    /* as a kernel on rows of 1024 values */
    int nt = plan_for(FASTLN_CALL_FWD, (n + 1023) / 1024, 1024, 2).threads;
    return kt()->half_convert(kind, widen, dst, src, n, nt);
}

/* dst = src (nbytes), split in contiguous static blocks over the threads that a
 * kernel would use: the copy of the same bytes that the benchmarks compare with
 * (with nt, by non-temporal stores, as the kernels write large outputs). */
void fastln_parallel_copy(void *dst, const void *src, int64_t nbytes, int nt_stores)
{
    /* as a kernel on rows of 1024 floats */
    int nt = plan_for(FASTLN_CALL_FWD, nbytes / 4096, 1024, sizeof(float)).threads;
    if (nt <= 1) {
        copy_bytes((char *)dst, (const char *)src, (size_t)nbytes, nt_stores);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int64_t t = omp_get_thread_num(), p = omp_get_num_threads();
        int64_t b0 = (nbytes * t / p) & ~(int64_t)63;               /* cache-line bounds */
        int64_t b1 = t + 1 == p ? nbytes : (nbytes * (t + 1) / p) & ~(int64_t)63;
        copy_bytes((char *)dst + b0, (const char *)src + b0, (size_t)(b1 - b0), nt_stores);
    }
}
