/*
 * The cells of the LN-RNN engine, one row at a time, written once per
 * (element type, ISA) (isa/type_begin.h): the activations, LayerNorm over one
 * vector (the statistics of norm/stats.h), and the fused forward and
 * backward row kernels of each cell (fwd_row, bwd_row), which forward_step.h
 * and backward.h run over the rows and steps of a layer.
 */
#include "rnn/rnn.h"

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

/* The sums of ln_vec and ln_prep in one order whatever the vector width,
 * for layers whose results agree bitwise across the x86 paths (int8
 * weights): sum over i of d_i or d_i^2, d_i = (a[i] - shift) - dm, in 16
 * lanes (lane l adds elements l, l + 16, ... in turn; squares by FMA), then
 * a fixed tree in double. */
static inline double SFX(sum_fixed)(const T *a, int64_t n, T shift, T dm, int sq)
{
    T acc[16] = {0};
    double s[8];
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
#pragma omp simd
        for (int l = 0; l < 16; l++) {
            T d = (a[i + l] - shift) - dm;
            acc[l] = sq ? FMA(d, d, acc[l]) : acc[l] + d;
        }
    for (int l = 0; i + l < n; l++) {
        T d = (a[i + l] - shift) - dm;
        acc[l] = sq ? FMA(d, d, acc[l]) : acc[l] + d;
    }
    for (int l = 0; l < 8; l++) s[l] = (double)acc[l] + (double)acc[l + 8];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* The shifted two-pass statistics of layer_norm (norm/stats.h), or with
 * fixed those of sum_fixed: *s1 = the sum of a - shift, *var. */
static inline void SFX(ln_sums)(double *s1, T *dm, double *var, const T *a, int64_t n, T shift,
                                int fixed)
{
    *s1 = fixed ? SFX(sum_fixed)(a, n, shift, 0, 0) : SFX(sum_shifted)(a, n, shift);
    *dm = (T)(*s1 / (double)n);
    *var = (fixed ? SFX(sum_fixed)(a, n, shift, *dm, 1) : SFX(sumsq_centered)(a, n, shift, *dm)) /
           (double)n;
}

/* xhat = (a - mean(a)) * rstd, in place allowed; *rstd = 1/sqrt(var + eps)
 * (the statistics of ln_sums). */
static inline void SFX(ln_vec)(T *xhat, T *rstd, const T *a, int64_t n, double eps, int fixed)
{
    T shift = a[0], dm;
    double s1, var;
    SFX(ln_sums)(&s1, &dm, &var, a, n, shift, fixed);
    SFX(ln_finish_row)(xhat, NULL, rstd, a, NULL, NULL, n, eps, shift, s1, dm, var);
}

/* The statistics of ln_vec without its sweep: xhat = ((a - *sh) - *dm) * *r.
 * A row whose float statistics are suspect is normalized in place in double
 * (ln_finish_row's fallback), and then *sh = *dm = 0, *r = 1. */
static inline void SFX(ln_prep)(T *a, T *sh, T *dm, T *r, T *rstd, int64_t n, double eps,
                                int fixed)
{
    *sh = a[0];
    double s1, var;
    SFX(ln_sums)(&s1, dm, &var, a, n, *sh, fixed);
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

/* LSTM gates over columns [j0, j1) from one sum a = A_ih + A_hh (the
 * FASTLN_CELL_LN_SUM and _LN_GATE variants): act = f(LN(a) + bias), with
 * the statistics of the LN that covers these columns; keep stores the
 * normalized a back for the cache. */
static inline __attribute__((always_inline)) void SFX(lstm_gates_sum)(
    T *act, T *a, const T *const *p, T s, T d, T r, int64_t j0, int64_t j1, int tanh_gate,
    int keep)
{
#pragma omp simd
    for (int64_t j = j0; j < j1; j++) {
        T xa = ((a[j] - s) - d) * r;
        if (keep) a[j] = xa;
        T v = FMA(xa, p[3][j], p[4][j]) + p[2][j];
        act[j] = tanh_gate ? SFX(tanh1)(v) : SFX(sigmoid1)(v);
    }
}

/* All four gate blocks of lstm_gates_sum (i, f: sigmoid; g: tanh; o:
 * sigmoid), block k with the statistics st[k] (s, d, r) under LN_GATE, else
 * st[0] (one LN over the sum). Each call has a constant activation, so that
 * its loop computes only that one. */
static inline __attribute__((always_inline)) void SFX(lstm_gates_blocks)(
    T *act, T *a, const T *const *p, const T (*st)[3], int per_gate, int64_t H, int keep)
{
    const T *q0 = st[0], *q1 = st[per_gate], *q2 = st[2 * per_gate], *q3 = st[3 * per_gate];
    if (per_gate) {
        SFX(lstm_gates_sum)(act, a, p, q0[0], q0[1], q0[2], 0, H, 0, keep);
        SFX(lstm_gates_sum)(act, a, p, q1[0], q1[1], q1[2], H, 2 * H, 0, keep);
    } else {
        SFX(lstm_gates_sum)(act, a, p, q0[0], q0[1], q0[2], 0, 2 * H, 0, keep);
    }
    SFX(lstm_gates_sum)(act, a, p, q2[0], q2[1], q2[2], 2 * H, 3 * H, 1, keep);
    SFX(lstm_gates_sum)(act, a, p, q3[0], q3[1], q3[2], 3 * H, 4 * H, 0, keep);
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

/* ---- fused row kernels ------------------------------------------------- */

/* One layer's sizes and parameters, and where step t's rows live. */
typedef struct {
    int cell, plain;       /* plain: no LayerNorm (FASTLN_CELL_PLAIN) */
    int reverse;           /* fastln_rnn_args.reverse */
    int64_t steps, B, H, G, gw;   /* gw: width of a dg row (backward scratch) */
    int64_t proj, P;       /* a projected LSTM's P (else 0), and the width of h and y:
                              P, or H */
    int64_t ldy;           /* row stride of y and dy */
    double eps;
    const T *const *p;     /* parameters, fastln_rnn.h order */
    int fixed;             /* LN sums in one order on every path (sum_fixed): int8 weights */
    const int64_t *len;
    fastln_rnn_layout L;
    T *cache;              /* NULL: inference */
} SFX(layer);

static inline int SFX(active)(const SFX(layer) *ly, int64_t t, int64_t b)
{
    return !ly->len || t < ly->len[b];
}

/* The time that step s of row b reads and writes: s, or in a reverse layer
 * the sequence's times backwards while it is active, then s (fastln_rnn.h). */
static inline int64_t SFX(time_of)(const SFX(layer) *ly, int64_t s, int64_t b)
{
    if (!ly->reverse) return s;
    int64_t n = ly->len ? ly->len[b] : ly->steps;
    return s < n ? n - 1 - s : s;
}

/* The plain LSTM's forward of one active row: ai <- the pre-activations
 * ai + ah + bias (the cache), act the gates, cn <- c' = f cp + i g and
 * hn <- o tanh(c') (the h of the cell, or the input of a projection). */
static inline void SFX(plain_lstm_row)(const SFX(layer) *ly, T *ai, const T *ah, T *act,
                                       const T *cp, T *hn, T *cn)
{
    const int64_t H = ly->H, G = ly->G;
    const T *bias = ly->p[2];
#pragma omp simd
    for (int64_t j = 0; j < G; j++) ai[j] = (ai[j] + ah[j]) + bias[j];
    SFX(plain_gates)(act, ai, H);
#pragma omp simd
    for (int64_t j = 0; j < H; j++) hn[j] = cn[j] = FMA(act[H + j], cp[j], act[j] * act[2 * H + j]);
    SFX(tanh_n)(hn, H);
#pragma omp simd
    for (int64_t j = 0; j < H; j++) hn[j] *= act[3 * H + j];
}

/* The LN LSTM's forward of one active row (fwd_row's arguments). Its gate
 * LNs (ly->L.norm):
 *   pair: p 0 W_ih, 1 W_hh, 2 bias, 3-4 ln_ih, 5-6 ln_hh, 7-8 ln_c;
 *         ai, ah normalized in place
 *   sum, per gate: p 0 W_ih, 1 W_hh, 2 bias, 3-4 ln, 5-6 ln_c; ai <- the
 *         normalized sum ai + ah
 * then c' = f c + i g, xc = LN(c') normalized, and h' = o tanh(xc w + b),
 * carrying c' or, with carry_ln, xc w + b. rs: the gate LNs' rstds, then c's. */
static inline void SFX(lnlstm_fwd)(const SFX(layer) *ly, T *ai, T *ah, T *act, T *xc, T *rs,
                                   const T *cp, T *hn, T *cn)
{
    const int64_t H = ly->H, G = ly->G;
    const T *const *p = ly->p;
    const fastln_rnn_layout *L = &ly->L;
    if (L->norm == FASTLN_NORM_PAIR) {
        T si, di, ri, sh, dh, rh;
        SFX(ln_prep)(ai, &si, &di, &ri, &rs[0], G, ly->eps, ly->fixed);
        SFX(ln_prep)(ah, &sh, &dh, &rh, &rs[1], G, ly->eps, ly->fixed);
        if (ly->cache) {   /* i, f: sigmoid; g: tanh; o: sigmoid */
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 0, 2 * H, 0, 1);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 2 * H, 3 * H, 1, 1);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 3 * H, G, 0, 1);
        } else {
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 0, 2 * H, 0, 0);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 2 * H, 3 * H, 1, 0);
            SFX(lstm_gates)(act, ai, ah, p, si, di, ri, sh, dh, rh, 3 * H, G, 0, 0);
        }
    } else {
        int per_gate = L->norm == FASTLN_NORM_GATE;
        int64_t n = per_gate ? H : G;
        T st[4][3];
#pragma omp simd
        for (int64_t j = 0; j < G; j++) ai[j] += ah[j];
        for (int k = 0; k < (per_gate ? 4 : 1); k++)
            SFX(ln_prep)(ai + k * n, &st[k][0], &st[k][1], &st[k][2], &rs[k], n, ly->eps,
                         ly->fixed);
        if (ly->cache) SFX(lstm_gates_blocks)(act, ai, p, (const T (*)[3])st, per_gate, H, 1);
        else SFX(lstm_gates_blocks)(act, ai, p, (const T (*)[3])st, per_gate, H, 0);
    }
    const T *wc = p[L->norm == FASTLN_NORM_PAIR ? 7 : 5], *bc = p[L->norm == FASTLN_NORM_PAIR ? 8 : 6];
#pragma omp simd
    for (int64_t j = 0; j < H; j++) cn[j] = FMA(act[H + j], cp[j], act[j] * act[2 * H + j]);
    SFX(ln_vec)(xc, &rs[L->nrstd - 1], cn, H, ly->eps, ly->fixed);
#pragma omp simd
    for (int64_t j = 0; j < H; j++) hn[j] = FMA(xc[j], wc[j], bc[j]);
    if (L->carry_ln) memcpy(cn, hn, (size_t)H * sizeof(T));
    SFX(tanh_n)(hn, H);
#pragma omp simd
    for (int64_t j = 0; j < H; j++) hn[j] *= act[3 * H + j];
}

/* The LN LSTM's backward of one active row (bwd_row's arguments; for the
 * sum and per-gate norms dai is dah). dg: [dgates (G) | dn (H)], dn =
 * dL/d(xc w + b); act: scratch for the gates, recomputed from the cached
 * normalized values as forward computed them. */
static inline void SFX(lnlstm_bwd)(const SFX(layer) *ly, T *dai, T *dah, T *dg, T *dh, T *dc,
                                   const T *dy, const T *xi, const T *xh, const T *act,
                                   const T *xc, const T *rs, const T *cp)
{
    const int64_t H = ly->H, G = ly->G;
    const T *const *p = ly->p;
    const fastln_rnn_layout *L = &ly->L;
    int pair = L->norm == FASTLN_NORM_PAIR;
    T *a = (T *)act;
    if (pair) {
        SFX(lstm_gates)(a, (T *)xi, (T *)xh, p, 0, 0, 1, 0, 0, 1, 0, 2 * H, 0, 0);
        SFX(lstm_gates)(a, (T *)xi, (T *)xh, p, 0, 0, 1, 0, 0, 1, 2 * H, 3 * H, 1, 0);
        SFX(lstm_gates)(a, (T *)xi, (T *)xh, p, 0, 0, 1, 0, 0, 1, 3 * H, G, 0, 0);
    } else {
        const T unit[1][3] = {{0, 0, 1}};
        SFX(lstm_gates_blocks)(a, (T *)xi, p, unit, 0, H, 0);
    }
    const T *wc = p[pair ? 7 : 5], *bc = p[pair ? 8 : 6];
    T *dn = dg + G;
#pragma omp simd
    for (int64_t j = 0; j < H; j++) dn[j] = FMA(xc[j], wc[j], bc[j]);
    SFX(tanh_n)(dn, H);                  /* tanh(LN(c')) */
    /* a carried LN(c') takes dc there; a carried c' takes it after the LN */
    const int carry_ln = L->carry_ln;
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
        T o = act[3 * H + j], th = dn[j], d = dy[j] + dh[j];
        dg[3 * H + j] = d * th * o * (1 - o);
        dn[j] = carry_ln ? FMA(d * o, 1 - th * th, dc[j]) : d * o * (1 - th * th);
    }
    SFX(ln_vec_bwd)(dh, dn, wc, xc, rs[L->nrstd - 1], H);   /* dh: scratch for dL/dc' */
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
        T i = act[j], f = act[H + j], g = act[2 * H + j];
        T d = carry_ln ? dh[j] : dc[j] + dh[j];
        dg[j] = d * g * i * (1 - i);
        dg[H + j] = d * cp[j] * f * (1 - f);
        dg[2 * H + j] = d * i * (1 - g * g);
        dc[j] = d * f;
        dh[j] = 0;
    }
    if (pair) {
        SFX(ln_vec_bwd)(dah, dg, p[5], xh, rs[1], G);
        SFX(ln_vec_bwd)(dai, dg, p[3], xi, rs[0], G);
    } else if (L->norm == FASTLN_NORM_SUM) {
        SFX(ln_vec_bwd)(dai, dg, p[3], xi, rs[0], G);
    } else {
        for (int k = 0; k < 4; k++)
            SFX(ln_vec_bwd)(dai + k * H, dg + k * H, p[3] + k * H, xi + k * H, rs[k], H);
    }
}

/* Forward, one row: ai, ah = A_ih, A_hh (G), normalized in place; act (G)
 * activations; xc (H) normalized c (plain GRU: h W_hn^T + bias_hn); rs rstds; hp, cp -> hn, cn the state
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
    if (ly->plain && ly->cell == FASTLN_CELL_GRU) {
        /* p: 0 W_ih, 1 W_hh, 2 bias (3H), 3 bias_hn; act <- r, z, n and
         * xc <- h W_hn^T + bias_hn (the cache) */
#pragma omp simd
        for (int64_t j = 0; j < 2 * H; j++) act[j] = (ai[j] + ah[j]) + p[2][j];
        SFX(sigmoid_n)(act, 2 * H);
        T *n = act + 2 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            xc[j] = ah[2 * H + j] + p[3][j];
            n[j] = FMA(act[j], xc[j], ai[2 * H + j] + p[2][2 * H + j]);
        }
        SFX(tanh_n)(n, H);
#pragma omp simd
        for (int64_t j = 0; j < H; j++) hn[j] = FMA(act[H + j], hp[j] - n[j], n[j]);
    } else if (ly->plain) {
        /* p: 0 W_ih, 1 W_hh, 2 bias; ai <- the pre-activations (the cache) */
        if (ly->cell == FASTLN_CELL_LSTM) {
            SFX(plain_lstm_row)(ly, ai, ah, act, cp, hn, cn);
            memcpy(y, hn, (size_t)H * sizeof(T));
            return;
        }
#pragma omp simd
        for (int64_t j = 0; j < G; j++) ai[j] = (ai[j] + ah[j]) + p[2][j];
        if (ly->cell == FASTLN_CELL_RNN_TANH) {
            memcpy(hn, ai, (size_t)H * sizeof(T));
            SFX(tanh_n)(hn, H);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < H; j++) hn[j] = ai[j] > 0 ? ai[j] : 0;
        }
    } else if (ly->cell == FASTLN_CELL_LSTM) {
        SFX(lnlstm_fwd)(ly, ai, ah, act, xc, rs, cp, hn, cn);
    } else if (ly->cell == FASTLN_CELL_GRU) {
        /* p: 0 W_ih, 1 W_hh, 2-3 ln_ih, 4-5 ln_hh (2H), 6-7 ln_in, 8-9 ln_hn (H) */
        SFX(ln_vec)(ai, &rs[0], ai, 2 * H, ly->eps, ly->fixed);
        SFX(ln_vec)(ai + 2 * H, &rs[1], ai + 2 * H, H, ly->eps, ly->fixed);
        SFX(ln_vec)(ah, &rs[2], ah, 2 * H, ly->eps, ly->fixed);
        SFX(ln_vec)(ah + 2 * H, &rs[3], ah + 2 * H, H, ly->eps, ly->fixed);
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
        SFX(ln_vec)(ai, &rs[0], ai, H, ly->eps, ly->fixed);
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

/* The plain GRU with FASTLN_CELL_RESET_FIRST takes its rows in two halves
 * around the product (r h) W_hn^T. Forward: act[0, 2H) <- r, z and rh <- r h;
 * then, given ahn = (r h) W_hn^T, act[2H, 3H) <- n and hn, y <- h'. */
static inline void SFX(gru_rf_gates)(const SFX(layer) *ly, const T *ai, const T *ah, T *act,
                                     T *rh, const T *hp)
{
    const int64_t H = ly->H;
    const T *bias = ly->p[2];
#pragma omp simd
    for (int64_t j = 0; j < 2 * H; j++) act[j] = (ai[j] + ah[j]) + bias[j];
    SFX(sigmoid_n)(act, 2 * H);
#pragma omp simd
    for (int64_t j = 0; j < H; j++) rh[j] = act[j] * hp[j];
}

static inline void SFX(gru_rf_out)(const SFX(layer) *ly, const T *ai, const T *ahn, T *act,
                                   const T *hp, T *hn, T *y)
{
    const int64_t H = ly->H;
    const T *bias = ly->p[2], *bias_hn = ly->p[3];
    T *n = act + 2 * H;
#pragma omp simd
    for (int64_t j = 0; j < H; j++) n[j] = (ai[2 * H + j] + bias[2 * H + j]) + (ahn[j] + bias_hn[j]);
    SFX(tanh_n)(n, H);
#pragma omp simd
    for (int64_t j = 0; j < H; j++) hn[j] = FMA(act[H + j], hp[j] - n[j], n[j]);
    memcpy(y, hn, (size_t)H * sizeof(T));
}

/* Backward, first half: from d = dy + dh, the z and n blocks of dai (G), of
 * dahrz (2H: the [r, z] blocks of dA_hh) and dahn (H: the gradient of
 * (r h) W_hn^T), and of dg; dh <- d z. Second half, given drh = dahn W_hn
 * (the gradient of r h): the r blocks; dh += drh r. */
static inline void SFX(gru_rf_bwd1)(const SFX(layer) *ly, T *dai, T *dahrz, T *dahn, T *dg,
                                    T *dh, const T *dy, const T *act, const T *hp)
{
    const int64_t H = ly->H;
    const T *z = act + H, *n = act + 2 * H;
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
        T d = dy[j] + dh[j];
        T dn = d * (1 - z[j]) * (1 - n[j] * n[j]);
        T dz = d * (hp[j] - n[j]) * z[j] * (1 - z[j]);
        dai[2 * H + j] = dahn[j] = dg[2 * H + j] = dg[3 * H + j] = dn;
        dai[H + j] = dahrz[H + j] = dg[H + j] = dz;
        dh[j] = d * z[j];
    }
}

static inline void SFX(gru_rf_bwd2)(const SFX(layer) *ly, T *dai, T *dahrz, T *dg, T *dh,
                                    const T *drh, const T *act, const T *hp)
{
    const int64_t H = ly->H;
    const T *r = act;
#pragma omp simd
    for (int64_t j = 0; j < H; j++) {
        T dr = drh[j] * hp[j] * r[j] * (1 - r[j]);
        dai[j] = dahrz[j] = dg[j] = dr;
        dh[j] = FMA(drh[j], r[j], dh[j]);
    }
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
    if (ly->plain && ly->cell == FASTLN_CELL_GRU) {
        /* act: the cached r, z, n; xc: the cached h W_hn^T + bias_hn;
         * dg: [dA_ih (G) | the n block of dA_hh (H)] for the bias sums */
        const T *r = act, *z = act + H, *n = act + 2 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            T d = dy[j] + dh[j];
            T dn = d * (1 - z[j]) * (1 - n[j] * n[j]);
            T dr = dn * xc[j] * r[j] * (1 - r[j]);
            T dz = d * (hp[j] - n[j]) * z[j] * (1 - z[j]);
            dg[j] = dai[j] = dah[j] = dr;
            dg[H + j] = dai[H + j] = dah[H + j] = dz;
            dg[2 * H + j] = dai[2 * H + j] = dn;
            dg[3 * H + j] = dah[2 * H + j] = dn * r[j];
            dh[j] = d * z[j];
        }
    } else if (ly->plain && ly->cell == FASTLN_CELL_LSTM) {
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
        SFX(lnlstm_bwd)(ly, dai, dah, dg, dh, dc, dy, xi, xh, act, xc, rs, cp);
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

