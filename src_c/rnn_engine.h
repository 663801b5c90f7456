/*
 * LN-RNN engine: the per-step kernels and the layer drivers, written once
 * and compiled per (element type, ISA) like kernels_impl.h, after it (it
 * reuses its row helpers). Extra macros from kernels_isa.h: IS_F32 (1 for
 * float), GEMM (fastln_gemm_f32 or _f64).
 *
 * Shape legend (one layer, time-major; G = gates * H; see fastln_rnn.h):
 *   x (T, B, I), y (T, B, H); state h, c (B, H)
 *   A_ih = x W_ih^T, one product per chunk of about 256 rows (chunk_steps);
 *   A_hh (B, G) = h_{t-1} W_hh^T, one product per step
 *   cache (fastln_rnn_layout): xih/xhh = A_ih/A_hh normalized, act = GRU gate
 *     activations, hseq/cseq = h/c at t-1, xc = LN(c) normalized, rstd
 *   backward: dA_ih, dA_hh (T, B, G) = gradients of A_ih, A_hh (RNN: one
 *     array, the two are equal); dg (B, gw) per-step gradients of the LN
 *     outputs, reduced over rows into the LN gains and biases
 *
 * A chunk runs in one parallel region: its input product, then per step the
 * recurrent product (packed-weight kernel, or a dot kernel at B == 1; BLAS,
 * between regions, for double and on the generic path), then one fused row
 * kernel per row (all LN statistics, gates, state update, output), rows
 * shared by the team. Backward adds a column-parallel reduction of the LN
 * parameter gradients in double, rows in order, so that they do not depend
 * on the thread count, and ends with the products for dW_ih, dW_hh, dx.
 */

/* Runs the statements on a team of nt threads, or directly when nt == 1: an
 * OpenMP region costs about a microsecond to set up even for one thread,
 * which matters to step(). The orphaned omp for/single/barrier constructs in
 * the statements bind to the team, or run serially without one. */
#ifndef ON_TEAM
#define ON_TEAM(nt, ...)                                  \
    do {                                                  \
        if ((nt) > 1) {                                   \
            _Pragma("omp parallel num_threads(nt)") { __VA_ARGS__ } \
        } else {                                          \
            __VA_ARGS__                                   \
        }                                                 \
    } while (0)
#endif

/* ---- elementwise activations ------------------------------------------- */

#if IS_F32
/* exp(x) for float as a vectorizable polynomial (Cephes expf: |rel err| <
 * 2 ulp): x = n ln2 + r, |r| <= ln2/2, exp(x) = 2^n p(r). */
static inline float SFX(expf_poly)(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick: vectorizes on every ISA */
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = FMA(p, r, 1.3981999507e-3f);
    p = FMA(p, r, 8.3334519073e-3f);
    p = FMA(p, r, 4.1665795894e-2f);
    p = FMA(p, r, 1.6666665459e-1f);
    p = FMA(p, r, 5.0000001201e-1f);
    p = FMA(p, r * r, r) + 1.0f;
    union { int32_t i; float f; } scale;   /* 2^n, n in [-126, 127]; a union vectorizes */
    scale.i = ((int32_t)n + 127) << 23;
    return p * scale.f;
}

static inline float SFX(sigmoid1)(float x) { return 1.0f / (1.0f + SFX(expf_poly)(-x)); }

/* tanh: an odd polynomial below 0.625 (Cephes tanhf), else 1 - 2/(e^2|x| + 1) */
static inline float SFX(tanh1)(float x)
{
    float ax = __builtin_fabsf(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = FMA(p, z, 2.06390887954e-2f);
    p = FMA(p, z, -5.37397155531e-2f);
    p = FMA(p, z, 1.33314422036e-1f);
    p = FMA(p, z, -3.33332819422e-1f);
    float small = FMA(p * z, x, x);
    float big = 1.0f - 2.0f / (SFX(expf_poly)(2.0f * ax) + 1.0f);
    return ax < 0.625f ? small : __builtin_copysignf(big, x);
}
#else
static inline double SFX(sigmoid1)(double x) { return 1.0 / (1.0 + exp(-x)); }
static inline double SFX(tanh1)(double x) { return tanh(x); }
#endif

static inline void SFX(sigmoid_n)(T *v, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) v[i] = SFX(sigmoid1)(v[i]);
}

static inline void SFX(tanh_n)(T *v, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) v[i] = SFX(tanh1)(v[i]);
}

/* ---- LayerNorm pieces over one vector ---------------------------------- */

/* xhat = (a - mean(a)) * rstd, in place allowed; *rstd = 1/sqrt(var + eps).
 * The same shifted two-pass statistics as layer_norm (kernels_impl.h). */
static inline void SFX(ln_vec)(T *xhat, T *rstd, const T *a, int64_t n, double eps)
{
    T shift = a[0];
    double s1 = SFX(sum_shifted)(a, n, shift);
    T dm = (T)(s1 / (double)n);
    double var = SFX(sumsq_centered)(a, n, shift, dm) / (double)n;
    SFX(ln_finish_row)(xhat, NULL, rstd, a, NULL, NULL, n, eps, shift, s1, dm, var);
}

/* The statistics of ln_vec without its sweep: xhat = ((a - *sh) - *dm) * *r.
 * A row whose float statistics are suspect is normalized in place in double
 * (ln_finish_row's fallback), and then *sh = *dm = 0, *r = 1. */
static inline void SFX(ln_prep)(T *a, T *sh, T *dm, T *r, T *rstd, int64_t n, double eps)
{
    *sh = a[0];
    double s1 = SFX(sum_shifted)(a, n, *sh);
    *dm = (T)(s1 / (double)n);
    double var = SFX(sumsq_centered)(a, n, *sh, *dm) / (double)n;
    if (SFX(stats_suspect)(var, a, n, *sh) || !isfinite(s1)) {
        SFX(ln_row_double)(a, NULL, rstd, a, NULL, NULL, n, eps);
        *sh = *dm = 0;
        *r = 1;
        return;
    }
    *r = *rstd = (T)(1.0 / sqrt(var + eps));
}

/* LSTM gates over columns [j0, j1): act = f(LN(ai) + LN(ah) + bias), f the
 * sigmoid or tanh, one sweep; with keep (a constant after inlining) the
 * normalized ai, ah are stored back for the cache. */
static inline __attribute__((always_inline)) void SFX(lstm_gates)(
    T *act, T *ai, T *ah, const T *const *p, T si, T di, T ri, T sh, T dh, T rh, int64_t j0,
    int64_t j1, int tanh_gate, int keep)
{
#pragma omp simd
    for (int64_t j = j0; j < j1; j++) {
        T xi = ((ai[j] - si) - di) * ri, xh = ((ah[j] - sh) - dh) * rh;
        if (keep) {
            ai[j] = xi;
            ah[j] = xh;
        }
        T v = FMA(xi, p[3][j], p[4][j]) + FMA(xh, p[5][j], p[6][j]) + p[2][j];
        act[j] = tanh_gate ? SFX(tanh1)(v) : SFX(sigmoid1)(v);
    }
}

/* Plain LSTM: act = the gates (i, f: sigmoid; g: tanh; o: sigmoid) of the
 * pre-activations pre (4H); forward and backward share it, so the gates
 * backward recomputes are bitwise those of forward. */
static inline void SFX(plain_gates)(T *act, const T *pre, int64_t H)
{
#pragma omp simd
    for (int64_t j = 0; j < 2 * H; j++) act[j] = SFX(sigmoid1)(pre[j]);
#pragma omp simd
    for (int64_t j = 2 * H; j < 3 * H; j++) act[j] = SFX(tanh1)(pre[j]);
#pragma omp simd
    for (int64_t j = 3 * H; j < 4 * H; j++) act[j] = SFX(sigmoid1)(pre[j]);
}

/* da = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = d * w: the gradient
 * of LN(a) = xhat * w + b with respect to a, given d = dLoss/dLN(a). */
static inline void SFX(ln_vec_bwd)(T *da, const T *d, const T *w, const T *xhat, T rstd,
                                   int64_t n)
{
    T sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t i = 0; i < n; i++) {
        T g = d[i] * w[i];
        sg += g;
        sgx = FMA(g, xhat[i], sgx);
    }
    T mg = sg / (T)n, mgx = sgx / (T)n;
#pragma omp simd
    for (int64_t i = 0; i < n; i++) da[i] = rstd * FMA(-xhat[i], mgx, d[i] * w[i] - mg);
}

/* aw[j] += sum_b g[b][j] * xh[b][j], ab[j] += sum_b g[b][j] (aw or ab may be NULL),
 * for columns [j0, j1), rows in order: the same sums on any thread count. */
static inline void SFX(col_acc)(double *aw, double *ab, const T *g, int64_t ldg, const T *xh,
                                int64_t ldx, int64_t B, int64_t j0, int64_t j1)
{
    for (int64_t b = 0; b < B; b++) {
        const T *gr = g + b * ldg;
        if (aw) {
            const T *xr = xh + b * ldx;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) aw[j] += (double)(gr[j] * xr[j]);
        }
        if (ab) {
#pragma omp simd
            for (int64_t j = j0; j < j1; j++) ab[j] += (double)gr[j];
        }
    }
}

/* ---- recurrent products ------------------------------------------------ */

#if IS_F32 && defined(FASTLN_X86) && VEC_BYTES == 64
#define HAVE_GEMV16 1
/* c[j] (+)= dot(row j of W, a) for j < 16, K elements: one accumulator per
 * row, then a transposing reduction tree (reduce16: 16 vectors -> one vector
 * of the 16 sums) instead of 16 horizontal sums. */
static inline void SFX(gemv16)(float *c, const float *a, const float *W, int64_t K, int acc)
{
    __m512 s[16];
    for (int j = 0; j < 16; j++) s[j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1);
        __m512 av = _mm512_maskz_loadu_ps(m, a + k);
        for (int j = 0; j < 16; j++)
            s[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, W + j * K + k), av, s[j]);
    }
    __m512 r = reduce16(s);   /* simd.h */
    if (acc) r = _mm512_add_ps(r, _mm512_loadu_ps(c));
    _mm512_storeu_ps(c, r);
}
#else
#define HAVE_GEMV16 0
#endif

/* B == 1 and other tiny M, unpacked W:
 * nt:  C (M, N) (+)= A (M, K) W^T, W (N, K): four dot products at a time
 * nn:  C (M, K) (+)= A (M, N) W,   W (N, K): four axpys at a time */
static void SFX(small_nt)(T *C, const T *A, const T *W, int64_t M, int64_t N, int64_t K,
                          int acc, int64_t n0, int64_t n1)
{   /* output columns [n0, n1) */
    for (int64_t m = 0; m < M; m++) {
        const T *a = A + m * K;
        T *c = C + m * N;
        int64_t n = n0;
#if HAVE_GEMV16
        for (; n + 16 <= n1; n += 16) SFX(gemv16)(c + n, a, W + n * K, K, acc);
#endif
        for (; n + 4 <= n1; n += 4) {
            const T *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
            T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t k = 0; k < K; k++) {
                s0 = FMA(a[k], w0[k], s0);
                s1 = FMA(a[k], w1[k], s1);
                s2 = FMA(a[k], w2[k], s2);
                s3 = FMA(a[k], w3[k], s3);
            }
            c[n] = acc ? c[n] + s0 : s0;
            c[n + 1] = acc ? c[n + 1] + s1 : s1;
            c[n + 2] = acc ? c[n + 2] + s2 : s2;
            c[n + 3] = acc ? c[n + 3] + s3 : s3;
        }
        for (; n < n1; n++) {
            const T *w0 = W + n * K;
            T s0 = 0;
#pragma omp simd reduction(+ : s0)
            for (int64_t k = 0; k < K; k++) s0 = FMA(a[k], w0[k], s0);
            c[n] = acc ? c[n] + s0 : s0;
        }
    }
}

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

#include "gemm_packed.h"

/* The large products of a layer: C (M, N) = op(A) op(B), contiguous
 * operands, on the packed kernel and fastln's threads where there is one
 * (BLAS's own threads would compete with fastln's for the cores between
 * steps), else through BLAS. */
static int SFX(gemm_layer)(char ta, char tb, int64_t M, int64_t N, int64_t K, const T *A,
                           const T *B, T *C, int nt)
{
#if HAVE_PACKED
    return SFX(gemm_big)(ta, tb, M, N, K, A, B, C, nt);
#else
    (void)nt;
    GEMM(ta, tb, M, N, K, 1, A, ta == 'N' ? K : M, B, tb == 'N' ? N : K, 0, C, N);
    return FASTLN_OK;
#endif
}

/* How a layer does its recurrent products. */
typedef struct {
    int kind;        /* 0: BLAS, 1: packed (float, x86), 2: small (B == 1) */
    float *packed;   /* kind 1: the packed W_hh (forward) or W_hh^T (backward) */
    float *packed_ih;   /* forward on the packed path: W_ih packed, else NULL */
} SFX(rec);

/* Packs what the products of a layer need: W_hh for the recurrent kernel
 * when B > 1, and (forward, with_ih) W_ih for the input projections. */
static int SFX(rec_init)(SFX(rec) *rc, const T *w_hh, const T *w_ih, int64_t B, int64_t G,
                         int64_t H, int64_t I, int backward, int with_ih, int nt)
{
    rc->kind = B == 1 ? 2 : 0;
    rc->packed = rc->packed_ih = NULL;
#if HAVE_PACKED
    int64_t N = backward ? H : G, K = backward ? G : H;
    int64_t nh = B > 1 ? fastln_packed_size(N, K) : 0, ni = with_ih ? fastln_packed_size(G, I) : 0;
    if (nh + ni == 0) return FASTLN_OK;
    float *buf = (float *)malloc((size_t)(nh + ni) * sizeof(float));
    if (!buf) return FASTLN_ENOMEM;
    if (B > 1) {
        rc->packed = buf;
        rc->kind = 1;
    }
    rc->packed_ih = with_ih ? buf + nh : NULL;
    ON_TEAM(nt,
        if (rc->packed && backward) fastln_pack_nn(rc->packed, w_hh, K, N);
        else if (rc->packed) fastln_pack_nt(rc->packed, w_hh, N, K);
        if (rc->packed_ih) fastln_pack_nt(rc->packed_ih, w_ih, G, I););
#else
    (void)w_hh; (void)w_ih; (void)G; (void)H; (void)I; (void)backward; (void)with_ih; (void)nt;
#endif
    return FASTLN_OK;
}

static void SFX(rec_free)(SFX(rec) *rc) { free(rc->packed ? rc->packed : rc->packed_ih); }

/* Whether the per-step product runs inside the step's parallel region. */
static inline int SFX(rec_in_region)(const SFX(rec) *rc) { return rc->kind != 0; }

/* forward: C (B, G) = h (B, H) W_hh^T.  backward: C (B, H) += dA (B, G) W_hh.
 * Kinds 1 and 2 share the work among the enclosing team; kind 0 (BLAS) runs
 * outside any parallel region. */
static void SFX(rec_product)(const SFX(rec) *rc, T *C, const T *A, const T *w_hh, int64_t B,
                             int64_t G, int64_t H, int backward)
{
    int64_t N = backward ? H : G, K = backward ? G : H;
#if HAVE_PACKED
    if (rc->kind == 1) {
        SFX(packed_gemm)(C, N, A, K, 1, rc->packed, FASTLN_NR, B, N, K, backward);
        return;
    }
#endif
    if (rc->kind == 2) {   /* blocks of 64 output columns over the team */
        int64_t nb = (N + 63) / 64;
#pragma omp for schedule(static)
        for (int64_t j = 0; j < nb; j++) {
            int64_t j1 = j * 64 + 64 < N ? j * 64 + 64 : N;
            if (backward) SFX(small_nn)(C, A, w_hh, B, G, H, 1, j * 64, j1);
            else SFX(small_nt)(C, A, w_hh, B, G, H, 0, j * 64, j1);
        }
        return;
    }
    if (backward) GEMM('N', 'N', B, H, G, 1, A, G, w_hh, H, 1, C, H);
    else GEMM('N', 'T', B, G, H, 1, A, H, w_hh, H, 0, C, G);
    (void)N; (void)K;
}

/* ---- fused row kernels ------------------------------------------------- */

/* One layer's sizes and parameters, and where step t's rows live. */
typedef struct {
    int cell, plain;       /* plain: no LayerNorm (FASTLN_CELL_PLAIN) */
    int64_t B, H, G, gw;   /* gw: width of a dg row (backward scratch) */
    double eps;
    const T *const *p;     /* parameters, fastln_rnn.h order */
    const int64_t *len;
    fastln_rnn_layout L;
    T *cache;              /* NULL: inference */
} SFX(layer);

static inline int SFX(active)(const SFX(layer) *ly, int64_t t, int64_t b)
{
    return !ly->len || t < ly->len[b];
}

/* Forward, one row: ai, ah = A_ih, A_hh (G), normalized in place; act (G)
 * activations; xc (H) normalized c; rs rstds; hp, cp -> hn, cn the state
 * (hn may be hp, cn may be cp); y (H). */
static void SFX(fwd_row)(const SFX(layer) *ly, int active, T *ai, T *ah, T *act, T *xc,
                         T *rs, const T *hp, const T *cp, T *hn, T *cn, T *y)
{
    const int64_t H = ly->H, G = ly->G;
    const T *const *p = ly->p;
    if (!active) {   /* hold the state, output 0 */
        if (hn != hp) memcpy(hn, hp, (size_t)H * sizeof(T));
        if (cn && cn != cp) memcpy(cn, cp, (size_t)H * sizeof(T));
        memset(y, 0, (size_t)H * sizeof(T));
        return;
    }
    if (ly->plain) {
        /* p: 0 W_ih, 1 W_hh, 2 bias; ai <- the pre-activations (the cache) */
#pragma omp simd
        for (int64_t j = 0; j < G; j++) ai[j] = (ai[j] + ah[j]) + p[2][j];
        if (ly->cell == FASTLN_CELL_LSTM) {
            SFX(plain_gates)(act, ai, H);
#pragma omp simd
            for (int64_t j = 0; j < H; j++) hn[j] = cn[j] = FMA(act[H + j], cp[j], act[j] * act[2 * H + j]);
            SFX(tanh_n)(hn, H);
#pragma omp simd
            for (int64_t j = 0; j < H; j++) hn[j] *= act[3 * H + j];
        } else if (ly->cell == FASTLN_CELL_RNN_TANH) {
            memcpy(hn, ai, (size_t)H * sizeof(T));
            SFX(tanh_n)(hn, H);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < H; j++) hn[j] = ai[j] > 0 ? ai[j] : 0;
        }
    } else if (ly->cell == FASTLN_CELL_LSTM) {
        /* p: 0 W_ih, 1 W_hh, 2 bias, 3-4 ln_ih, 5-6 ln_hh, 7-8 ln_c */
        T si, di, ri, sh, dh, rh;
        SFX(ln_prep)(ai, &si, &di, &ri, &rs[0], G, ly->eps);
        SFX(ln_prep)(ah, &sh, &dh, &rh, &rs[1], G, ly->eps);
        if (ly->cache) {   /* i, f: sigmoid; g: tanh; o: sigmoid */
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 0, 2 * H, 0, 1);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 2 * H, 3 * H, 1, 1);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 3 * H, G, 0, 1);
        } else {
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 0, 2 * H, 0, 0);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 2 * H, 3 * H, 1, 0);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 3 * H, G, 0, 0);
        }
#pragma omp simd
        for (int64_t j = 0; j < H; j++) cn[j] = FMA(act[H + j], cp[j], act[j] * act[2 * H + j]);
        SFX(ln_vec)(xc, &rs[2], cn, H, ly->eps);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) hn[j] = FMA(xc[j], p[7][j], p[8][j]);
        SFX(tanh_n)(hn, H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) hn[j] *= act[3 * H + j];
    } else if (ly->cell == FASTLN_CELL_GRU) {
        /* p: 0 W_ih, 1 W_hh, 2-3 ln_ih, 4-5 ln_hh (2H), 6-7 ln_in, 8-9 ln_hn (H) */
        SFX(ln_vec)(ai, &rs[0], ai, 2 * H, ly->eps);
        SFX(ln_vec)(ai + 2 * H, &rs[1], ai + 2 * H, H, ly->eps);
        SFX(ln_vec)(ah, &rs[2], ah, 2 * H, ly->eps);
        SFX(ln_vec)(ah + 2 * H, &rs[3], ah + 2 * H, H, ly->eps);
#pragma omp simd
        for (int64_t j = 0; j < 2 * H; j++)
            act[j] = FMA(ai[j], p[2][j], p[3][j]) + FMA(ah[j], p[4][j], p[5][j]);
        SFX(sigmoid_n)(act, 2 * H);          /* z, r */
        T *n = act + 2 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++)
            n[j] = FMA(act[H + j], FMA(ah[2 * H + j], p[8][j], p[9][j]),
                       FMA(ai[2 * H + j], p[6][j], p[7][j]));
        SFX(tanh_n)(n, H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) hn[j] = FMA(1 - act[j], hp[j], act[j] * n[j]);
    } else {
        /* p: 0 W_ih, 1 W_hh, 2-3 ln */
#pragma omp simd
        for (int64_t j = 0; j < H; j++) ai[j] += ah[j];
        SFX(ln_vec)(ai, &rs[0], ai, H, ly->eps);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) hn[j] = FMA(ai[j], p[2][j], p[3][j]);
        if (ly->cell == FASTLN_CELL_RNN_TANH) {
            SFX(tanh_n)(hn, H);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < H; j++) hn[j] = hn[j] > 0 ? hn[j] : 0;
        }
    }
    memcpy(y, hn, (size_t)H * sizeof(T));
}

/* Backward, one row of step t. In: dy (H); dh, dc (H) the gradient of h_t,
 * c_t from later steps; the cached rows. Out: dai, dah (G) the gradients of
 * A_ih, A_hh (the same array for the RNN); dg (gw) the gradients of the LN
 * outputs for the parameter sums; dh <- the direct part of dL/dh_{t-1} (the
 * recurrent product adds the rest), dc <- dL/dc_{t-1}. */
static void SFX(bwd_row)(const SFX(layer) *ly, int active, T *dai, T *dah, T *dg, T *dh,
                         T *dc, const T *dy, const T *xi, const T *xh, const T *act,
                         const T *xc, const T *rs, const T *hp, const T *hcur, const T *cp)
{
    const int64_t H = ly->H, G = ly->G;
    const T *const *p = ly->p;
    if (!active) {   /* the state was held: gradients pass through */
        memset(dai, 0, (size_t)G * sizeof(T));
        if (dah != dai) memset(dah, 0, (size_t)G * sizeof(T));
        return;
    }
    if (ly->plain && ly->cell == FASTLN_CELL_LSTM) {
        /* xi: the cached pre-activations; dg: [dgates (G) | tanh(c) (H)] */
        T *a = (T *)act, *th = dg + G;
        SFX(plain_gates)(a, xi, H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) th[j] = FMA(act[H + j], cp[j], act[j] * act[2 * H + j]);
        SFX(tanh_n)(th, H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T i = act[j], f = act[H + j], g = act[2 * H + j], o = act[3 * H + j];
            T d = dy[j] + dh[j], t = th[j], dcc = dc[j] + d * o * (1 - t * t);
            dg[j] = dcc * g * i * (1 - i);
            dg[H + j] = dcc * cp[j] * f * (1 - f);
            dg[2 * H + j] = dcc * i * (1 - g * g);
            dg[3 * H + j] = d * t * o * (1 - o);
            dc[j] = dcc * f;
            dh[j] = 0;
        }
        memcpy(dai, dg, (size_t)G * sizeof(T));   /* dA_ih is dA_hh */
    } else if (ly->plain) {
        int relu = ly->cell == FASTLN_CELL_RNN_RELU;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T d = dy[j] + dh[j], h = hcur[j];
            dai[j] = dg[j] = relu ? (h > 0 ? d : 0) : d * (1 - h * h);
            dh[j] = 0;
        }
    } else if (ly->cell == FASTLN_CELL_LSTM) {
        /* dg: [dgates (G) | dn (H)], dn = dL/dLN(c); act: scratch for the
         * gates, recomputed from the cached xih, xhh as forward did */
        T *a = (T *)act;
        SFX(lstm_gates)(a, (T *)xi, (T *)xh, p, 0, 0, 1, 0, 0, 1, 0, 2 * H, 0, 0);
        SFX(lstm_gates)(a, (T *)xi, (T *)xh, p, 0, 0, 1, 0, 0, 1, 2 * H, 3 * H, 1, 0);
        SFX(lstm_gates)(a, (T *)xi, (T *)xh, p, 0, 0, 1, 0, 0, 1, 3 * H, G, 0, 0);
        T *dn = dg + G;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) dn[j] = FMA(xc[j], p[7][j], p[8][j]);
        SFX(tanh_n)(dn, H);                  /* tanh(LN(c)) */
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T o = act[3 * H + j], th = dn[j], d = dy[j] + dh[j];
            dg[3 * H + j] = d * th * o * (1 - o);
            dn[j] = d * o * (1 - th * th);
        }
        SFX(ln_vec_bwd)(dh, dn, p[7], xc, rs[2], H);   /* dh: scratch for dL/dc via LN */
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T i = act[j], f = act[H + j], g = act[2 * H + j], d = dc[j] + dh[j];
            dg[j] = d * g * i * (1 - i);
            dg[H + j] = d * cp[j] * f * (1 - f);
            dg[2 * H + j] = d * i * (1 - g * g);
            dc[j] = d * f;
            dh[j] = 0;
        }
        SFX(ln_vec_bwd)(dah, dg, p[5], xh, rs[1], G);
        SFX(ln_vec_bwd)(dai, dg, p[3], xi, rs[0], G);
    } else if (ly->cell == FASTLN_CELL_GRU) {
        /* dg: [d[z,r] pre-activation (2H) | dLN_in (H) | dLN_hn (H)] */
        const T *z = act, *r = act + H, *n = act + 2 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T d = dy[j] + dh[j], hn = FMA(xh[2 * H + j], p[8][j], p[9][j]);
            T dpn = d * z[j] * (1 - n[j] * n[j]);
            dg[j] = d * (n[j] - hp[j]) * z[j] * (1 - z[j]);
            dg[H + j] = dpn * hn * r[j] * (1 - r[j]);
            dg[2 * H + j] = dpn;
            dg[3 * H + j] = dpn * r[j];
            dh[j] = d * (1 - z[j]);
        }
        SFX(ln_vec_bwd)(dai, dg, p[2], xi, rs[0], 2 * H);
        SFX(ln_vec_bwd)(dai + 2 * H, dg + 2 * H, p[6], xi + 2 * H, rs[1], H);
        SFX(ln_vec_bwd)(dah, dg, p[4], xh, rs[2], 2 * H);
        SFX(ln_vec_bwd)(dah + 2 * H, dg + 3 * H, p[8], xh + 2 * H, rs[3], H);
    } else {
        int relu = ly->cell == FASTLN_CELL_RNN_RELU;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T d = dy[j] + dh[j], h = hcur[j];
            dg[j] = relu ? (h > 0 ? d : 0) : d * (1 - h * h);
            dh[j] = 0;
        }
        SFX(ln_vec_bwd)(dai, dg, p[2], xi, rs[0], H);
    }
}

/* ---- layer drivers ----------------------------------------------------- */

/* Steps per chunk: about 256 rows, so that a chunk's input projections
 * stay in L2 until its steps use them. interrupt() is polled between chunks,
 * and a chunk runs in one parallel region. */
static inline int64_t SFX(chunk_steps)(int64_t B) { return B >= 256 ? 1 : (256 + B - 1) / B; }

static int SFX(layer_init)(SFX(layer) *ly, const fastln_rnn_args *a)
{
    fastln_rnn_layout_for(&ly->L, a->cell, a->steps, a->batch, a->hidden);
    ly->cell = ly->L.cell;
    ly->plain = ly->L.plain;
    ly->B = a->batch;
    ly->H = a->hidden;
    ly->eps = a->eps;
    ly->p = (const T *const *)a->params;
    ly->len = a->lengths;
    ly->G = ly->L.G;
    ly->gw = ly->L.gw;
    return FASTLN_OK;
}

typedef struct {
    SFX(layer) ly;
    SFX(rec) rc;
    const T *w_hh;
    T *aih;                         /* A_ih of the current chunk, step c0 first */
    int64_t c0;
    T *ahh_s, *act_s, *xc_s, *rs_s; /* a step's rows (copied to the cache if any); rs_s: no cache */
    T *h, *c;                       /* the state (updated in place without a cache) */
    T *y;
} SFX(fwd_ctx);

/* Step t. mode 1: product and rows; 0: rows only; 2: product only (BLAS,
 * outside any parallel region). Rows are shared by the enclosing team. */
static void SFX(fwd_step)(SFX(fwd_ctx) *f, int64_t t, int mode)
{
    const SFX(layer) *ly = &f->ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t B = ly->B, H = ly->H, G = ly->G, R = L->nrstd;
    T *cache = ly->cache;
    const T *hp = cache ? cache + L->hseq + t * B * H : f->h;
    if (mode != 0) SFX(rec_product)(&f->rc, f->ahh_s, hp, f->w_hh, B, G, H, 0);
    if (mode == 2) return;
    T *aih = f->aih + (t - f->c0) * B * G;
    T *rs = cache ? cache + L->rstd + t * B * R : f->rs_s;
    T *hn = cache ? cache + L->hseq + (t + 1) * B * H : f->h;
    const T *cp = !f->c ? NULL : cache ? cache + L->cseq + t * B * H : f->c;
    T *cn = !f->c ? NULL : cache ? cache + L->cseq + (t + 1) * B * H : f->c;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        int on = SFX(active)(ly, t, b);
        T *ai = aih + b * G, *ah = f->ahh_s + b * G;
        T *act = f->act_s ? f->act_s + b * G : NULL, *xc = f->xc_s ? f->xc_s + b * H : NULL;
        SFX(fwd_row)(ly, on, ai, ah, act, xc, R ? rs + b * R : NULL, hp + b * H, cp ? cp + b * H : NULL,
                     hn + b * H, cn ? cn + b * H : NULL, f->y + (t * B + b) * H);
        if (cache && on) {
            /* The row was computed in scratch that stays in L1/L2; the cache
             * (about 11 H values a row) goes out with non-temporal stores, so
             * that writing it costs no read-for-ownership traffic: backward
             * reads it long after it has left the caches anyway. */
            size_t row = (size_t)G * sizeof(T);
            int64_t at = (t * B + b) * G;
            if (L->xih >= 0) stream_copy(cache + L->xih + at, ai, row);
            if (L->xhh >= 0) stream_copy(cache + L->xhh + at, ah, row);
            if (L->act >= 0) stream_copy(cache + L->act + at, act, row);
            if (L->xc >= 0) stream_copy(cache + L->xc + (t * B + b) * H, xc, (size_t)H * sizeof(T));
        }
    }
    if (cache) stream_fence();
}

/* f->aih (M, G) = x (M, I) W_ih^T on the packed kernel or, for tiny M, the
 * dot kernel (on one thread of the team). */
static void SFX(input_proj)(SFX(fwd_ctx) *f, const T *x, const T *w_ih, int64_t M, int64_t I)
{
    const int64_t G = f->ly.G;
#if HAVE_PACKED
    if (f->rc.packed_ih) {
        SFX(packed_gemm)(f->aih, G, x, I, 1, f->rc.packed_ih, FASTLN_NR, M, G, I, 0);
        return;
    }
#endif
#pragma omp single
    SFX(small_nt)(f->aih, x, w_ih, M, G, I, 0, 0, G);
}

/* The input projections of steps [c0, c1) into f->aih, then those steps:
 * one parallel region when the products can run inside it (the packed and
 * small kernels), else BLAS between regions. */
static int SFX(fwd_chunk)(SFX(fwd_ctx) *f, const T *x, const T *w_ih, int64_t I, int64_t c0,
                          int64_t c1, int nt)
{
    const int64_t B = f->ly.B, G = f->ly.G, M = (c1 - c0) * B;
    const T *xc = x + c0 * B * I;
    f->c0 = c0;
    if (SFX(rec_in_region)(&f->rc)) {
        ON_TEAM(nt,
            SFX(input_proj)(f, xc, w_ih, M, I);
            for (int64_t t = c0; t < c1; t++) SFX(fwd_step)(f, t, 1););
        return FASTLN_OK;
    }
    if (M <= 4) SFX(small_nt)(f->aih, xc, w_ih, M, G, I, 0, 0, G);
    else GEMM('N', 'T', M, G, I, 1, xc, I, w_ih, I, 0, f->aih, G);
    /* BLAS's own threads spin for a while after each call: an OpenMP team
     * between the calls would fight them for the cores (measured: 70x slower
     * on 2 cores), so the rows run on this thread. */
    for (int64_t t = c0; t < c1; t++) {
        SFX(fwd_step)(f, t, 2);
        SFX(fwd_step)(f, t, 0);
    }
    return FASTLN_OK;
}

static int SFX(rnn_forward)(const fastln_rnn_args *a, int nt)
{
    SFX(fwd_ctx) f;
    memset(&f, 0, sizeof f);
    SFX(layer_init)(&f.ly, a);
    SFX(layer) *ly = &f.ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t Ts = a->steps, B = a->batch, I = a->input, H = a->hidden, G = ly->G;
    const T *x = (const T *)a->x, *w_ih = ly->p[0];
    T *cache = ly->cache = (T *)a->cache;
    int lstm = ly->cell == FASTLN_CELL_LSTM, gated = lstm || ly->cell == FASTLN_CELL_GRU;
    f.w_hh = ly->p[1];
    f.y = (T *)a->y;
    f.h = (T *)a->h;
    f.c = lstm ? (T *)a->c : NULL;

    /* scratch for a chunk of A_ih and a step's rows (copied to the cache) */
    int64_t Tc = SFX(chunk_steps)(B);
    if (Tc > Ts) Tc = Ts;
    int64_t n_aih = Tc * B * G, n_ahh = B * G;
    int64_t n_act = gated ? B * G : 0, n_xc = lstm ? B * H : 0;
    int64_t n_rs = cache ? 0 : B * L->nrstd;
    T *scratch = (T *)malloc((size_t)(n_aih + n_ahh + n_act + n_xc + n_rs + 1) * sizeof(T));
    if (!scratch) return FASTLN_ENOMEM;
    T *aih_s = scratch;
    f.ahh_s = n_ahh ? aih_s + n_aih : NULL;
    f.act_s = n_act ? aih_s + n_aih + n_ahh : NULL;
    f.xc_s = n_xc ? aih_s + n_aih + n_ahh + n_act : NULL;
    f.rs_s = n_rs ? aih_s + n_aih + n_ahh + n_act + n_xc : NULL;
    int rc = SFX(rec_init)(&f.rc, f.w_hh, w_ih, B, G, H, I, 0, Ts * B > 4, nt);
    if (rc) {
        free(scratch);
        return rc;
    }
    if (cache) {
        memcpy(cache + L->hseq, f.h, (size_t)(B * H) * sizeof(T));
        if (lstm) memcpy(cache + L->cseq, f.c, (size_t)(B * H) * sizeof(T));
    }
    for (int64_t c0 = 0; c0 < Ts && rc == FASTLN_OK; c0 += Tc) {
        int64_t c1 = c0 + Tc < Ts ? c0 + Tc : Ts;
        f.aih = aih_s;
        rc = SFX(fwd_chunk)(&f, x, w_ih, I, c0, c1, nt);
        if (!rc && a->interrupt && c1 < Ts && a->interrupt(a->interrupt_ctx)) rc = FASTLN_EINTR;
    }
    if (cache && rc == FASTLN_OK) {   /* the final state */
        memcpy(f.h, cache + L->hseq + Ts * B * H, (size_t)(B * H) * sizeof(T));
        if (lstm) memcpy(f.c, cache + L->cseq + Ts * B * H, (size_t)(B * H) * sizeof(T));
    }
    SFX(rec_free)(&f.rc);
    free(scratch);
    return rc;
}

/* Backward: which LN-output gradients (in a dg row) pair with which
 * normalized values, and where their sums go (offsets in acc, -1: none). */
typedef struct {
    int64_t goff, n, aw, ab;
    int src;                        /* 0: xih, 1: xhh, 2: xc */
    int64_t xoff;
} SFX(seg);

typedef struct {
    SFX(layer) ly;
    SFX(rec) rc;
    const T *w_hh, *dy;
    T *dai, *dah, *dg, *dh, *dc;
    T *dai_s;   /* (B, G) scratch for a step's dA_ih rows, or NULL (RNN: dA_ih is dA_hh) */
    T *act_s;   /* (B, G) scratch for the LSTM's recomputed gates */
    double *acc;
    int nseg;
    SFX(seg) seg[4];
} SFX(bwd_ctx);

#define COLBLK 64   /* columns per block of the parameter sums */

static void SFX(bwd_step)(SFX(bwd_ctx) *k, int64_t t, int mode)
{
    const SFX(layer) *ly = &k->ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t B = ly->B, H = ly->H, G = ly->G, R = L->nrstd, gw = ly->gw;
    const T *cache = ly->cache;
    T *dah = k->dah + t * B * G;
    if (mode == 2) {
        SFX(rec_product)(&k->rc, k->dh, dah, k->w_hh, B, G, H, 1);
        return;
    }
    T *dai = k->dai + t * B * G;
    const T *xi = L->xih >= 0 ? cache + L->xih + t * B * G : NULL;
    const T *xh = L->xhh >= 0 ? cache + L->xhh + t * B * G : NULL;
    const T *act = L->act >= 0 ? cache + L->act + t * B * G : k->act_s;   /* LSTM: scratch */
    const T *xc = L->xc >= 0 ? cache + L->xc + t * B * H : NULL;
    const T *rs = cache + L->rstd + t * B * R;
    const T *hp = cache + L->hseq + t * B * H, *hc = hp + B * H;
    const T *cp = L->cseq >= 0 ? cache + L->cseq + t * B * H : NULL;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        /* dA_ih is read only by the products after the loop: its rows go out
         * with non-temporal stores (no read-for-ownership traffic); dA_hh
         * feeds this step's recurrent product and stays in cache. */
        T *di = k->dai_s ? k->dai_s + b * G : dai + b * G;
        SFX(bwd_row)(ly, SFX(active)(ly, t, b), di, dah + b * G, k->dg + b * gw,
                     k->dh + b * H, k->dc ? k->dc + b * H : NULL, k->dy + (t * B + b) * H,
                     xi ? xi + b * G : NULL, xh ? xh + b * G : NULL, act ? act + b * G : NULL,
                     xc ? xc + b * H : NULL, R ? rs + b * R : NULL, hp + b * H, hc + b * H,
                     cp ? cp + b * H : NULL);
        if (k->dai_s) stream_copy(dai + b * G, di, (size_t)G * sizeof(T));
    }
    if (k->dai_s) stream_fence();
    for (int s = 0; s < k->nseg; s++) {
        const SFX(seg) *sg = &k->seg[s];
        const T *xs = sg->aw < 0 ? NULL : sg->src == 0 ? xi : sg->src == 1 ? xh : xc;
        int64_t ldx = sg->src == 2 ? H : G, nb = (sg->n + COLBLK - 1) / COLBLK;
#pragma omp for schedule(static) nowait
        for (int64_t jb = 0; jb < nb; jb++) {
            int64_t j0 = jb * COLBLK, j1 = j0 + COLBLK < sg->n ? j0 + COLBLK : sg->n;
            for (int64_t b = 0; b < B; b++) {   /* rows in order: deterministic sums */
                if (!SFX(active)(ly, t, b)) continue;
                SFX(col_acc)(xs ? k->acc + sg->aw : NULL, sg->ab >= 0 ? k->acc + sg->ab : NULL,
                             k->dg + b * gw + sg->goff, gw, xs ? xs + b * ldx + sg->xoff : NULL,
                             ldx, 1, j0, j1);
            }
        }
    }
    if (mode == 1) SFX(rec_product)(&k->rc, k->dh, dah, k->w_hh, B, G, H, 1);
}

static void SFX(bwd_steps)(SFX(bwd_ctx) *k, int64_t t1, int64_t t0, int nt)
{   /* steps t1-1 down to t0 */
    if (SFX(rec_in_region)(&k->rc)) {
        ON_TEAM(nt, for (int64_t t = t1 - 1; t >= t0; t--) SFX(bwd_step)(k, t, 1););
        return;
    }
    for (int64_t t = t1 - 1; t >= t0; t--) {   /* on this thread: see fwd_chunk */
        SFX(bwd_step)(k, t, 0);
        SFX(bwd_step)(k, t, 2);
    }
}

static int SFX(rnn_backward)(const fastln_rnn_args *a, int nt)
{
    SFX(bwd_ctx) k;
    memset(&k, 0, sizeof k);
    SFX(layer_init)(&k.ly, a);
    SFX(layer) *ly = &k.ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t Ts = a->steps, B = a->batch, I = a->input, H = a->hidden, G = ly->G, TB = Ts * B;
    const T *x = (const T *)a->x, *const *p = ly->p;
    T **grads = (T **)a->grads;
    ly->cache = (T *)a->cache;
    int lstm = ly->cell == FASTLN_CELL_LSTM, gru = ly->cell == FASTLN_CELL_GRU;
    k.w_hh = p[1];
    k.dy = (const T *)a->dy;
    k.dh = (T *)a->dh;
    k.dc = lstm ? (T *)a->dc : NULL;

    /* parameter sums (double): see the grads assignment at the end */
    int64_t nacc;
    if (ly->plain) {     /* bias (G) */
        SFX(seg) s[1] = {{0, G, -1, 0, 0, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 1;
        nacc = G;
    } else if (lstm) {          /* sum dgates, ih w, hh w (G); c w, c b (H) */
        SFX(seg) s[3] = {{0, G, G, 0, 0, 0}, {0, G, 2 * G, -1, 1, 0},
                         {G, H, 3 * G, 3 * G + H, 2, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 3;
        nacc = 3 * G + 2 * H;
    } else if (gru) {    /* zr: b, ih w, hh w (2H); in w, in b, hn w, hn b (H) */
        SFX(seg) s[4] = {{0, 2 * H, 2 * H, 0, 0, 0}, {0, 2 * H, 4 * H, -1, 1, 0},
                         {2 * H, H, 6 * H, 7 * H, 0, 2 * H}, {3 * H, H, 8 * H, 9 * H, 1, 2 * H}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 4;
        nacc = 10 * H;
    } else {             /* w, b (H) */
        SFX(seg) s[1] = {{0, H, 0, H, 0, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 1;
        nacc = 2 * H;
    }
    int64_t n_da = (L->split ? 2 : 1) * TB * G;   /* see fastln_rnn_work_size */
    T *own = a->work ? NULL : (T *)malloc((size_t)(n_da + B * (ly->gw + 2 * G)) * sizeof(T));
    T *buf = a->work ? (T *)a->work : own;
    k.acc = (double *)calloc((size_t)nacc, sizeof(double));
    int rc = buf && k.acc ? SFX(rec_init)(&k.rc, k.w_hh, p[0], B, G, H, I, 1, 0, nt) : FASTLN_ENOMEM;
    if (rc) {
        free(own);
        free(k.acc);
        return rc;
    }
    k.dai = buf;
    k.dah = L->split ? buf + TB * G : buf;
    k.dg = buf + n_da;
    k.dai_s = L->split ? k.dg + B * ly->gw : NULL;
    k.act_s = lstm ? k.dg + B * (ly->gw + G) : NULL;

    int64_t Tc = SFX(chunk_steps)(B);
    for (int64_t t1 = Ts; t1 > 0; t1 -= Tc) {
        int64_t t0 = t1 - Tc > 0 ? t1 - Tc : 0;
        SFX(bwd_steps)(&k, t1, t0, nt);
        if (a->interrupt && t0 > 0 && a->interrupt(a->interrupt_ctx)) {
            rc = FASTLN_EINTR;
            break;
        }
    }
    if (rc == FASTLN_OK) {
        const T *hseq = ly->cache + L->hseq;   /* h_{t-1} for t = 0..T-1 */
        rc = SFX(gemm_layer)('T', 'N', G, I, TB, k.dai, x, grads[0], nt);          /* dW_ih */
        if (!rc) rc = SFX(gemm_layer)('T', 'N', G, H, TB, k.dah, hseq, grads[1], nt);  /* dW_hh */
        if (!rc && a->dx) rc = SFX(gemm_layer)('N', 'N', TB, I, G, k.dai, p[0], (T *)a->dx, nt);
    }
    if (rc == FASTLN_OK) {
        /* grads[idx] <- n sums from acc[off] (LSTM, GRU: the biases share one sum) */
        const double *acc = k.acc;
#define GRAD(idx, off, n)                                                         \
    for (int64_t j = 0; j < (n); j++) grads[idx][j] = (T)acc[(off) + j];
        if (ly->plain) {
            GRAD(2, 0, G)
        } else if (lstm) {
            GRAD(2, 0, G) GRAD(3, G, G) GRAD(4, 0, G) GRAD(5, 2 * G, G) GRAD(6, 0, G)
            GRAD(7, 3 * G, H) GRAD(8, 3 * G + H, H)
        } else if (gru) {
            GRAD(2, 2 * H, 2 * H) GRAD(3, 0, 2 * H) GRAD(4, 4 * H, 2 * H) GRAD(5, 0, 2 * H)
            GRAD(6, 6 * H, H) GRAD(7, 7 * H, H) GRAD(8, 8 * H, H) GRAD(9, 9 * H, H)
        } else {
            GRAD(2, 0, H) GRAD(3, H, H)
        }
#undef GRAD
    }
    SFX(rec_free)(&k.rc);
    free(own);
    free(k.acc);
    return rc;
}

#undef HAVE_PACKED
#undef HAVE_GEMV16
#undef COLBLK
