/*
 * The recurrent products of the LN-RNN engine, written once per (element
 * type, ISA) (isa/type_begin.h: IS_F32, NRT): the axpy kernel for a backward of
 * one sequence (small_nn), the packed-weight kernels (gemm/packed.h:
 * packed_gemm, and gemm_big for the large products of a layer), and how a
 * layer does its products (rec: rec_part, rec_product per step,
 * rec_init_bwd for the backward's packed W_hh^T). Every product is the
 * engine's own, inside the parallel region of its steps.
 */
#include "isa/simd.h"
#include "rnn/rnn.h"
#include "runtime/pool.h"

/* B == 1, unpacked W (the backward of one sequence):
 * C (M, K) (+)= A (M, N) W, W (N, K): four axpys at a time */
static void SFX(small_nn)(T *C, const T *A, const T *W, int64_t M, int64_t N, int64_t K,
                          int acc, int64_t k0, int64_t k1)
{   /* output columns [k0, k1) */
    for (int64_t m = 0; m < M; m++) {
        const T *a = A + m * N;
        T *c = C + m * K;
        if (!acc) memset(c + k0, 0, (size_t)(k1 - k0) * sizeof(T));
        int64_t n = 0;
        for (; n + 4 <= N; n += 4) {
            const T *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
            T a0 = a[n], a1 = a[n + 1], a2 = a[n + 2], a3 = a[n + 3];
#pragma omp simd
            for (int64_t k = k0; k < k1; k++)
                c[k] = FMA(a0, w0[k], FMA(a1, w1[k], FMA(a2, w2[k], FMA(a3, w3[k], c[k]))));
        }
        for (; n < N; n++) {
            const T *w0 = W + n * K;
            T a0 = a[n];
#pragma omp simd
            for (int64_t k = k0; k < k1; k++) c[k] = FMA(a0, w0[k], c[k]);
        }
    }
}

#include "gemm/packed.h"
#include "gemm/int8.h"

/* How a layer does its recurrent products. */
typedef struct {
    fastln_rec_method method;
    const void *packed;     /* PACKED, BF16: the packed W_hh (forward) or W_hh^T (backward);
                               RESET_FIRST: only its [r, z] blocks */
    const void *packed_n;   /* PACKED, BF16, RESET_FIRST: the n block W_hn, likewise */
    const void *packed_ih;  /* forward on the packed path: W_ih packed, else NULL */
    const void *packed_r;   /* forward of a projected LSTM: W_hr packed, likewise */
    int64_t ldp, ldp_ih;    /* PACKED: the row strides of packed and packed_n, and of
                               packed_ih: FASTLN_NR for packed panels, or the row of
                               W_hh^T, W_ih^T (G) where the forward reads them in place */
    int64_t ldp_r;          /* PACKED: packed_r's, likewise (W_hr^T's row: P) */
    uint16_t *abuf;         /* BF16: the product's A rounded to bfloat16 */
    uint16_t *hbuf;         /* BF16, not RESET_FIRST: h (B, H) rounded to bfloat16,
                               written by each step's rows for the next step's product */
    int amx;                /* BF16: on AMX tiles */
#if HAVE_I8
    SFX(i8w) i8[4];         /* INT8: W_hh (or its [r, z] blocks), W_hn, W_ih, W_hr;
                               packed, packed_n, packed_ih and packed_r point to these */
    uint8_t *qa;            /* INT8: the product's A quantized (rows_to_i8) */
    float *qs;              /* and its rows' scales */
    uint8_t *hq;            /* INT8, not RESET_FIRST: h (B, H) quantized, written by
                               each step's rows for the next step's product */
    float *hqs;             /* and its rows' scales */
#endif
    void *own;              /* what rec_free gives back to runtime/pool.h's cache */
} SFX(rec);

/* A recurrent product by rc's method: C (B, N) (+)= A (B, K) W^T, W (N, K)
 * (forward), or A W, W (K, N) (backward); rows ldc, lda apart; P the packed
 * panels of W (PACKED, BF16, INT8), or the axpy kernel over W at B == 1
 * (AXPY, backward). The team of the enclosing region shares the work.
 * rec_product is the whole step's; a GRU with RESET_FIRST takes its step's
 * in two parts. */
static void SFX(rec_part)(const SFX(rec) *rc, const void *P, T *C, int64_t ldc, const T *A,
                          int64_t lda, const T *W, int64_t B, int64_t N, int64_t K, int acc)
{
    const fastln_rec_method method = rc->method;
#if HAVE_I8
    if (method == FASTLN_REC_INT8) {   /* forward only: C = A W^T, acc 0 */
        SFX(product_i8)(C, ldc, rc->qa, rc->qs, A, lda, (const SFX(i8w) *)P, B, N, K, 0);
        return;
    }
#endif
#if HAVE_BF16DOT
    if (method == FASTLN_REC_BF16) {
        SFX(rows_to_bf16)(rc->abuf, A, lda, B, K);
        SFX(packed_gemm_bf16)(rc->amx, C, ldc, rc->abuf, (const uint16_t *)P, B, N, K, acc);
        return;
    }
#endif
    if (method == FASTLN_REC_AXPY) {   /* blocks of 64 output columns over the team */
        int64_t nb = (N + 63) / 64;
#pragma omp for schedule(static)
        for (int64_t j = 0; j < nb; j++)
            SFX(small_nn)(C, A, W, 1, K, N, acc, j * 64, j * 64 + 64 < N ? j * 64 + 64 : N);
        return;
    }
    SFX(packed_gemm)(C, ldc, A, lda, 1, (const T *)P, P == rc->packed_r ? rc->ldp_r : rc->ldp,
                     B, N, K, acc);
}

/* Backward: packs W_hh for the recurrent kernel's dA W_hh when B > 1 (in
 * two parts for a plain GRU with rf, RESET_FIRST), from W_hh (G, H), or with
 * wt from W_hh^T (H, G) row-major (F-ordered W_hh: the same panels); B == 1
 * takes the axpy kernel over W_hh. */
static int SFX(rec_init_bwd)(SFX(rec) *rc, const T *w_hh, int wt, int64_t B, int64_t G,
                             int64_t H, int rf, int nt)
{
    memset(rc, 0, sizeof *rc);
    rc->method = FASTLN_REC_AXPY;
    if (B == 1) return FASTLN_OK;
    int64_t Gh = rf ? 2 * H : G;   /* the gates of the product with h */
    int64_t nh = PACKED_SIZE(H, Gh), nn = rf ? PACKED_SIZE(H, H) : 0;
    T *buf = (T *)fastln_pool_alloc((size_t)(nh + nn) * sizeof(T));
    if (!buf) return FASTLN_ENOMEM;
    rc->own = buf;
    rc->packed = buf;
    rc->packed_n = rf ? buf + nh : NULL;
    rc->ldp = NRT;
    rc->method = FASTLN_REC_PACKED;
    if (wt)
        ON_TEAM(nt,
            PACK_NT(buf, w_hh, H, Gh, G);
            if (rf) PACK_NT(buf + nh, w_hh + 2 * H, H, H, G););
    else
        ON_TEAM(nt,
            PACK_NN(buf, w_hh, Gh, H, H);
            if (rf) PACK_NN(buf + nh, w_hh + 2 * H * H, H, H, H););
    return FASTLN_OK;
}

static void SFX(rec_free)(SFX(rec) *rc) { fastln_pool_free(rc->own); }

/* forward: C (B, G) = h (B, H) W_hh^T.  backward: C (B, H) += dA (B, G) W_hh.
 * The enclosing team shares the work. */
static void SFX(rec_product)(const SFX(rec) *rc, T *C, const T *A, const T *w_hh, int64_t B,
                             int64_t G, int64_t H, int backward)
{
    int64_t N = backward ? H : G, K = backward ? G : H;
    SFX(rec_part)(rc, rc->packed, C, N, A, K, w_hh, B, N, K, backward);
}

