/*
 * Public entry points: pick the instruction-set path once, pick the thread
 * count per call, and forward to that path's kernel.
 */
#if defined(__linux__) && !defined(_DEFAULT_SOURCE)
#define _DEFAULT_SOURCE   /* syscall (the AMX permission), under -std=c99 */
#endif
#include "api/internal.h"
#ifdef FASTLN_X86
#include <emmintrin.h>
#endif

#if defined(__unix__)
#include <pthread.h>
#endif


/* ---- instruction-set dispatch ---- */

/* Whether the environment variable name (NULL: none) turns a feature off:
 * set, and neither empty nor "0". */
static inline int env_off(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v && strcmp(v, "0") != 0;
}

/* name in lower case without surrounding white space, into buf of n bytes
 * ("" where it does not fit or is NULL): instruction-set names are
 * case-insensitive ("AVX2" is "avx2") */
static const char *isa_key(const char *name, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    if (!name) return buf;
    while (*name == ' ' || (*name >= '\t' && *name <= '\r')) name++;
    for (; name[len] && len < n; len++)
        buf[len] = name[len] >= 'A' && name[len] <= 'Z' ? (char)(name[len] - 'A' + 'a') : name[len];
    if (len == n) {   /* longer than any name */
        buf[0] = '\0';
        return buf;
    }
    while (len > 0 && (buf[len - 1] == ' ' || (buf[len - 1] >= '\t' && buf[len - 1] <= '\r')))
        len--;
    buf[len] = '\0';
    return buf;
}

#define ISA_KEY(name, buf) isa_key((name), (buf), sizeof(buf))

static const fastln_kernel_table *table_for(const char *raw)
{
    char buf[16];
    const char *name = ISA_KEY(raw, buf);
    if (strcmp(name, "generic") == 0) return &fastln_kernels_generic;
#ifdef FASTLN_X86
    if (strcmp(name, "avx2") == 0) return &fastln_kernels_avx2;
    if (strcmp(name, "avx512") == 0) return &fastln_kernels_avx512;
#endif
    return NULL;
}

int fastln_isa_supported(const char *raw)
{
    char buf[16];
    const char *name = ISA_KEY(raw, buf);
    if (!table_for(name)) return 0;
#if defined(FASTLN_X86) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    return 1;
#else
    return strcmp(name, "generic") == 0;
#endif
}

/* AMX with bfloat16 (Intel's tile unit): the CPU has AMX-TILE and
 * AMX-BF16 (CPUID leaf 7), the OS saves tile state (XCR0 bits 17, 18), and
 * Linux grants this process the tile data (arch_prctl). FASTLN_NO_AMX=1
 * turns it off (the other bfloat16 path then runs). Decided once. */
#if defined(FASTLN_X86) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
static int amx_usable(void)
{
    if (env_off("FASTLN_NO_AMX")) return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return 0;   /* AMX-TILE, AMX-BF16 */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;   /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18) */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
#else
static int amx_usable(void) { return 0; }
#endif

int fastln_cpu_has_amx_bf16(void)
{
    static int has = -1;
    int h = __atomic_load_n(&has, __ATOMIC_ACQUIRE);
    if (h < 0) {
        h = amx_usable();
        __atomic_store_n(&has, h, __ATOMIC_RELEASE);
    }
    return h;
}

/* Whether the CPU has an instruction-set feature (a literal of
 * __builtin_cpu_supports) and env_off(off) is not set: decided once and kept
 * in a static. */
#if defined(FASTLN_X86) && (defined(__GNUC__) || defined(__clang__))
#define CPU_FEATURE(feature, off)                                                  \
    do {                                                                           \
        static int has = -1;                                                       \
        int h = __atomic_load_n(&has, __ATOMIC_RELAXED);                           \
        if (h < 0) {                                                               \
            __builtin_cpu_init();                                                  \
            h = __builtin_cpu_supports(feature) && !env_off(off);                  \
            __atomic_store_n(&has, h, __ATOMIC_RELAXED);                           \
        }                                                                          \
        return h;                                                                  \
    } while (0)
#else
#define CPU_FEATURE(feature, off) return 0
#endif

/* AVX512-VNNI, for the int8 products; FASTLN_NO_VNNI=1 turns it off (the
 * VPMADDWD kernel then runs, with the same results). */
int fastln_cpu_has_avx512vnni(void) { CPU_FEATURE("avx512vnni", "FASTLN_NO_VNNI"); }

int fastln_cpu_has_avx512bf16(void) { CPU_FEATURE("avx512bf16", NULL); }

static const fastln_kernel_table *g_table = NULL;

/* The best supported path, unless FASTLN_ISA names a supported one (in any
 * case, white space around it ignored). */
static const fastln_kernel_table *choose_table(void)
{
    const char *env = getenv("FASTLN_ISA");
    if (env && *env && fastln_isa_supported(env)) return table_for(env);
    if (fastln_isa_supported("avx512")) return table_for("avx512");
    if (fastln_isa_supported("avx2")) return table_for("avx2");
    return &fastln_kernels_generic;
}

static const fastln_kernel_table *kt(void)
{
    const fastln_kernel_table *t = __atomic_load_n(&g_table, __ATOMIC_ACQUIRE);
    if (!t) {
        t = choose_table();   /* idempotent: a race picks the same table */
        __atomic_store_n(&g_table, t, __ATOMIC_RELEASE);
    }
    return t;
}

const char *fastln_get_isa(void) { return kt()->name; }

const fastln_kernel_table *fastln_kernels(void) { return kt(); }

int fastln_set_isa(const char *name)
{
    if (!fastln_isa_supported(name)) return -1;
    __atomic_store_n(&g_table, table_for(name), __ATOMIC_RELEASE);
    return 0;
}

/* ---- threads ---- */

static int g_num_threads = 0;   /* from fastln_set_num_threads; 0: the default */
static int g_default = 0;       /* from fastln_set_default_threads; 0: OpenMP's default */
static int g_initial_max = 0;   /* omp_get_max_threads() when the library was loaded */
static int g_forked = 0;        /* 1 in a child forked from the process that loaded us */

/* libgomp cannot restart its thread pool in a forked child: a parallel region
 * there waits for the parent's workers forever. A child runs serially. */
static void on_fork_child(void) { g_forked = 1; }

#if defined(__GNUC__) || defined(__clang__)
__attribute__((constructor)) static void at_load(void)
{
    g_initial_max = omp_get_max_threads();
#if defined(_OPENMP) && defined(__unix__)
    pthread_atfork(NULL, NULL, on_fork_child);
#else
    (void)on_fork_child;
#endif
}
#endif

int fastln_has_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

void fastln_set_num_threads(int n)
{
    __atomic_store_n(&g_num_threads, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

int fastln_get_requested_threads(void)
{
    return __atomic_load_n(&g_num_threads, __ATOMIC_RELAXED);
}

void fastln_set_default_threads(int n)
{
    __atomic_store_n(&g_default, n > 0 ? n : 0, __ATOMIC_RELAXED);
}

int fastln_get_num_threads(void)
{
    if (__atomic_load_n(&g_forked, __ATOMIC_RELAXED)) return 1;
    int m = omp_get_max_threads(), n = __atomic_load_n(&g_num_threads, __ATOMIC_RELAXED);
    if (n <= 0) {
        /* OpenMP's count where someone changed it on this thread since load
         * (threadpoolctl, omp_set_num_threads), else the machine's default */
        int d = __atomic_load_n(&g_default, __ATOMIC_RELAXED);
        return m != g_initial_max || d <= 0 || d > m ? m : d;
    }
    /* a limit set on this thread after load (threadpoolctl, omp_set_num_threads) caps it */
    return m < g_initial_max && m < n ? m : n;
}

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
