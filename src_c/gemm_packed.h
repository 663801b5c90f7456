/*
 * The packed GEMM of the LN-RNN engine (float, AVX2 and AVX-512): register
 * tiles over weights packed in panels of FASTLN_NR columns (rnn.c packs
 * them), for the recurrent product of each step and the large products of a
 * layer. Included by rnn_engine.h, which defines HAVE_PACKED from this.
 */
#include "simd.h"
#if IS_F32 && defined(FASTLN_X86) && VEC_BYTES >= 32
#define HAVE_PACKED 1
/* C (M, N) (+)= A (M, K) P, P packed by fastln_pack_nt/nn: register tiles of
 * MR rows x 32 columns (AVX-512: 8 x 2 zmm; AVX2: 3 x 4 ymm), the k loop
 * broadcasting one A value per row against the panel's 32 columns. */
#if VEC_BYTES == 64
typedef __m512 SFX(vf);
#define VL 16
#define MR 8
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps((p), (v))
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm512_add_ps((a), (b))
#else
typedef __m256 SFX(vf);
#define VL 8
#define MR 3
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps((p), (v))
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VADD(a, b) _mm256_add_ps((a), (b))
#endif
#define NV (FASTLN_NR / VL)

/* One tile: rows [0, mr) of A and C, ncols (<= 32) columns of C. mr is a
 * constant after inlining, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void SFX(tile)(
    float *C, int64_t ldc, const float *A, int64_t ars, int64_t aks, const float *P,
    int64_t ldp, int64_t K, int mr, int ncols, int acc)
{
    SFX(vf) c[MR][NV];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < NV; v++) c[r][v] = VZERO();
    for (int64_t k = 0; k < K; k++) {
        SFX(vf) b[NV];
        for (int v = 0; v < NV; v++) b[v] = VLOAD(P + k * ldp + v * VL);
        for (int r = 0; r < mr; r++) {
            SFX(vf) a = VSET1(A[r * ars + k * aks]);
            for (int v = 0; v < NV; v++) c[r][v] = VFMA(a, b[v], c[r][v]);
        }
    }
    for (int r = 0; r < mr; r++) {
        float *cr = C + r * ldc;
        if (ncols == FASTLN_NR) {
            for (int v = 0; v < NV; v++)
                VSTORE(cr + v * VL, acc ? VADD(c[r][v], VLOAD(cr + v * VL)) : c[r][v]);
        } else {   /* the last, partial panel */
            float tmp[FASTLN_NR];
            for (int v = 0; v < NV; v++) VSTORE(tmp + v * VL, c[r][v]);
            for (int j = 0; j < ncols; j++) cr[j] = acc ? cr[j] + tmp[j] : tmp[j];
        }
    }
}

/* C (M, N) (+)= op(A) (M, K) P, element (m, k) of op(A) at A[m*ars + k*aks],
 * or, with ars == 0, A packed by pack_at: blocks of MR rows, k-major. P is
 * packed in panels (ldp == FASTLN_NR), or a row-major (K, N) matrix with
 * N % FASTLN_NR == 0 (ldp == N) read in place.
 * The (panel, block of MB rows) tiles are shared among the threads of the
 * enclosing parallel region (orphaned omp for; serial outside one) in a
 * static schedule: in the recurrent products each thread keeps the same
 * panels of the weights in its own L2 from step to step. */
#define MB ((64 / MR) * MR)
#define KC 256   /* k per pass: a panel's slice (32 KiB) and A's stay in L1/L2 */
static void SFX(packed_gemm)(float *C, int64_t ldc, const float *A, int64_t ars, int64_t aks,
                             const float *P, int64_t ldp, int64_t M, int64_t N, int64_t K,
                             int acc)
{
    int64_t pst = ldp == FASTLN_NR ? K * FASTLN_NR : FASTLN_NR;   /* panel to panel */
    int64_t np = (N + FASTLN_NR - 1) / FASTLN_NR, nmb = (M + MB - 1) / MB;
    int64_t rs = ars ? ars : 1, ks = ars ? aks : MR;
    /* The same static schedule in every pass: a thread owns its C tiles, so
     * the passes need no barrier, and the k order never depends on threads. */
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kn = K - k0 < KC ? K - k0 : KC;
        int ac = acc || k0 > 0;
#pragma omp for schedule(static) nowait
        for (int64_t q = 0; q < np * nmb; q++) {
            int64_t p = q % np, m = q / np * MB, m1 = m + MB < M ? m + MB : M;
            int ncols = N - p * FASTLN_NR < FASTLN_NR ? (int)(N - p * FASTLN_NR) : FASTLN_NR;
            const float *Pp = P + p * pst + k0 * ldp;
            float *Cp = C + p * FASTLN_NR;
#define A_AT(m) ((ars ? A + (m) * ars : A + (m) / MR * K * MR) + k0 * ks)
            for (; m + MR <= m1; m += MR)
                SFX(tile)(Cp + m * ldc, ldc, A_AT(m), rs, ks, Pp, ldp, kn, MR, ncols, ac);
            switch (m1 - m) {
#define TAIL(k) case k: SFX(tile)(Cp + m * ldc, ldc, A_AT(m), rs, ks, Pp, ldp, kn, k, ncols, ac); break;
                TAIL(1) TAIL(2)
#if MR > 3
                TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7)
#endif
#undef TAIL
                default: break;
            }
#undef A_AT
        }
    }
#pragma omp barrier
}
#undef KC
#undef MB

/* Ap = A^T (M, K) of A (K, M) in blocks of MR rows, k-major, zero-padded:
 * the tiles then read op(A) sequentially instead of one row of A per k.
 * Rows of A are read whole; the team shares them (orphaned omp for). */
static void SFX(pack_at)(float *Ap, const float *A, int64_t M, int64_t K)
{
    int64_t nb = (M + MR - 1) / MR;
#pragma omp for schedule(static)
    for (int64_t k = 0; k < K; k++) {
        const float *src = A + k * M;
        for (int64_t b = 0; b < nb; b++) {
            float *dst = Ap + (b * K + k) * MR;
            int64_t n = M - b * MR < MR ? M - b * MR : MR;
            for (int r = 0; r < MR; r++) dst[r] = r < n ? src[b * MR + r] : 0.0f;
        }
    }
}

/* Row-major C (M, N) = op(A) op(B) on the packed kernel with nt threads, for
 * the large products of a layer (contiguous operands: lda, ldb are the row
 * lengths). Returns FASTLN_ENOMEM when the packed copy cannot be allocated. */
static int SFX(gemm_big)(char ta, char tb, int64_t M, int64_t N, int64_t K, const float *A,
                         const float *B, float *C, int nt)
{
    /* C = A^T B (the weight gradients, K = T*B large): transposing A costs
     * M*K, so with M > N compute C^T = B^T A instead (transposing B, N*K)
     * and transpose the small result. */
    int swap = ta == 'T' && tb == 'N' && M > N;
    if (swap) {
        const float *t = A;
        A = B;
        B = t;
        int64_t n = M;
        M = N;
        N = n;
    }
    /* B (K, N) row-major with whole panels and rows of up to 256 is read in place;
     * with long rows a pass of KC rows would touch KC pages (TLB misses),
     * and a packed copy is faster */
    int in_place = tb == 'N' && N % FASTLN_NR == 0 && N <= 256;
    int64_t np = in_place ? 0 : fastln_packed_size(N, K);
    int64_t na = ta == 'T' ? (M + MR - 1) / MR * MR * K : 0;
    float *P = (float *)malloc((size_t)(np + na + (swap ? M * N : 0) + 1) * sizeof(float));
    if (!P) return FASTLN_ENOMEM;
    float *Ap = ta == 'T' ? P + np : NULL, *Ct = swap ? P + np + na : C;
    int64_t ars = ta == 'N' ? K : 0;
    ON_TEAM(nt,
        if (tb == 'T') fastln_pack_nt(P, B, N, K);
        else if (!in_place) fastln_pack_nn(P, B, K, N);
        if (Ap) SFX(pack_at)(Ap, A, M, K);   /* ends with a barrier */
        SFX(packed_gemm)(Ct, N, Ap ? Ap : A, ars, 1, in_place ? B : P,
                         in_place ? N : FASTLN_NR, M, N, K, 0);
        if (swap) {
            _Pragma("omp for schedule(static)")
            for (int64_t j = 0; j < N; j++)   /* C (N, M) = Ct^T */
                for (int64_t i = 0; i < M; i++) C[j * M + i] = Ct[i * N + j];
        });
    free(P);
    return FASTLN_OK;
}
#undef VL
#undef MR
#undef VZERO
#undef VLOAD
#undef VSTORE
#undef VSET1
#undef VFMA
#undef VADD
#undef NV
#else
#define HAVE_PACKED 0
#endif
