/*
 * The forward of one layer, written once per (element type, ISA)
 * (isa/type_begin.h): its weights set up for the products (pack.h), then
 * chunks of steps, each in one parallel region: its input product, then its
 * steps (forward_step.h, or forward_own_rows.h). interrupt() is polled
 * between chunks.
 */
#include "rnn/rnn.h"

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
            else if (f->ly.proj) SFX(fwd_step_proj)(f, t);
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
    int64_t n_act = gated ? B * G : 0, n_xc = L->xc >= 0 || ly->proj ? B * H : 0;
    int64_t n_rs = cache ? 0 : B * L->nrstd, n_xg = ly->reverse ? Tc * B * I : 0;
    int64_t n_hs = ly->proj ? B * ly->P : 0;   /* a projected LSTM's new h */
    char *raw = (char *)malloc((size_t)(n_aih + n_ahh + n_act + n_xc + n_rs + n_xg + n_hs + 1) *
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
    next += n_xg;
    f.hs = n_hs ? next : NULL;
    f.w_hr = (const T *)ly->p[3];
    /* bfloat16 weights go into pair panels as they are, else widen to float
     * first (unless packed weights are given and hold them already) */
    int fmt = SFX(pack_format)(a->wtype), bf = fmt == FASTLN_PACK_BF16;
    int raw_w = bf || fmt == FASTLN_PACK_I8;   /* packed as stored */
    T *wi = NULL, *wh = NULL, *wr = NULL;
#if IS_F32
    int widen = a->wtype == FASTLN_RNN_W_BF16 && !bf && !SFX(prepacked)(a, fmt);
    if (widen) {
        wi = SFX(widened)(a->params[0], G * I);
        wh = SFX(widened)(a->params[1], G * ly->P);
        wr = ly->proj ? SFX(widened)(a->params[3], ly->P * H) : NULL;
        w_ih = wi;
        f.w_hh = wh;
        f.w_hr = wr;
    }
#else
    const int widen = 0;
#endif
    int rc = widen && (!wi || !wh || (ly->proj && !wr))
                 ? FASTLN_ENOMEM
                 : SFX(rec_init_fwd)(&f.rc, a, fmt, raw_w ? a->params[0] : (const void *)w_ih,
                                     raw_w ? a->params[1] : (const void *)f.w_hh,
                                     raw_w ? a->params[3] : (const void *)f.w_hr, Tc, nt);
    if (rc) {
        free(wi);
        free(wh);
        free(wr);
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
    free(wr);
    free(raw);
    return rc;
}
