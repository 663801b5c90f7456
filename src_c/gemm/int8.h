/*
 * int8 products for the LN-RNN engine's inference with int8 weights, on
 * every path (float engine only): C (M, N) = A (M, K) W^T with A quantized
 * per row at run time and W (N, K) int8 with a scale per row (per output
 * column of C). Included by rnn/products.h after packed.h.
 *
 * The scheme. A row a of A (the input, or h) becomes q = rint(a * 127 /
 * max|a|) in [-127, 127] and its scale s_a = max|a| / 127; the kernels read
 * u = q + 128 (uint8), the operand order of VPDPBUSD (unsigned times signed
 * bytes). Each element of C is
 *   (float)(sum_k u_k w_k + corr_n) * (s_a * s_w[n]),  corr_n = -128 sum_k w_k,
 * an exact int32 sum (|u w| <= 255 * 128 per term, K < 2^16 terms), converted
 * and scaled by the same two float multiplies on every path. So a row's
 * result depends on nothing but its own values and W: not on the batch it
 * is in, the thread count, or the instruction set. A row with a NaN or an
 * infinity gets s_a = NaN, so its whole row of C is NaN; a zero row gives 0.
 *
 * Quad panels (pack_nt_i8): W in panels of FASTLN_NR = 32 columns; quad q of
 * a panel is 128 bytes, column j's W[n][4q .. 4q+3] at 4j, so that one
 * 64-byte vector holds 16 columns' quads (the operand of VPDPBUSD) and two
 * vectors the panel. K is rounded up to a multiple of 4 (i8_kp) and the
 * panel zero-padded past K and N; after the panels, corr (int32, 32 per
 * panel). The quantized rows of A are kp bytes long, padded with u = 128.
 *
 * Kernels: VPDPBUSD on AVX512-VNNI; elsewhere on x86 the same sums from
 * VPMADDWD on the bytes widened to 16 bits (even and odd bytes apart), which
 * never saturates (VPMADDUBSW would: two products of 255 * 127 pass 32767);
 * plain C on the generic path.
 */
#include "gemm/gemm.h"
#if IS_F32
#define HAVE_I8 1

/* K rounded up to whole quads */
static inline int64_t i8_kp(int64_t K) { return (K + 3) / 4 * 4; }

/* Bytes of the quad panels and corr of an (N, K) matrix. */
static inline int64_t i8_part_size(int64_t N, int64_t K)
{
    int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR;
    return np * FASTLN_NR * i8_kp(K) + np * FASTLN_NR * (int64_t)sizeof(int32_t);
}

/* One packed matrix as the kernels read it: its panels, corr after them,
 * and its rows' scales (N floats, the caller's). */
typedef struct {
    const int8_t *w;
    const int32_t *corr;
    const float *scale;
} SFX(i8w);

static inline SFX(i8w) SFX(i8_part)(const void *blob, const float *scale, int64_t N, int64_t K)
{
    int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR;
    SFX(i8w) p = {(const int8_t *)blob,
                  (const int32_t *)((const char *)blob + np * FASTLN_NR * i8_kp(K)), scale};
    return p;
}

/* blob = the quad panels of W (N, K) int8 and their corr: panels shared by
 * the enclosing team (orphaned omp for, with its barrier). */
static void SFX(pack_nt_i8)(char *blob, const int8_t *W, int64_t N, int64_t K)
{
    int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR, kp = i8_kp(K);
    int32_t *corr = (int32_t *)(blob + np * FASTLN_NR * kp);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        int8_t *panel = (int8_t *)blob + p * FASTLN_NR * kp;
        for (int j = 0; j < FASTLN_NR; j++) {
            int64_t n = p * FASTLN_NR + j;
            int32_t sum = 0;
            for (int64_t k = 0; k < kp; k++) {
                int8_t v = n < N && k < K ? W[n * K + k] : 0;
                panel[k / 4 * 4 * FASTLN_NR + 4 * j + k % 4] = v;
                sum += v;
            }
            corr[n] = -128 * sum;
        }
    }
}

/* q (i8_kp(K)) = the row a (K) quantized as above, *s its scale. */
static inline void SFX(row_to_i8)(uint8_t *q, float *s, const float *a, int64_t K)
{
    float m = 0.0f;
    int bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
    for (int64_t k = 0; k < K; k++) {
        float v = __builtin_fabsf(a[k]);
        bad |= !(v <= 3.40282347e38f);   /* NaN or infinity */
        m = v > m ? v : m;
    }
    int64_t kp = i8_kp(K);
    if (bad || m == 0.0f) {
        memset(q, 128, (size_t)kp);
        *s = bad ? __builtin_nanf("") : 0.0f;
        return;
    }
    float inv = 127.0f / m;
#pragma omp simd
    for (int64_t k = 0; k < K; k++) {
        float r = __builtin_rintf(a[k] * inv);   /* to nearest even */
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
        q[k] = (uint8_t)(int32_t)(r + 128.0f);
    }
    for (int64_t k = K; k < kp; k++) q[k] = 128;
    *s = m / 127.0f;
}

/* q (M, i8_kp(K)), s (M) = the rows of A (M, K, rows lda apart) quantized:
 * rows shared by the enclosing team (orphaned omp for, with its barrier),
 * or with alone all on this thread. */
static void SFX(rows_to_i8)(uint8_t *q, float *s, const float *A, int64_t lda, int64_t M,
                            int64_t K, int alone)
{
    int64_t kp = i8_kp(K);
    if (alone) {
        for (int64_t m = 0; m < M; m++) SFX(row_to_i8)(q + m * kp, s + m, A + m * lda, K);
        return;
    }
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++) SFX(row_to_i8)(q + m * kp, s + m, A + m * lda, K);
}

/* The float value of one element: see the scheme above. */
static inline float i8_dequant(int32_t acc, int32_t corr, float sa, float sw)
{
    return (float)(acc + corr) * (sa * sw);
}

#if HAVE_IVEC
/* VIL int32 lanes a vector, I8NV vectors a panel */
#define I8NV (FASTLN_NR / VIL)
#define I8_NPN_MAX 4

/* The tiles and their driver (int8_tile.h): once with VPDPBUSD
 * (AVX512-VNNI, under its own target, run where the CPU has it) and once
 * with VPMADDWD. */
#if VEC_BYTES == 64
#define I8_VNNI 1
#include "gemm/int8_tile.h"
#endif
#define I8_VNNI 0
#include "gemm/int8_tile.h"
#undef I8NV
#undef I8_NPN_MAX
#endif

#if !HAVE_IVEC
/* Panel p of the C kernel: C's columns of that panel for rows [0, M). */
static void SFX(gemm_i8_panel)(float *C, int64_t ldc, const uint8_t *q, const float *s,
                               const SFX(i8w) *W, int64_t M, int64_t N, int64_t kp, int64_t p)
{
    const int8_t *panel = W->w + p * FASTLN_NR * kp;
    int64_t n1 = N - p * FASTLN_NR < FASTLN_NR ? N - p * FASTLN_NR : FASTLN_NR;
    for (int64_t m = 0; m < M; m++) {
        const uint8_t *u = q + m * kp;
        for (int64_t j = 0; j < n1; j++) {
            int64_t n = p * FASTLN_NR + j;
            int32_t acc = 0;
            for (int64_t k = 0; k < kp; k++)
                acc += (int32_t)u[k] * panel[k / 4 * 4 * FASTLN_NR + 4 * j + k % 4];
            C[m * ldc + n] = i8_dequant(acc, W->corr[n], s[m], W->scale[n]);
        }
    }
}
#endif

/* C (M, N) = A W^T, A quantized rows (q, s from rows_to_i8), W packed
 * (pack_nt_i8): tiles shared by the enclosing team (orphaned omp for; a
 * barrier at the end), or with alone all on this thread. */
static void SFX(gemm_i8)(float *C, int64_t ldc, const uint8_t *q, const float *s,
                         const SFX(i8w) *W, int64_t M, int64_t N, int64_t K, int alone)
{
#if defined(FASTLN_X86) && VEC_BYTES == 64
    if (fastln_cpu_has_avx512vnni()) SFX(gemm_i8_t1)(C, ldc, q, s, W, M, N, K, alone);
    else SFX(gemm_i8_t0)(C, ldc, q, s, W, M, N, K, alone);
#elif HAVE_IVEC
    SFX(gemm_i8_t0)(C, ldc, q, s, W, M, N, K, alone);
#else
    const int64_t kp = i8_kp(K), np = (N + FASTLN_NR - 1) / FASTLN_NR;
    if (alone) {
        for (int64_t p = 0; p < np; p++) SFX(gemm_i8_panel)(C, ldc, q, s, W, M, N, kp, p);
        return;
    }
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) SFX(gemm_i8_panel)(C, ldc, q, s, W, M, N, kp, p);
#endif
}

/* C (M, N) = A W^T for float rows of A (M, K, lda apart): quantized into q,
 * s (rows_to_i8), then gemm_i8; shared by the team, or with alone all on
 * this thread. */
static void SFX(product_i8)(float *C, int64_t ldc, uint8_t *q, float *s, const float *A,
                            int64_t lda, const SFX(i8w) *W, int64_t M, int64_t N, int64_t K,
                            int alone)
{
    SFX(rows_to_i8)(q, s, A, lda, M, K, alone);
    SFX(gemm_i8)(C, ldc, q, s, W, M, N, K, alone);
}
#else
#define HAVE_I8 0
#endif
