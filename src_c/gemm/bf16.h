/*
 * bfloat16 products for the LN-RNN engine's inference with bfloat16
 * weights: AMX tiles (TDPBF16PS) where the process may use them, else
 * AVX512-BF16's VDPBF16PS, which multiplies pairs of bfloat16 values and
 * adds both products to float accumulators. Included by packed.h,
 * whose packed_gemm_any runs these tiles.
 *
 * Pair panels (pack_nt_bf16): W (N, K) bfloat16 in panels of FASTLN_NR = 32
 * columns; pair q of a panel is 64 values, column j's (W[n][2q], W[n][2q+1])
 * at 2j (n = panel * 32 + j), so that its first 32 values are the 16 pairs
 * of columns 0-15 (one vector) and the next 32 those of columns 16-31.
 * K is rounded up to a multiple of 32 (Kp, one AMX tile's depth) and the
 * panel zero-padded past K and N. A (the input or h, float) is rounded to
 * bfloat16 first (rows_to_bf16), into rows of Kp, zero past K; AMX reads
 * it 16 rows at a time, so its buffer has whole blocks of 16 rows.
 */
#include "gemm/gemm.h"
#if IS_F32 && defined(FASTLN_X86) && VEC_BYTES == 64
#define HAVE_BF16DOT 1

/* K rounded up for the pair panels and bfloat16 rows */
static inline int64_t bf16_kp(int64_t K) { return (K + 31) / 32 * 32; }

/* Elements of the pair panels of an (N, K) matrix (uint16_t values). */
static inline int64_t SFX(packed_size_bf16)(int64_t N, int64_t K)
{
    return (N + FASTLN_NR - 1) / FASTLN_NR * bf16_kp(K) * FASTLN_NR;
}

/* P = the pair panels of W (N, K) bfloat16: panels shared by the enclosing
 * team (orphaned omp for, with its barrier). */
static void SFX(pack_nt_bf16)(uint16_t *P, const uint16_t *W, int64_t N, int64_t K)
{
    int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR, Q = bf16_kp(K) / 2;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < np; p++) {
        uint16_t *panel = P + p * Q * 2 * FASTLN_NR;
        for (int j = 0; j < FASTLN_NR; j++) {
            int64_t n = p * FASTLN_NR + j;
            const uint16_t *w = W + n * K;
            for (int64_t q = 0; q < Q; q++) {
                panel[q * 2 * FASTLN_NR + 2 * j] = n < N && 2 * q < K ? w[2 * q] : 0;
                panel[q * 2 * FASTLN_NR + 2 * j + 1] = n < N && 2 * q + 1 < K ? w[2 * q + 1] : 0;
            }
        }
    }
}

/* dst (bf16_kp(K)) = src (K) rounded to bfloat16 (nearest even), zeros past K */
static inline void SFX(row_to_bf16)(uint16_t *dst, const float *src, int64_t K)
{
    narrow_half(FASTLN_BF16, dst, src, K);
    memset(dst + K, 0, (size_t)(bf16_kp(K) - K) * sizeof(uint16_t));
}

/* dst (M, bf16_kp(K)) = src (M, K) by row_to_bf16; src rows lds apart: rows
 * shared by the enclosing team. */
static void SFX(rows_to_bf16)(uint16_t *dst, const float *src, int64_t lds, int64_t M,
                              int64_t K)
{
    int64_t Kp = bf16_kp(K);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++) SFX(row_to_bf16)(dst + m * Kp, src + m * lds, K);
}

/* Elements of a buffer for rows_to_bf16 of M rows of K. */
static inline int64_t bf16_rows_size(int64_t M, int64_t K)
{
    return (M + 15) / 16 * 16 * bf16_kp(K);
}

/* The AMX tiles of packed_gemm_any, each 16 rows of 64 bytes: 0-3 for C
 * (16 rows x 16 columns: the two halves of one panel for two blocks of rows,
 * or of two panels), then A (16 rows x 32 k) and B (16 pairs x 16 columns):
 * 4, 5 for A and 6, 7 for B, or 4 for A and 5-7 for B. Loaded on each
 * thread before its tiles run (the configuration is per thread, and other
 * code may change it). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} SFX(amx_config);

static inline void SFX(amx_setup)(void)
{
    SFX(amx_config) c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

/* C rows [0, mr) of one panel (ncols columns) from AMX C tiles ta, tb (its
 * two 16-column halves; tile numbers are literals): stored in place where
 * the tiles cover whole rows of C that nothing is added to, else through a
 * float buffer. */
#define AMX_OUT(ta, tb, C, ldc, mr, ncols, acc)                                         \
    do {                                                                                \
        if ((mr) == 16 && (ncols) == FASTLN_NR && !(acc)) {                             \
            _tile_stored(ta, C, (ldc) * 4);                                             \
            _tile_stored(tb, (C) + 16, (ldc) * 4);                                      \
        } else {                                                                        \
            float out_[16][FASTLN_NR] __attribute__((aligned(64)));                     \
            _tile_stored(ta, out_[0], FASTLN_NR * 4);                                   \
            _tile_stored(tb, out_[0] + 16, FASTLN_NR * 4);                              \
            for (int r_ = 0; r_ < (mr); r_++) {                                         \
                SFX(vec) v_[2] = {_mm512_load_ps(out_[r_]), _mm512_load_ps(out_[r_] + 16)};\
                SFX(tile_store)((C) + r_ * (ldc), v_, ncols, acc);                      \
            }                                                                           \
        }                                                                               \
    } while (0)

/* AMX tiles of C: rows [0, mr) (mr <= 32; A has 16 or 32 readable rows, lda
 * values apart) against one pair panel, or, with two (mr <= 16), two (the
 * second pst values on, for C's next 32 columns); K (a multiple of 32)
 * values of k; the last panel has ncols columns. Four C tiles run where
 * there are two blocks of 16 rows or two panels: four independent sums keep
 * the tile unit busy. Each element of C is TDPBF16PS's sum over the pairs,
 * 32 values of k at a time, from zero, whatever mr is and however the tiles
 * are grouped. */
static inline __attribute__((always_inline)) void SFX(tile_amx)(
    float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *P, int64_t pst,
    int two, int64_t K, int mr, int ncols, int acc)
{
    const int64_t ldb = 2 * FASTLN_NR * 2;   /* bytes from pair to pair */
    const int rows2 = mr > 16;
    _tile_zero(0);
    _tile_zero(1);
    if (two || rows2) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t k = 0; k < K; k += 32) {
        const uint16_t *p = P + k * FASTLN_NR;
        if (rows2) {   /* C 0, 1: rows 0-15; 2, 3: rows 16-31 */
            _tile_loadd(4, A + k, lda * 2);
            _tile_loadd(5, A + 16 * lda + k, lda * 2);
            _tile_loadd(6, p, ldb);
            _tile_loadd(7, p + FASTLN_NR, ldb);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
            continue;
        }
        _tile_loadd(4, A + k, lda * 2);
        _tile_loadd(5, p, ldb);
        _tile_loadd(6, p + FASTLN_NR, ldb);
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 6);
        if (two) {   /* C 2, 3: the second panel */
            _tile_loadd(7, p + pst, ldb);
            _tile_loadd(5, p + pst + FASTLN_NR, ldb);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    if (rows2) {
        AMX_OUT(0, 1, C, ldc, 16, ncols, acc);
        AMX_OUT(2, 3, C + 16 * ldc, ldc, mr - 16, ncols, acc);
    } else if (two) {
        AMX_OUT(0, 1, C, ldc, mr, FASTLN_NR, acc);
        AMX_OUT(2, 3, C + FASTLN_NR, ldc, mr, ncols, acc);
    } else {
        AMX_OUT(0, 1, C, ldc, mr, ncols, acc);
    }
}
#undef AMX_OUT

/* One tile of C (see SFX(tile) in packed.h): rows [0, mr) of A (bfloat16,
 * lda apart) against npn pair panels (pst values apart), Q pairs of k. Every
 * element of C is one chain of VDPBF16PS over the pairs from zero, then
 * stored (or added with acc), whatever mr and npn are. */
static inline __attribute__((always_inline)) void SFX(tile_bf16)(
    float *C, int64_t ldc, const uint16_t *A, int64_t lda, const uint16_t *P, int64_t pst,
    int64_t Q, int mr, int npn, int ncols, int acc)
{
    SFX(vec) c[MR][NPN_MAX * 2];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < npn * 2; v++) c[r][v] = V_ZERO();
    for (int64_t q = 0; q < Q; q++) {
        __m512bh b[NPN_MAX * 2];
        for (int v = 0; v < npn * 2; v++)
            b[v] = (__m512bh)VI_LOAD(P + v / 2 * pst + q * 2 * FASTLN_NR + v % 2 * 32);
        for (int r = 0; r < mr; r++) {
            uint32_t pair;
            memcpy(&pair, A + r * lda + 2 * q, 4);
            __m512bh a = (__m512bh)VI_SET1((int)pair);
            for (int v = 0; v < npn * 2; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < npn; q++) {
            SFX(vec) v[2] = {c[r][2 * q], c[r][2 * q + 1]};   /* c stays in registers */
            SFX(tile_store)(C + r * ldc + q * FASTLN_NR, v, q == npn - 1 ? ncols : FASTLN_NR, acc);
        }
}

/* C (M, N) (+)= A (M, K) W^T: A bfloat16 rows from rows_to_bf16, P the pair
 * panels of W; on AMX tiles with amx, else VDPBF16PS. See packed_gemm_any. */
static void SFX(packed_gemm_any)(fastln_gemm_kind bf, float *C, int64_t ldc, const void *A,
                                 int64_t ars, int64_t aks, const void *P, int64_t ldp, int64_t M,
                                 int64_t N, int64_t K, int acc);
static inline void SFX(packed_gemm_bf16)(int amx, float *C, int64_t ldc, const uint16_t *A,
                                         const uint16_t *P, int64_t M, int64_t N, int64_t K,
                                         int acc)
{
    SFX(packed_gemm_any)(amx ? FASTLN_GEMM_AMX : FASTLN_GEMM_BF16, C, ldc, A, bf16_kp(K), 1, P, 0,
                         M, N, bf16_kp(K), acc);
}
#else
#define HAVE_BF16DOT 0
#endif
