/*
 * The int8 forward's rows of each thread, written once per (element type,
 * ISA) (float only: gemm/int8.h): a small batch's steps without barriers,
 * each thread running its own rows' products and cells (forward_step.h).
 */
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
    return f->rc.method == FASTLN_REC_INT8 && f->rc.hq && nt > 1 && ly->B >= 2 * nt &&
           ly->B <= 32 * nt && ly->G * ly->H <= (1 << 20) && !ly->cache;
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
