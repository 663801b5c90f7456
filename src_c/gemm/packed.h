/*
 * The packed GEMM of the LN-RNN engine, for float and double on every
 * path: register tiles over weights packed in panels of NRT columns (128
 * bytes a panel row: 32 floats or 16 doubles; pack.c packs them), for the
 * recurrent product of each step and the large products of a layer. Every
 * element of C is one chain of multiply-adds over k in a fixed order, so the
 * products depend on the path alone: no BLAS library, CPU model or thread
 * count changes a bit. Included by rnn/products.h.
 */
#include "gemm/gemm.h"
#include "isa/simd.h"
/* C (M, N) (+)= A (M, K) P, P packed by PACK_NT/PACK_NN: register tiles of
 * MR rows x NRT columns (AVX-512: 8 x 2 zmm; AVX2: 3 x 4 ymm; the generic
 * path: 2 x 8 vectors of VEC_BYTES, which spills on x86's 16 registers
 * but still beats 1 x 8),
 * the k loop broadcasting one A value per row against the panel's columns. */
#if defined(FASTLN_X86) && VEC_BYTES == 64
#define MR 8
#elif defined(FASTLN_X86) && VEC_BYTES == 32
#define MR 3
#else
#define MR 2
#endif
#define NV (NRT / VL)

/* Panels a single tile runs side by side when it has only mr rows: enough
 * chains of FMAs (mr * npn * NV) to cover an FMA's latency. */
#define NPN_MAX 4
#define NPN(mr) (8 / ((mr) * NV) >= NPN_MAX ? NPN_MAX : 8 / ((mr) * NV) > 1 ? 8 / ((mr) * NV) : 1)

/* Columns [0, ncols) of one row of a tile's panel: c = acc ? c + v : v. */
static inline __attribute__((always_inline)) void SFX(tile_store)(T *c, const SFX(vec) *v,
                                                                 int ncols, int acc)
{
    if (ncols == NRT) {
        for (int j = 0; j < NV; j++)
            V_STORE(c + j * VL, acc ? V_ADD(v[j], V_LOAD(c + j * VL)) : v[j]);
    } else {   /* the last, partial panel */
        T tmp[NRT];
        for (int j = 0; j < NV; j++) V_STORE(tmp + j * VL, v[j]);
        for (int j = 0; j < ncols; j++) c[j] = acc ? c[j] + tmp[j] : tmp[j];
    }
}

/* One tile: rows [0, mr) of A and C against npn panels (pst elements
 * apart), the last of which has ncols (<= NRT) columns. mr and npn are constants
 * after inlining, so the accumulators live in registers. Every element of C
 * is one chain of FMAs over k from zero, then stored (or added to C with
 * acc), whatever mr and npn are: they set only how many chains run side by
 * side, so a row's results do not depend on the rows computed with it. */
static inline __attribute__((always_inline)) void SFX(tile)(
    T *C, int64_t ldc, const T *A, int64_t ars, int64_t aks, const T *P,
    int64_t ldp, int64_t pst, int64_t K, int mr, int npn, int ncols, int acc)
{
    SFX(vec) c[MR][NPN_MAX * NV];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < npn * NV; v++) c[r][v] = V_ZERO();
    for (int64_t k = 0; k < K; k++) {
        if (npn == 1) {   /* each panel vector serves every row */
            SFX(vec) b[NV];
            for (int v = 0; v < NV; v++) b[v] = V_LOAD(P + k * ldp + v * VL);
            for (int r = 0; r < mr; r++) {
                SFX(vec) a = V_SET1(A[r * ars + k * aks]);
                for (int v = 0; v < NV; v++) c[r][v] = V_FMA(a, b[v], c[r][v]);
            }
        } else {
            for (int r = 0; r < mr; r++) {
                SFX(vec) a = V_SET1(A[r * ars + k * aks]);
                for (int v = 0; v < npn * NV; v++)
                    c[r][v] = V_FMA(a, V_LOAD(P + v / NV * pst + k * ldp + v % NV * VL), c[r][v]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int q = 0; q < npn; q++) {
            /* a copy: c's address is never taken, so c stays in registers */
            SFX(vec) v[NV];
            for (int j = 0; j < NV; j++) v[j] = c[r][q * NV + j];
            SFX(tile_store)(C + r * ldc + q * NRT, v, q == npn - 1 ? ncols : NRT, acc);
        }
}

#include "gemm/bf16.h"

/* C (M, N) (+)= op(A) (M, K) P, operands of kind bf. FASTLN_GEMM_T, values
 * of T: element (m, k) of op(A) at A[m*ars + k*aks], or, with ars == 0, A
 * packed by pack_at: blocks of MR rows, k-major; P packed in panels (ldp ==
 * NRT), or read in place: K rows ldp apart of N columns, N a multiple of
 * NRT (a row-major (K, N) matrix, or a block of columns of a wider one).
 * FASTLN_GEMM_BF16 (VDPBF16PS) and FASTLN_GEMM_AMX, bfloat16 pairs (bf16.h):
 * A rows of bfloat16 ars apart (aks 1), K a multiple of 32, P packed by
 * pack_nt_bf16 (ldp unused).
 * The (panels, block of MB rows) tiles are shared among the threads of the
 * enclosing parallel region (orphaned omp for; serial outside one) in a
 * static schedule: in the recurrent products each thread keeps the same
 * panels of the weights in its own L2 from step to step. Fewer than MR rows
 * take NPN(M) panels per tile. The k loop runs in passes of KC, each added
 * to C; so every element of C is computed by the same operations in the
 * same order whatever M, the row's place and the thread count are. */
#define MB ((64 / MR) * MR)
#define KC 256   /* k per pass: a panel's slice (32 KiB) and A's stay in L1/L2 */
static void SFX(packed_gemm_any)(fastln_gemm_kind bf, T *C, int64_t ldc, const void *A,
                                 int64_t ars, int64_t aks, const void *P, int64_t ldp, int64_t M,
                                 int64_t N, int64_t K, int acc)
{
    /* panel to panel, in elements of P */
    int64_t pst = bf != FASTLN_GEMM_T ? K * NRT : ldp == NRT ? K * NRT : NRT;
    int64_t np = (N + NRT - 1) / NRT, nmb = (M + MB - 1) / MB;
    int64_t rs = ars ? ars : 1, ks = ars ? aks : MR;
    /* panels per work item: few rows take several at once */
    int gp = bf == FASTLN_GEMM_AMX ? (M <= 16 ? 2 : 1) : M < MR ? NPN(M) : 1;
#if HAVE_BF16DOT
    if (bf == FASTLN_GEMM_AMX) SFX(amx_setup)();
#endif
    int64_t ng = (np + gp - 1) / gp;
    /* Tile (rows from mm, r rows, n panels from p; ncols: the last panel's) */
#define A_AT(mm) ((ars ? (const T *)A + (mm) * ars : (const T *)A + (mm) / MR * K * MR) \
                  + k0 * ks)
#if HAVE_BF16DOT
#define TILE(mm, r, n)                                                                  \
    (bf != FASTLN_GEMM_T                                                                \
         ? SFX(tile_bf16)(C + (mm) * ldc + p * NRT, ldc,                                \
                          (const uint16_t *)A + (mm) * ars + k0, ars,                   \
                          (const uint16_t *)P + p * pst + k0 * NRT, pst, kn / 2, r, n,  \
                          ncols, ac)                                                    \
         : SFX(tile)(C + (mm) * ldc + p * NRT, ldc, A_AT(mm), rs, ks,                   \
                     (const T *)P + p * pst + k0 * ldp, ldp, pst, kn, r, n, ncols, ac))
#else
#define TILE(mm, r, n)                                                                        \
    SFX(tile)(C + (mm) * ldc + p * NRT, ldc, A_AT(mm), rs, ks,                          \
              (const T *)P + p * pst + k0 * ldp, ldp, pst, kn, r, n, ncols, ac)
#endif
    /* The same static schedule in every pass: a thread owns its C tiles, so
     * the passes need no barrier, and the k order never depends on threads. */
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
        int64_t kn = K - k0 < KC ? K - k0 : KC;
        int ac = acc || k0 > 0;
#pragma omp for schedule(static) nowait
        for (int64_t q = 0; q < ng * nmb; q++) {
            int64_t p0 = q % ng * gp, m = q / ng * MB, m1 = m + MB < M ? m + MB : M;
            int cnt = np - p0 < gp ? (int)(np - p0) : gp;
#if HAVE_BF16DOT
            if (bf == FASTLN_GEMM_AMX) {   /* 32 rows at a time, or 16 against two panels */
                int64_t p = p0, pl = p0 + cnt - 1;
                int ncols = N - pl * NRT < NRT ? (int)(N - pl * NRT) : NRT;
                for (int64_t mm = m; mm < m1; mm += 32)
                    SFX(tile_amx)(C + mm * ldc + p * NRT, ldc,
                                  (const uint16_t *)A + mm * ars + k0, ars,
                                  (const uint16_t *)P + p * pst + k0 * NRT, pst, cnt == 2,
                                  kn, m1 - mm < 32 ? (int)(m1 - mm) : 32, ncols, ac);
                continue;
            }
#endif
#if MR > 1
            if (gp > 1) {   /* M < MR rows against cnt panels at once */
                int64_t p = p0;
                int ncols = N - (p + cnt - 1) * NRT < NRT
                                ? (int)(N - (p + cnt - 1) * NRT) : NRT;
#define SMALL(r)                                   \
    switch (cnt) {                                 \
        case 4: TILE(m, r, 4); break;              \
        case 3: TILE(m, r, 3); break;              \
        case 2: TILE(m, r, 2); break;              \
        default: TILE(m, r, 1); break;             \
    }
#if MR > 2
                if (M == 1) SMALL(1) else SMALL(2)
#else
                SMALL(1)
#endif
#undef SMALL
                continue;
            }
#endif
            for (int64_t p = p0; p < p0 + cnt; p++) {
                int ncols = N - p * NRT < NRT ? (int)(N - p * NRT) : NRT;
                int64_t mm = m;
                for (; mm + MR <= m1; mm += MR) TILE(mm, MR, 1);
                switch (m1 - mm) {
#define TAIL(r) case r: TILE(mm, r, 1); break;
#if MR > 1
                    TAIL(1)
#endif
#if MR > 2
                    TAIL(2)
#endif
#if MR > 3
                    TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7)
#endif
#undef TAIL
                    default: break;
                }
            }
        }
    }
#undef A_AT
#undef TILE
#pragma omp barrier
}

/* The product of T values: see packed_gemm_any. */
static inline void SFX(packed_gemm)(T *C, int64_t ldc, const T *A, int64_t ars,
                                    int64_t aks, const T *P, int64_t ldp, int64_t M,
                                    int64_t N, int64_t K, int acc)
{
    SFX(packed_gemm_any)(FASTLN_GEMM_T, C, ldc, A, ars, aks, P, ldp, M, N, K, acc);
}
#undef KC
#undef MB

/* Ap = A^T (M, K) of A (K, M) in blocks of MR rows, k-major, zero-padded:
 * the tiles then read op(A) sequentially instead of one row of A per k.
 * Rows of A are read whole; the team shares them (orphaned omp for). */
static void SFX(pack_at)(T *Ap, const T *A, int64_t M, int64_t K)
{
    int64_t nb = (M + MR - 1) / MR;
#pragma omp for schedule(static)
    for (int64_t k = 0; k < K; k++) {
        const T *src = A + k * M;
        for (int64_t b = 0; b < nb; b++) {
            T *dst = Ap + (b * K + k) * MR;
            int64_t n = M - b * MR < MR ? M - b * MR : MR;
            for (int r = 0; r < MR; r++) dst[r] = r < n ? src[b * MR + r] : (T)0;
        }
    }
}

/* Row-major C (M, N) = op(A) op(B) on the packed kernel with nt threads, for
 * the large products of a layer (contiguous operands: lda, ldb are the row
 * lengths). Returns FASTLN_ENOMEM when the packed copy cannot be allocated. */
static int SFX(gemm_big)(char ta, char tb, int64_t M, int64_t N, int64_t K, const T *A,
                         const T *B, T *C, int nt)
{
    /* C = A^T B (the weight gradients, K = T*B large): transposing A costs
     * M*K, so with M > N compute C^T = B^T A instead (transposing B, N*K)
     * and transpose the small result. */
    int swap = ta == 'T' && tb == 'N' && M > N;
    if (swap) {
        const T *t = A;
        A = B;
        B = t;
        int64_t n = M;
        M = N;
        N = n;
    }
    /* B (K, N) row-major with whole panels and rows of up to 1 KiB is read in
     * place; with long rows a pass of KC rows would touch KC pages (TLB
     * misses), and a packed copy is faster */
    int in_place = tb == 'N' && N % NRT == 0 && N * (int64_t)sizeof(T) <= 1024;
    int64_t np = in_place ? 0 : PACKED_SIZE(N, K);
    int64_t na = ta == 'T' ? (M + MR - 1) / MR * MR * K : 0;
    T *P = (T *)malloc((size_t)(np + na + (swap ? M * N : 0) + 1) * sizeof(T));
    if (!P) return FASTLN_ENOMEM;
    T *Ap = ta == 'T' ? P + np : NULL, *Ct = swap ? P + np + na : C;
    int64_t ars = ta == 'N' ? K : 0;
    ON_TEAM(nt,
        if (tb == 'T') PACK_NT(P, B, N, K, K);
        else if (!in_place) PACK_NN(P, B, K, N, N);
        if (Ap) SFX(pack_at)(Ap, A, M, K);   /* ends with a barrier */
        SFX(packed_gemm)(Ct, N, Ap ? Ap : A, ars, 1, in_place ? B : P,
                         in_place ? N : NRT, M, N, K, 0);
        if (swap) {
            _Pragma("omp for schedule(static)")
            for (int64_t j = 0; j < N; j++)   /* C (N, M) = Ct^T */
                for (int64_t i = 0; i < M; i++) C[j * M + i] = Ct[i * N + j];
        });
    free(P);
    return FASTLN_OK;
}
#undef MR
#undef NV
#undef NPN
#undef NPN_MAX
