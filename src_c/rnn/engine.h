/*
 * The LN-RNN engine: the time loop and the layer drivers, written once per
 * (element type, ISA) (isa/type_begin.h: IS_F32, NRT), after the cells' row
 * kernels (cells.h), the recurrent products (products.h) and the
 * forward's packed weights (pack.h).
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
 * recurrent product (packed-weight kernel), then one fused row kernel per
 * row (all LN statistics, gates, state update, output), rows shared by the
 * team. Backward adds a column-parallel reduction of the LN
 * parameter gradients in double, rows in order, so that they do not depend
 * on the thread count, and ends with the products for dW_ih, dW_hh, dx.
 */
#include "rnn/rnn.h"

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
    ly->reverse = a->reverse != 0;
    ly->steps = a->steps;
    ly->B = a->batch;
    ly->H = a->hidden;
    ly->ldy = a->ldy > 0 ? a->ldy : a->hidden;
    ly->eps = a->eps;
    ly->p = (const T *const *)a->params;
    ly->fixed = a->wtype == FASTLN_RNN_W_INT8;
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
    T *xg;                          /* reverse: the chunk's input rows in step order */
    int64_t c0;
    T *ahh_s, *act_s, *xc_s, *rs_s; /* a step's rows (copied to the cache if any); rs_s: no cache */
    T *h, *c;                       /* the state (updated in place without a cache) */
    T *y;
} SFX(fwd_ctx);

/* Row b of step t, after the step's products: the cell (fwd_row), then h
 * rounded or quantized for the next step's product where the products read
 * it so, and the row's cache. */
static inline void SFX(fwd_step_row)(SFX(fwd_ctx) *f, int64_t t, int64_t b)
{
    const SFX(layer) *ly = &f->ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t B = ly->B, H = ly->H, G = ly->G, R = L->nrstd;
    T *cache = ly->cache;
    const T *hp = cache ? cache + L->hseq + t * B * H : f->h;
    T *aih = f->aih + (t - f->c0) * B * G;
    T *rs = cache ? cache + L->rstd + t * B * R : f->rs_s;
    T *hn = cache ? cache + L->hseq + (t + 1) * B * H : f->h;
    const T *cp = !f->c ? NULL : cache ? cache + L->cseq + t * B * H : f->c;
    T *cn = !f->c ? NULL : cache ? cache + L->cseq + (t + 1) * B * H : f->c;
    int on = SFX(active)(ly, t, b);
    T *ai = aih + b * G, *ah = f->ahh_s + b * G;
    T *act = f->act_s ? f->act_s + b * G : NULL, *xc = f->xc_s ? f->xc_s + b * H : NULL;
    SFX(fwd_row)(ly, on, ai, ah, act, xc, R ? rs + b * R : NULL, hp + b * H, cp ? cp + b * H : NULL,
                 hn + b * H, cn ? cn + b * H : NULL,
                 f->y + (SFX(time_of)(ly, t, b) * B + b) * ly->ldy);
#if HAVE_BF16DOT
    if (f->rc.hbuf) SFX(row_to_bf16)(f->rc.hbuf + b * bf16_kp(H), hn + b * H, H);
#endif
#if HAVE_I8
    if (f->rc.hq && t + 1 < ly->steps)   /* for the next step, if any */
        SFX(row_to_i8)(f->rc.hq + b * i8_kp(H), f->rc.hqs + b, hn + b * H, H);
#endif
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

/* Step t: its product, then its rows, shared by the enclosing team. */
static void SFX(fwd_step)(SFX(fwd_ctx) *f, int64_t t)
{
    const SFX(layer) *ly = &f->ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t B = ly->B, H = ly->H, G = ly->G;
    T *cache = ly->cache;
    const T *hp = cache ? cache + L->hseq + t * B * H : f->h;
#if HAVE_BF16DOT
    if (f->rc.hbuf) {   /* h in bfloat16 from the last step's rows */
        if (t == 0) SFX(rows_to_bf16)(f->rc.hbuf, hp, H, B, H);
        SFX(packed_gemm_bf16)(f->rc.amx, f->ahh_s, G, f->rc.hbuf, (const uint16_t *)f->rc.packed,
                              B, G, H, 0);
    } else
#endif
#if HAVE_I8
    if (f->rc.hq) {   /* h quantized by the last step's rows */
        if (t == 0) SFX(rows_to_i8)(f->rc.hq, f->rc.hqs, hp, H, B, H, 0);
        SFX(gemm_i8)(f->ahh_s, G, f->rc.hq, f->rc.hqs, (const SFX(i8w) *)f->rc.packed, B, G, H, 0);
    } else
#endif
        SFX(rec_product)(&f->rc, f->ahh_s, hp, f->w_hh, B, G, H, 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) SFX(fwd_step_row)(f, t, b);
    if (cache) stream_fence();
}

/* Step t of a plain GRU with RESET_FIRST: the product with h for the r and
 * z gates, the gates and r h, the product with r h for n, then the rest of
 * the rows. Rows are shared by the enclosing team. */
static void SFX(fwd_step_rf)(SFX(fwd_ctx) *f, int64_t t)
{
    const SFX(layer) *ly = &f->ly;
    const fastln_rnn_layout *L = &ly->L;
    const int64_t B = ly->B, H = ly->H, G = ly->G;
    T *cache = ly->cache;
    const T *hp = cache ? cache + L->hseq + t * B * H : f->h;
    T *hn = cache ? cache + L->hseq + (t + 1) * B * H : f->h;
    T *aih = f->aih + (t - f->c0) * B * G, *ahh = f->ahh_s, *rh = f->xc_s;
    SFX(rec_part)(&f->rc, f->rc.packed, ahh, G, hp, H, f->w_hh, B, 2 * H, H, 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        if (SFX(active)(ly, t, b))
            SFX(gru_rf_gates)(ly, aih + b * G, ahh + b * G, f->act_s + b * G, rh + b * H, hp + b * H);
        else   /* r h of a held row: 0, so that its products stay finite */
            memset(rh + b * H, 0, (size_t)H * sizeof(T));
    }
    SFX(rec_part)(&f->rc, f->rc.packed_n, ahh + 2 * H, G, rh, H, f->w_hh + 2 * H * H, B, H,
                  H, 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        int on = SFX(active)(ly, t, b);
        T *y = f->y + (SFX(time_of)(ly, t, b) * B + b) * ly->ldy, *act = f->act_s + b * G;
        if (on) SFX(gru_rf_out)(ly, aih + b * G, ahh + b * G + 2 * H, act, hp + b * H, hn + b * H, y);
        else SFX(fwd_row)(ly, 0, NULL, NULL, NULL, NULL, NULL, hp + b * H, NULL, hn + b * H, NULL, y);
        if (cache) {   /* as fwd_step; r h of every row, for dW_hn */
            if (on) stream_copy(cache + L->act + (t * B + b) * G, act, (size_t)G * sizeof(T));
            stream_copy(cache + L->xc + (t * B + b) * H, rh + b * H, (size_t)H * sizeof(T));
        }
    }
    if (cache) stream_fence();
}

/* f->aih (M, G) = x (M, I) W_ih^T on the packed kernels (bfloat16: x
 * rounded to bfloat16 first; int8: x quantized per row). */
static void SFX(input_proj)(SFX(fwd_ctx) *f, const T *x, int64_t M, int64_t I)
{
    const int64_t G = f->ly.G;
#if HAVE_I8
    if (f->rc.method == 4) {
        SFX(rec_part)(&f->rc, f->rc.packed_ih, f->aih, G, x, I, NULL, M, G, I, 0);
        return;
    }
#endif
#if HAVE_BF16DOT
    if (f->rc.method == 3) {
        SFX(rows_to_bf16)(f->rc.abuf, x, I, M, I);
        SFX(packed_gemm_bf16)(f->rc.amx, f->aih, G, f->rc.abuf,
                              (const uint16_t *)f->rc.packed_ih, M, G, I, 0);
        return;
    }
#endif
    SFX(packed_gemm)(f->aih, G, x, I, 1, (const T *)f->rc.packed_ih, f->rc.ldp_ih, M, G, I, 0);
}

/* xs (steps [s0, s1), B, I) = the rows of x (T, B, I) that those steps read,
 * 0 where a row is inactive (its padding is never read, so need not be
 * finite): shared by the enclosing team. With back, the other way (x <- xs). */
static void SFX(gather_steps)(const SFX(layer) *ly, T *xs, T *x, int64_t s0, int64_t s1,
                              int64_t I, int back)
{
    const int64_t B = ly->B;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < (s1 - s0) * B; i++) {
        int64_t s = s0 + i / B, b = i % B;
        T *row = x + (SFX(time_of)(ly, s, b) * B + b) * I;
        if (back) memcpy(row, xs + i * I, (size_t)I * sizeof(T));
        else if (SFX(active)(ly, s, b)) memcpy(xs + i * I, row, (size_t)I * sizeof(T));
        else memset(xs + i * I, 0, (size_t)I * sizeof(T));
    }
}

#if HAVE_I8
/* Whether an int8 forward gives each thread rows of its own (fwd_chunk_own):
 * 2 to 32 rows a thread, W_hh within 1 MiB (each thread then reads all of
 * it every step, from its own L2), h quantized by the rows, no cache. A
 * small batch's steps are short, and their two barriers a large and, on a
 * loaded machine, erratic part of them; a large batch's products share the
 * weights' panels better between the threads. */
static inline int SFX(own_rows)(const SFX(fwd_ctx) *f, int nt)
{
    const SFX(layer) *ly = &f->ly;
    return f->rc.method == 4 && f->rc.hq && nt > 1 && ly->B >= 2 * nt && ly->B <= 32 * nt &&
           ly->G * ly->H <= (1 << 20) && !ly->cache;
}

/* Steps [c0, c1) of an int8 forward on thread tid of nt, which owns the
 * rows [B tid / nt, B (tid + 1) / nt): their input products, then per step
 * their recurrent product (against all of W), their cells and their
 * quantized h. A row's steps read nothing but its own state, so the steps
 * need no barrier; the results are those of the shared products, whose
 * every int32 sum is exact. xc: the chunk's input rows, step c0 first. */
static void SFX(fwd_chunk_own)(SFX(fwd_ctx) *f, const T *xc, int64_t I, int64_t c0,
                               int64_t c1, int tid, int nt)
{
    const int64_t B = f->ly.B, G = f->ly.G, H = f->ly.H, kpi = i8_kp(I), kph = i8_kp(H);
    const int64_t b0 = B * tid / nt, b1 = B * (tid + 1) / nt, n = b1 - b0;
    const SFX(rec) *rc = &f->rc;
    for (int64_t t = c0; t < c1; t++) {
        int64_t r = (t - c0) * B + b0;   /* the thread's rows of step t */
        SFX(product_i8)(f->aih + r * G, G, rc->qa + r * kpi, rc->qs + r, xc + r * I, I,
                        (const SFX(i8w) *)rc->packed_ih, n, G, I, 1);
    }
    for (int64_t t = c0; t < c1; t++) {
        if (t == 0)
            SFX(rows_to_i8)(rc->hq + b0 * kph, rc->hqs + b0, f->h + b0 * H, H, n, H, 1);
        SFX(gemm_i8)(f->ahh_s + b0 * G, G, rc->hq + b0 * kph, rc->hqs + b0,
                     (const SFX(i8w) *)rc->packed, n, G, H, 1);
        for (int64_t b = b0; b < b1; b++) SFX(fwd_step_row)(f, t, b);
    }
}
#endif

/* The input projections of steps [c0, c1) into f->aih, then those steps, in
 * one parallel region. */
static int SFX(fwd_chunk)(SFX(fwd_ctx) *f, const T *x, int64_t I, int64_t c0, int64_t c1, int nt)
{
    const int64_t B = f->ly.B, M = (c1 - c0) * B;
    const T *xc = f->xg ? f->xg : x + c0 * B * I;
    f->c0 = c0;
#if HAVE_I8
    if (SFX(own_rows)(f, nt)) {
        ON_TEAM(nt,
            if (f->xg) SFX(gather_steps)(&f->ly, f->xg, (T *)x, c0, c1, I, 0);
            SFX(fwd_chunk_own)(f, xc, I, c0, c1, omp_get_thread_num(), omp_get_num_threads()););
        return FASTLN_OK;
    }
#endif
    ON_TEAM(nt,
        if (f->xg) SFX(gather_steps)(&f->ly, f->xg, (T *)x, c0, c1, I, 0);
        SFX(input_proj)(f, xc, M, I);
        for (int64_t t = c0; t < c1; t++) {
            if (f->ly.L.reset_first) SFX(fwd_step_rf)(f, t);
            else SFX(fwd_step)(f, t);
        });
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
    int64_t n_act = gated ? B * G : 0, n_xc = L->xc >= 0 ? B * H : 0;
    int64_t n_rs = cache ? 0 : B * L->nrstd, n_xg = ly->reverse ? Tc * B * I : 0;
    char *raw = (char *)malloc((size_t)(n_aih + n_ahh + n_act + n_xc + n_rs + n_xg + 1) *
                                   sizeof(T) + 64);
    if (!raw) return FASTLN_ENOMEM;
    T *scratch = (T *)fastln_align64(raw);   /* the product rows on cache lines */
    T *aih_s = scratch, *next = scratch + n_aih;
    f.ahh_s = next;
    next += n_ahh;
    f.act_s = n_act ? next : NULL;
    next += n_act;
    f.xc_s = n_xc ? next : NULL;
    next += n_xc;
    f.rs_s = n_rs ? next : NULL;
    next += n_rs;
    f.xg = n_xg ? next : NULL;
    /* bfloat16 weights go into pair panels as they are, else widen to float
     * first (unless packed weights are given and hold them already) */
    int fmt = SFX(pack_format)(a->wtype), bf = fmt == FASTLN_PACK_BF16;
    int raw_w = bf || fmt == FASTLN_PACK_I8;   /* packed as stored */
    T *wi = NULL, *wh = NULL;
#if IS_F32
    int widen = a->wtype == FASTLN_RNN_W_BF16 && !bf && !SFX(prepacked)(a, fmt);
    if (widen) {
        wi = SFX(widened)(a->params[0], G * I);
        wh = SFX(widened)(a->params[1], G * H);
        w_ih = wi;
        f.w_hh = wh;
    }
#else
    const int widen = 0;
#endif
    int rc = widen && (!wi || !wh)
                 ? FASTLN_ENOMEM
                 : SFX(rec_init_fwd)(&f.rc, a, fmt, raw_w ? a->params[0] : (const void *)w_ih,
                                     raw_w ? a->params[1] : (const void *)f.w_hh, Tc, nt);
    if (rc) {
        free(wi);
        free(wh);
        free(raw);
        return rc;
    }
    if (cache) {
        memcpy(cache + L->hseq, f.h, (size_t)(B * H) * sizeof(T));
        if (lstm) memcpy(cache + L->cseq, f.c, (size_t)(B * H) * sizeof(T));
    }
    for (int64_t c0 = 0; c0 < Ts && rc == FASTLN_OK; c0 += Tc) {
        int64_t c1 = c0 + Tc < Ts ? c0 + Tc : Ts;
        f.aih = aih_s;
        rc = SFX(fwd_chunk)(&f, x, I, c0, c1, nt);
        if (!rc && a->interrupt && c1 < Ts && a->interrupt(a->interrupt_ctx)) rc = FASTLN_EINTR;
    }
    if (cache && rc == FASTLN_OK) {   /* the final state */
        memcpy(f.h, cache + L->hseq + Ts * B * H, (size_t)(B * H) * sizeof(T));
        if (lstm) memcpy(f.c, cache + L->cseq + Ts * B * H, (size_t)(B * H) * sizeof(T));
    }
    SFX(rec_free)(&f.rc);
    free(wi);
    free(wh);
    free(raw);
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
        SFX(seg) s[2] = {{0, G, -1, 0, 0, 0}, {G, H, -1, G, 0, 0}};
        memcpy(k.seg, s, sizeof s);
        k.nseg = 2;
        nacc = G + H;
    } else if (ly->plain) {     /* bias (G) */
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

#undef HAVE_BF16DOT
#undef HAVE_I8
#undef COLBLK
