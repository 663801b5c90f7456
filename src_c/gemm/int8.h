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
 * Quad panels (pack_nt_i8; fastln_i8_quad, gemm.h): W in panels of
 * FASTLN_NR = 32 columns, K rounded up to a multiple of 4 (i8_kp) and the
 * panel zero-padded past K and N; a panel is kp / 4 quads of 128 bytes, and
 * quad q holds column j's W[n][4q .. 4q+3] at col[j], so that one 64-byte
 * vector holds 16 columns' quads (the operand of VPDPBUSD) and two vectors
 * the quad. After the panels, corr (int32, 32 per panel). The quantized
 * rows of A are kp bytes long, padded with u = 128.
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
        fastln_i8_quad *panel = (fastln_i8_quad *)(blob + p * FASTLN_NR * kp);
        for (int j = 0; j < FASTLN_NR; j++) {
            int64_t n = p * FASTLN_NR + j;
            int32_t sum = 0;
            for (int64_t k = 0; k < kp; k++) {
                int8_t v = n < N && k < K ? W[n * K + k] : 0;
                panel[k / 4].col[j][k % 4] = v;
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
/* ---- the x86 kernels ------------------------------------------------------
 * A tile: rows of the quantized A against one or more panels of W, its int32
 * sums in registers. The kernel (fastln_i8_kernel) says how a tile adds a
 * quad of k: VPDPBUSD (AVX512-VNNI) on the AVX-512 path where the CPU has it
 * (gemm_i8_vnni, compiled for it), else VPMADDWD (gemm_i8_madd). Both compute
 * every int32 sum exactly, so the two agree bitwise with each other and with
 * the C kernel. */

/* VIL int32 lanes a vector, I8NV vectors a quad of a panel */
#define I8NV (FASTLN_NR / VIL)
#define I8_NPN_MAX 4
/* The rows of a kernel's tile: VPMADDWD needs registers for the widened
 * bytes of A (4 rows on AVX-512, 2 on AVX2); VPDPBUSD (AVX-512) takes 8 */
#define I8_ROWS(kern) (VEC_BYTES == 64 ? (kern) == FASTLN_I8_VNNI ? 8 : 4 : 2)
#define I8_ROWS_MAX (VEC_BYTES == 64 ? 8 : 2)
/* Panels a tile of mr rows runs side by side: at least 8 independent sums */
#define I8_NPN(mr) (8 / ((mr) * I8NV) >= I8_NPN_MAX ? I8_NPN_MAX \
                    : 8 / ((mr) * I8NV) > 1 ? 8 / ((mr) * I8NV) : 1)

/* Vector v of quad kq of a tile's panels (P the first, pst bytes apart): the
 * v % I8NV-th VIL columns of panel v / I8NV. */
static inline __attribute__((always_inline)) SFX(ivec) SFX(i8_cols)(const int8_t *P,
                                                                  int64_t pst, int64_t kq,
                                                                  int v)
{
    const fastln_i8_quad *quad = (const fastln_i8_quad *)(P + v / I8NV * pst) + kq;
    return VI_LOAD(quad->col[v % I8NV * VIL]);
}

#if VEC_BYTES == 64
/* acc + the products of the four u8 x s8 pairs of each lane of a and w
 * (VPDPBUSD). In asm, on a copy of acc: GCC allocates the intrinsic's
 * accumulator apart from the loop's and copies it twice each time through
 * the loop; an asm on the array element itself would keep the array in
 * memory. */
static inline __attribute__((always_inline)) SFX(ivec) SFX(dpbusd)(SFX(ivec) acc, SFX(ivec) a,
                                                                 SFX(ivec) w)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(w));
    return acc;
}
#endif

/* One tile of kernel kern: rows [0, mr) of the quantized A (q rows kp bytes
 * apart, s their scales) against npn panels (pst bytes apart) from column n0
 * of W; the last panel has ncols columns. Quad by quad, each row's four
 * bytes are broadcast against the panels' vectors; every sum runs over all
 * of K from zero in int32, then is scaled into C. kern, mr and npn are
 * constants after inlining. */
static inline __attribute__((always_inline)) void SFX(i8_tile)(
    fastln_i8_kernel kern, float *C, int64_t ldc, const uint8_t *q, int64_t kp, const float *s,
    const int8_t *P, int64_t pst, const SFX(i8w) *W, int64_t n0, int mr, int npn, int ncols)
{
    SFX(ivec) c[I8_ROWS_MAX][I8_NPN_MAX * I8NV];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < npn * I8NV; v++) c[r][v] = VI_ZERO();
    for (int64_t kq = 0; kq < kp / 4; kq++) {
#if VEC_BYTES == 64
        if (kern == FASTLN_I8_VNNI && mr == 1) {   /* one row: each vector of W once */
            int32_t quad;
            memcpy(&quad, q + 4 * kq, 4);
            SFX(ivec) a = VI_SET1(quad);
            for (int v = 0; v < npn * I8NV; v++)
                c[0][v] = SFX(dpbusd)(c[0][v], a, SFX(i8_cols)(P, pst, kq, v));
            continue;
        }
        if (kern == FASTLN_I8_VNNI) {
            SFX(ivec) w[I8_NPN_MAX * I8NV];
            for (int v = 0; v < npn * I8NV; v++) w[v] = SFX(i8_cols)(P, pst, kq, v);
            for (int r = 0; r < mr; r++) {
                int32_t quad;
                memcpy(&quad, q + r * kp + 4 * kq, 4);
                SFX(ivec) a = VI_SET1(quad);
                for (int v = 0; v < npn * I8NV; v++) c[r][v] = SFX(dpbusd)(c[r][v], a, w[v]);
            }
            continue;
        }
#else
        (void)kern;   /* VPMADDWD only */
#endif
        SFX(ivec) a[I8_ROWS_MAX];
        for (int r = 0; r < mr; r++) {
            int32_t quad;
            memcpy(&quad, q + r * kp + 4 * kq, 4);
            a[r] = VI_SET1(quad);
        }
        /* u0 w0 + u2 w2 and u1 w1 + u3 w3 in each lane, from the even and
         * odd bytes widened to 16 bits (u zero-extended, w sign-extended) */
        SFX(ivec) ae[I8_ROWS_MAX], ao[I8_ROWS_MAX];
        for (int r = 0; r < mr; r++) {
            ae[r] = VI_AND(a[r], VI_SET1(0x00FF00FF));
            ao[r] = VI_SRL16(a[r], 8);
        }
        for (int v = 0; v < npn * I8NV; v++) {
            SFX(ivec) w = SFX(i8_cols)(P, pst, kq, v);
            SFX(ivec) we = VI_SRA16(VI_SLL16(w, 8), 8), wo = VI_SRA16(w, 8);
            for (int r = 0; r < mr; r++)
                c[r][v] = VI_ADD(c[r][v], VI_ADD(VI_MADD16(ae[r], we), VI_MADD16(ao[r], wo)));
        }
    }
    for (int g = 0; g < npn; g++) {
        int64_t n = n0 + g * FASTLN_NR;
        int nc = g == npn - 1 ? ncols : FASTLN_NR;
        float sw[FASTLN_NR];
        const float *scale = W->scale + n;
        if (nc < FASTLN_NR) {   /* the last, partial panel: scales zero-padded */
            for (int j = 0; j < FASTLN_NR; j++) sw[j] = j < nc ? scale[j] : 0.0f;
            scale = sw;
        }
        for (int r = 0; r < mr; r++) {
            float out[FASTLN_NR];
            float *dst = nc == FASTLN_NR ? C + r * ldc + n : out;
            for (int v = 0; v < I8NV; v++) {
                SFX(ivec) sum = VI_ADD(c[r][g * I8NV + v], VI_LOAD(W->corr + n + v * VIL));
                V_STORE(dst + v * VIL, V_MUL(VI_TO_V(sum),
                                             V_MUL(V_SET1(s[r]), V_LOAD(scale + v * VIL))));
            }
            if (nc < FASTLN_NR) memcpy(C + r * ldc + n, out, (size_t)nc * sizeof(float));
        }
    }
}

/* The tile of rows [m, m + mr) against npn panels from panel p (ncols
 * columns in the last). */
static inline __attribute__((always_inline)) void SFX(i8_tile_at)(
    fastln_i8_kernel kern, float *C, int64_t ldc, const uint8_t *q, int64_t kp, const float *s,
    const SFX(i8w) *W, int64_t m, int64_t p, int mr, int npn, int ncols)
{
    const int64_t pst = FASTLN_NR * kp;
    SFX(i8_tile)(kern, C + m * ldc, ldc, q + m * kp, kp, s + m, W->w + p * pst, pst, W,
                 p * FASTLN_NR, mr, npn, ncols);
}

/* The same against cnt panels, 1 to I8_NPN_MAX: a constant in each case */
static inline __attribute__((always_inline)) void SFX(i8_tile_panels)(
    fastln_i8_kernel kern, float *C, int64_t ldc, const uint8_t *q, int64_t kp, const float *s,
    const SFX(i8w) *W, int64_t m, int64_t p, int mr, int cnt, int ncols)
{
    switch (cnt) {
        case 4: SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, mr, 4, ncols); break;
        case 3: SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, mr, 3, ncols); break;
        case 2: SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, mr, 2, ncols); break;
        default: SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, mr, 1, ncols); break;
    }
}

/* The same of r rows, fewer than the kernel's, against one panel: a constant
 * in each case */
static inline __attribute__((always_inline)) void SFX(i8_tile_rows)(
    fastln_i8_kernel kern, float *C, int64_t ldc, const uint8_t *q, int64_t kp, const float *s,
    const SFX(i8w) *W, int64_t m, int64_t p, int r, int ncols)
{
    const int mr = I8_ROWS(kern);
    switch (r) {
        case 1: SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 1, 1, ncols); break;
        case 2: if (mr > 2) SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 2, 1, ncols); break;
        case 3: if (mr > 3) SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 3, 1, ncols); break;
        case 4: if (mr > 4) SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 4, 1, ncols); break;
        case 5: if (mr > 5) SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 5, 1, ncols); break;
        case 6: if (mr > 6) SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 6, 1, ncols); break;
        case 7: if (mr > 7) SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, m, p, 7, 1, ncols); break;
        default: break;
    }
}

/* The columns of panel p of an (., N) product: FASTLN_NR, or fewer in the last */
static inline int SFX(i8_ncols)(int64_t N, int64_t p)
{
    return N - p * FASTLN_NR < FASTLN_NR ? (int)(N - p * FASTLN_NR) : FASTLN_NR;
}

/* Work item it of gemm_i8_on: a group of gp panels against a block of up to
 * mb rows. */
static inline __attribute__((always_inline)) void SFX(gemm_i8_item)(
    fastln_i8_kernel kern, float *C, int64_t ldc, const uint8_t *q, const float *s,
    const SFX(i8w) *W, int64_t M, int64_t N, int64_t kp, int64_t it, int64_t ng, int gp)
{
    const int mr = I8_ROWS(kern);
    const int64_t mb = (64 / mr) * mr, np = (N + FASTLN_NR - 1) / FASTLN_NR;
    const int64_t p0 = it % ng * gp, m = it / ng * mb, m1 = m + mb < M ? m + mb : M;
    const int cnt = np - p0 < gp ? (int)(np - p0) : gp;
    if (gp > 1) {   /* M < mr rows against cnt panels at once */
        const int ncols = SFX(i8_ncols)(N, p0 + cnt - 1);
        if (M == 1) SFX(i8_tile_panels)(kern, C, ldc, q, kp, s, W, m, p0, 1, cnt, ncols);
        else SFX(i8_tile_panels)(kern, C, ldc, q, kp, s, W, m, p0, 2, cnt, ncols);
        return;
    }
    for (int64_t p = p0; p < p0 + cnt; p++) {
        const int ncols = SFX(i8_ncols)(N, p);
        int64_t mm = m;
        for (; mm + mr <= m1; mm += mr)
            SFX(i8_tile_at)(kern, C, ldc, q, kp, s, W, mm, p, mr, 1, ncols);
        SFX(i8_tile_rows)(kern, C, ldc, q, kp, s, W, mm, p, (int)(m1 - mm), ncols);
    }
}

/* C (M, N) = A W^T (see gemm_i8) on kernel kern: the (panels, block of rows)
 * work items shared by the enclosing team in a static schedule, as the float
 * kernel shares them (so a thread keeps the same panels from step to step),
 * with a barrier at the end; or, with alone, all of them on this thread.
 * Fewer rows than a tile's take several panels a tile. */
static inline __attribute__((always_inline)) void SFX(gemm_i8_on)(
    fastln_i8_kernel kern, float *C, int64_t ldc, const uint8_t *q, const float *s,
    const SFX(i8w) *W, int64_t M, int64_t N, int64_t K, int alone)
{
    const int mr = I8_ROWS(kern);
    const int64_t kp = i8_kp(K), mb = (64 / mr) * mr;
    const int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR, nmb = (M + mb - 1) / mb;
    const int gp = M < mr ? I8_NPN(M) : 1;
    const int64_t ng = (np + gp - 1) / gp;
    if (alone) {
        for (int64_t it = 0; it < ng * nmb; it++)
            SFX(gemm_i8_item)(kern, C, ldc, q, s, W, M, N, kp, it, ng, gp);
        return;
    }
#pragma omp for schedule(static) nowait
    for (int64_t it = 0; it < ng * nmb; it++)
        SFX(gemm_i8_item)(kern, C, ldc, q, s, W, M, N, kp, it, ng, gp);
#pragma omp barrier
}

#if VEC_BYTES == 64
/* VPDPBUSD: compiled for AVX512-VNNI, and run where the CPU has it */
static __attribute__((target("avx512vnni"))) void SFX(gemm_i8_vnni)(
    float *C, int64_t ldc, const uint8_t *q, const float *s, const SFX(i8w) *W, int64_t M,
    int64_t N, int64_t K, int alone)
{
    SFX(gemm_i8_on)(FASTLN_I8_VNNI, C, ldc, q, s, W, M, N, K, alone);
}
#endif

static void SFX(gemm_i8_madd)(float *C, int64_t ldc, const uint8_t *q, const float *s,
                              const SFX(i8w) *W, int64_t M, int64_t N, int64_t K, int alone)
{
    SFX(gemm_i8_on)(FASTLN_I8_MADD, C, ldc, q, s, W, M, N, K, alone);
}
#undef I8NV
#undef I8_NPN_MAX
#undef I8_ROWS
#undef I8_ROWS_MAX
#undef I8_NPN
#endif

#if !HAVE_IVEC
/* Panel p of the C kernel: C's columns of that panel for rows [0, M). */
static void SFX(gemm_i8_panel)(float *C, int64_t ldc, const uint8_t *q, const float *s,
                               const SFX(i8w) *W, int64_t M, int64_t N, int64_t kp, int64_t p)
{
    const fastln_i8_quad *panel = (const fastln_i8_quad *)(W->w + p * FASTLN_NR * kp);
    int64_t n1 = N - p * FASTLN_NR < FASTLN_NR ? N - p * FASTLN_NR : FASTLN_NR;
    for (int64_t m = 0; m < M; m++) {
        const uint8_t *u = q + m * kp;
        for (int64_t j = 0; j < n1; j++) {
            int64_t n = p * FASTLN_NR + j;
            int32_t acc = 0;
            for (int64_t k = 0; k < kp; k++)
                acc += (int32_t)u[k] * panel[k / 4].col[j][k % 4];
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
#if HAVE_IVEC && VEC_BYTES == 64
    if (fastln_cpu_has_avx512vnni()) SFX(gemm_i8_vnni)(C, ldc, q, s, W, M, N, K, alone);
    else SFX(gemm_i8_madd)(C, ldc, q, s, W, M, N, K, alone);
#elif HAVE_IVEC
    SFX(gemm_i8_madd)(C, ldc, q, s, W, M, N, K, alone);
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
