/*
 * The steps of a forward, written once per (element type, ISA)
 * (isa/type_begin.h): per step the recurrent product (products.h), then one
 * fused row kernel per row (cells.h: all LN statistics, gates, state update,
 * output), rows shared by the team; and a chunk's input projections.
 * forward.h drives them.
 */
#include "rnn/rnn.h"

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
    const T *w_hr;                  /* a projected LSTM's W_hr (P, H) */
    T *hs;                          /* and a step's new h (B, P), before the held rows */
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

/* Step t of a projected LSTM (no cache): the product with h (B, P), the
 * cells' rows into m = o tanh(c') (xc_s, B x H; a held row's m is 0, so
 * that the products stay finite), the product hs = m W_hr^T, then each
 * row's h and y (a held row keeps its h, c and outputs 0). Rows are shared
 * by the enclosing team. */
static void SFX(fwd_step_proj)(SFX(fwd_ctx) *f, int64_t t)
{
    const SFX(layer) *ly = &f->ly;
    const int64_t B = ly->B, H = ly->H, G = ly->G, P = ly->P;
    T *aih = f->aih + (t - f->c0) * B * G, *m = f->xc_s;
    SFX(rec_part)(&f->rc, f->rc.packed, f->ahh_s, G, f->h, P, f->w_hh, B, G, P, 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        T *c = f->c + b * H;
        if (SFX(active)(ly, t, b))
            SFX(plain_lstm_row)(ly, aih + b * G, f->ahh_s + b * G, f->act_s + b * G, c,
                                m + b * H, c);
        else
            memset(m + b * H, 0, (size_t)H * sizeof(T));
    }
    SFX(rec_part)(&f->rc, f->rc.packed_r, f->hs, P, m, H, f->w_hr, B, P, H, 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; b++) {
        T *y = f->y + (SFX(time_of)(ly, t, b) * B + b) * ly->ldy;
        if (SFX(active)(ly, t, b)) {
            memcpy(f->h + b * P, f->hs + b * P, (size_t)P * sizeof(T));
            memcpy(y, f->hs + b * P, (size_t)P * sizeof(T));
        } else {
            memset(y, 0, (size_t)P * sizeof(T));
        }
    }
}

/* f->aih (M, G) = x (M, I) W_ih^T on the packed kernels (bfloat16: x
 * rounded to bfloat16 first; int8: x quantized per row). */
static void SFX(input_proj)(SFX(fwd_ctx) *f, const T *x, int64_t M, int64_t I)
{
    const int64_t G = f->ly.G;
#if HAVE_I8
    if (f->rc.method == FASTLN_REC_INT8) {
        SFX(rec_part)(&f->rc, f->rc.packed_ih, f->aih, G, x, I, NULL, M, G, I, 0);
        return;
    }
#endif
#if HAVE_BF16DOT
    if (f->rc.method == FASTLN_REC_BF16) {
        SFX(rows_to_bf16)(f->rc.abuf, x, I, M, I);
        SFX(packed_gemm_bf16)(f->rc.amx, f->aih, G, f->rc.abuf,
                              (const uint16_t *)f->rc.packed_ih, M, G, I, 0);
        return;
    }
#endif
    SFX(packed_gemm)(f->aih, G, x, I, 1, (const T *)f->rc.packed_ih, f->rc.ldp_ih, M, G, I, 0);
}
