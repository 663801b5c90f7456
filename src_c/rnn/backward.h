/*
 * The backward (BPTT) of one layer, written once per (element type, ISA)
 * (isa/type_begin.h), from the cache of one forward: chunks of steps from
 * the last, each step's rows (cells.h: bwd_row) and the recurrent product
 * that carries dA_hh to h_{t-1}, with a column-parallel reduction of the LN
 * parameter gradients in double, rows in order, so that they do not depend
 * on the thread count; then the products for dW_ih, dW_hh and dx.
 */
#include "rnn/rnn.h"

/* Backward: which LN-output gradients (in a dg row) pair with which
 * normalized values, and where their sums go (offsets in acc, -1: none). */
typedef struct {
    int64_t goff, n, aw, ab;
    fastln_seg_src src;
    int64_t xoff;
} SFX(seg);

typedef struct {
    SFX(layer) ly;
    SFX(rec) rc;
    const T *w_hh, *dy;
    int wt;     /* the weight matrices are W^T, row-major (F-ordered W): see api/rnn.c */
    T *dai, *dah, *dg, *dh, *dc;
    T *dai_s;   /* (B, G) scratch for a step's dA_ih rows, or NULL (RNN: dA_ih is dA_hh) */
    T *act_s;   /* (B, G) scratch for the LSTM's recomputed gates */
    T *drh;     /* (B, H) scratch for RESET_FIRST's gradient of r h */
    double *acc;
    int nseg;
    SFX(seg) seg[4];
} SFX(bwd_ctx);

#define COLBLK 64   /* columns per block of the parameter sums */

/* Step t's LN-parameter and bias sums, from the rows of dg and the cached
 * normalized values xi, xh, xc (those the segments name): column blocks
 * shared by the enclosing team, rows in order, so that they do not depend
 * on the thread count. */
static void SFX(bwd_sums)(SFX(bwd_ctx) *k, int64_t t, const T *xi, const T *xh, const T *xc)
{
    const SFX(layer) *ly = &k->ly;
    const int64_t B = ly->B, H = ly->H, G = ly->G, gw = ly->gw;
    for (int s = 0; s < k->nseg; s++) {
        const SFX(seg) *sg = &k->seg[s];
        const T *xs = sg->aw < 0 ? NULL
                      : sg->src == FASTLN_SEG_XIH ? xi : sg->src == FASTLN_SEG_XHH ? xh : xc;
        int64_t ldx = sg->src == FASTLN_SEG_XC ? H : G, nb = (sg->n + COLBLK - 1) / COLBLK;
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
}

/* Step t of the backward: its rows, shared by the enclosing team, the
 * parameter sums, then the product that carries dA_hh to h_{t-1}. */
static void SFX(bwd_step)(SFX(bwd_ctx) *k, int64_t t)
{
    const SFX(layer) *ly = &k->ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t B = ly->B, H = ly->H, G = ly->G, R = L->nrstd, gw = ly->gw;
    const T *cache = ly->cache;
    T *dah = k->dah + t * B * G;
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
                     k->dh + b * H, k->dc ? k->dc + b * H : NULL,
                     k->dy + (SFX(time_of)(ly, t, b) * B + b) * ly->ldy,
                     xi ? xi + b * G : NULL, xh ? xh + b * G : NULL, act ? act + b * G : NULL,
                     xc ? xc + b * H : NULL, R ? rs + b * R : NULL, hp + b * H, hc + b * H,
                     cp ? cp + b * H : NULL);
        if (k->dai_s) stream_copy(dai + b * G, di, (size_t)G * sizeof(T));
    }
    if (k->dai_s) stream_fence();
    SFX(bwd_sums)(k, t, xi, xh, xc);
    SFX(rec_product)(&k->rc, k->dh, dah, k->w_hh, B, G, H, 1);
}

/* Step t of a plain GRU with RESET_FIRST, backward: the first half of the
 * rows, the product drh = dA_hn W_hn, the second half, the parameter sums,
 * and the product with the [r, z] blocks into dh. dA_hh is kept as dahrz
 * (T, B, 2H) followed by dahn (T, B, H), for the two parts of dW_hh. */
static void SFX(bwd_step_rf)(SFX(bwd_ctx) *k, int64_t t)
{
    const SFX(layer) *ly = &k->ly;
    const int64_t B = ly->B, H = ly->H, G = ly->G, gw = ly->gw, TB = ly->steps * B;
    const T *act = ly->cache + ly->L.act + t * B * G, *hp = ly->cache + ly->L.hseq + t * B * H;
    T *dai = k->dai + t * B * G, *dahrz = k->dah + t * B * 2 * H;
    T *dahn = k->dah + TB * 2 * H + t * B * H;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        if (!SFX(active)(ly, t, b)) {   /* the state was held: gradients pass through */
            memset(dai + b * G, 0, (size_t)G * sizeof(T));
            memset(dahrz + b * 2 * H, 0, (size_t)(2 * H) * sizeof(T));
            memset(dahn + b * H, 0, (size_t)H * sizeof(T));
            continue;
        }
        SFX(gru_rf_bwd1)(ly, dai + b * G, dahrz + b * 2 * H, dahn + b * H, k->dg + b * gw,
                         k->dh + b * H, k->dy + (SFX(time_of)(ly, t, b) * B + b) * ly->ldy,
                         act + b * G, hp + b * H);
    }
    SFX(rec_part)(&k->rc, k->rc.packed_n, k->drh, H, dahn, H, k->w_hh + 2 * H * H, B, H, H, 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++)
        if (SFX(active)(ly, t, b))
            SFX(gru_rf_bwd2)(ly, dai + b * G, dahrz + b * 2 * H, k->dg + b * gw, k->dh + b * H,
                             k->drh + b * H, act + b * G, hp + b * H);
    SFX(bwd_sums)(k, t, NULL, NULL, NULL);
    SFX(rec_part)(&k->rc, k->rc.packed, k->dh, H, dahrz, 2 * H, k->w_hh, B, H, 2 * H, 1);
}

static void SFX(bwd_steps)(SFX(bwd_ctx) *k, int64_t t1, int64_t t0, int nt)
{   /* steps t1-1 down to t0 */
    if (k->ly.L.reset_first)
        ON_TEAM(nt, for (int64_t t = t1 - 1; t >= t0; t--) SFX(bwd_step_rf)(k, t););
    else
        ON_TEAM(nt, for (int64_t t = t1 - 1; t >= t0; t--) SFX(bwd_step)(k, t););
}

/* The products that end a backward: dW_ih = dA_ih^T x, dW_hh = dA_hh^T h_{t-1}
 * and dx = dA_ih W_ih (dx NULL: none), over every step at once. With lengths,
 * x is gathered with its padding as 0 (dA_ih is 0 there, and 0 times a
 * non-finite padding value would not be); a reverse layer's steps run its
 * times backwards, so the gather puts x in step order, and that buffer then
 * takes dx in step order to scatter it back. */
static int SFX(bwd_products)(SFX(bwd_ctx) *k, const T *x, T *dx, T **grads, int64_t I, int nt)
{
    const SFX(layer) *ly = &k->ly;
    const int64_t TB = ly->steps * ly->B, G = ly->G, H = ly->H;
    const T *hseq = ly->cache + ly->L.hseq;   /* h_{t-1} for t = 0..T-1 */
    T *xs = NULL;
    if (ly->reverse || ly->len) {
        xs = (T *)malloc((size_t)(TB * I) * sizeof(T));
        if (!xs) return FASTLN_ENOMEM;
        ON_TEAM(nt, SFX(gather_steps)(ly, xs, (T *)x, 0, ly->steps, I, 0););
    }
    int rc = SFX(gemm_big)('T', 'N', G, I, TB, k->dai, xs ? xs : x, grads[0], nt);
    if (!rc && ly->L.reset_first) {   /* [r, z] from h_{t-1}, n from r h_{t-1} */
        rc = SFX(gemm_big)('T', 'N', 2 * H, H, TB, k->dah, hseq, grads[1], nt);
        if (!rc) rc = SFX(gemm_big)('T', 'N', H, H, TB, k->dah + TB * 2 * H,
                                      ly->cache + ly->L.xc, grads[1] + 2 * H * H, nt);
    } else if (!rc) {
        rc = SFX(gemm_big)('T', 'N', G, H, TB, k->dah, hseq, grads[1], nt);
    }
    T *dxs = ly->reverse ? xs : dx;
    if (!rc && dx)   /* W_ih (G, I), or W_ih^T (I, G) */
        rc = SFX(gemm_big)('N', k->wt ? 'T' : 'N', TB, I, G, k->dai, ly->p[0], dxs, nt);
    if (!rc && dx && ly->reverse) ON_TEAM(nt, SFX(gather_steps)(ly, xs, dx, 0, ly->steps, I, 1););
    free(xs);
    return rc;
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
    k.wt = a->transposed != 0;
    k.dy = (const T *)a->dy;
    k.dh = (T *)a->dh;
    k.dc = lstm ? (T *)a->dc : NULL;

    /* parameter sums (double): see the grads assignment at the end */
    int64_t nacc;
    if (ly->plain && gru) {   /* bias (G), bias_hn (H) */
        SFX(seg) s[2] = {{0, G, -1, 0, FASTLN_SEG_XIH, 0}, {G, H, -1, G, FASTLN_SEG_XIH, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 2;
        nacc = G + H;
    } else if (ly->plain) {     /* bias (G) */
        SFX(seg) s[1] = {{0, G, -1, 0, FASTLN_SEG_XIH, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 1;
        nacc = G;
    } else if (lstm && L->norm != FASTLN_NORM_PAIR) {   /* sum dgates, ln w (G); c w, c b (H) */
        SFX(seg) s[2] = {{0, G, G, 0, FASTLN_SEG_XIH, 0}, {G, H, 2 * G, 2 * G + H, FASTLN_SEG_XC, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 2;
        nacc = 2 * G + 2 * H;
    } else if (lstm) {          /* sum dgates, ih w, hh w (G); c w, c b (H) */
        SFX(seg) s[3] = {{0, G, G, 0, FASTLN_SEG_XIH, 0}, {0, G, 2 * G, -1, FASTLN_SEG_XHH, 0},
                         {G, H, 3 * G, 3 * G + H, FASTLN_SEG_XC, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 3;
        nacc = 3 * G + 2 * H;
    } else if (gru) {    /* zr: b, ih w, hh w (2H); in w, in b, hn w, hn b (H) */
        SFX(seg) s[4] = {{0, 2 * H, 2 * H, 0, FASTLN_SEG_XIH, 0}, {0, 2 * H, 4 * H, -1, FASTLN_SEG_XHH, 0},
                         {2 * H, H, 6 * H, 7 * H, FASTLN_SEG_XIH, 2 * H},
                         {3 * H, H, 8 * H, 9 * H, FASTLN_SEG_XHH, 2 * H}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 4;
        nacc = 10 * H;
    } else {             /* w, b (H) */
        SFX(seg) s[1] = {{0, H, 0, H, FASTLN_SEG_XIH, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 1;
        nacc = 2 * H;
    }
    int64_t n_da = (L->split ? 2 : 1) * TB * G;   /* see fastln_rnn_work_size */
    T *own = a->work ? NULL : (T *)malloc((size_t)(n_da + B * (ly->gw + 2 * G)) * sizeof(T));
    T *buf = a->work ? (T *)a->work : own;
    k.acc = (double *)calloc((size_t)nacc, sizeof(double));
    int rc = buf && k.acc ? SFX(rec_init_bwd)(&k.rc, k.w_hh, k.wt, B, G, H, L->reset_first, nt)
                          : FASTLN_ENOMEM;
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
    k.drh = L->reset_first ? k.dg + B * (ly->gw + G) : NULL;

    int64_t Tc = SFX(chunk_steps)(B);
    for (int64_t t1 = Ts; t1 > 0; t1 -= Tc) {
        int64_t t0 = t1 - Tc > 0 ? t1 - Tc : 0;
        SFX(bwd_steps)(&k, t1, t0, nt);
        if (a->interrupt && t0 > 0 && a->interrupt(a->interrupt_ctx)) {
            rc = FASTLN_EINTR;
            break;
        }
    }
    if (rc == FASTLN_OK) rc = SFX(bwd_products)(&k, x, (T *)a->dx, grads, I, nt);
    if (rc == FASTLN_OK) {
        /* grads[idx] <- n sums from acc[off] (LSTM, GRU: the biases share one sum) */
        const double *acc = k.acc;
#define GRAD(idx, off, n)                                                         \
    for (int64_t j = 0; j < (n); j++) grads[idx][j] = (T)acc[(off) + j];
        if (ly->plain && gru) {
            GRAD(2, 0, G) GRAD(3, G, H)
        } else if (ly->plain) {
            GRAD(2, 0, G)
        } else if (lstm && L->norm != FASTLN_NORM_PAIR) {
            GRAD(2, 0, G) GRAD(3, G, G) GRAD(4, 0, G) GRAD(5, 2 * G, H) GRAD(6, 2 * G + H, H)
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

#undef COLBLK
