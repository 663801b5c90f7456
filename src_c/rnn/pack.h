/*
 * The packed weights of the LN-RNN forward, written once per (element type,
 * ISA) after the recurrent products (products.h): the format and layout
 * of the packed blob (pack_format, pack_layout, pack_parts), fastln_rnn_pack
 * on this path (rnn_pack, float only), and the forward's recurrent products
 * set up from caller-packed or freshly packed weights (prepacked,
 * rec_init_fwd).
 */
#include "gemm/gemm.h"
#include "rnn/rnn.h"
#include "runtime/pool.h"

/* When a forward packs transposed weights (see packs_transposed), by the
 * bytes of W_hh (G x H elements): a call of RNN_PACK_SHORT_STEPS steps or
 * more from RNN_PACK_VAST bytes, over a batch from RNN_PACK_HUGE * 2, and
 * over RNN_PACK_SHORT_ROWS rows from RNN_PACK_SHORT_BYTES; otherwise no call
 * of fewer than RNN_PACK_MIN_STEPS steps; from RNN_PACK_HUGE any longer
 * call; from RNN_PACK_LARGE a call over a batch, and from RNN_PACK_BIG a
 * single sequence over RNN_PACK_SEQ_STEPS steps or more; smaller weights a
 * call of RNN_PACK_SMALL_STEPS steps and RNN_PACK_ROWS rows (steps x
 * batch). */
#define RNN_PACK_SHORT_STEPS 4
#define RNN_PACK_VAST ((int64_t)128 << 20)
#define RNN_PACK_SHORT_ROWS 64
#define RNN_PACK_SHORT_BYTES ((int64_t)16 << 20)
#define RNN_PACK_MIN_STEPS 16
#define RNN_PACK_HUGE ((int64_t)32 << 20)
#define RNN_PACK_BIG ((int64_t)8 << 20)
#define RNN_PACK_LARGE ((int64_t)2 << 20)
#define RNN_PACK_SEQ_STEPS 48
#define RNN_PACK_SMALL_STEPS 32
#define RNN_PACK_ROWS 256

/* The format of a forward's packed weights on this path for weights stored
 * as wtype: int8 quad panels for int8 weights, bfloat16 pair panels where
 * the CPU has VDPBF16PS, else panels of T (bfloat16 weights widened to
 * float first). */
static int SFX(pack_format)(int wtype)
{
#if HAVE_I8
    if (wtype == FASTLN_RNN_W_INT8) return FASTLN_PACK_I8;
#endif
#if HAVE_BF16DOT
    if (wtype == FASTLN_RNN_W_BF16 && fastln_cpu_has_avx512bf16()) return FASTLN_PACK_BF16;
#endif
    (void)wtype;
    return IS_F32 ? FASTLN_PACK_F32 : FASTLN_PACK_F64;
}

/* Byte offsets of a packed layer's parts after its header (W_hh, or its
 * [r, z] blocks with rf; W_hn with rf; W_ih; W_hr with a projection P > 0),
 * each 64-byte aligned; returns the whole size. W_hh has K = P columns
 * with a projection, else H. */
static int64_t SFX(pack_layout)(int64_t off[4], int fmt, int rf, int64_t G, int64_t H,
                                int64_t I, int64_t P)
{
    int64_t Gh = rf ? 2 * H : G, Kh = P ? P : H, n[4], at = (int64_t)sizeof(fastln_rnn_pack_header);
#if HAVE_I8
    if (fmt == FASTLN_PACK_I8) {
        n[0] = i8_part_size(Gh, Kh);
        n[1] = rf ? i8_part_size(H, H) : 0;
        n[2] = i8_part_size(G, I);
        n[3] = P ? i8_part_size(P, H) : 0;
    } else
#endif
#if HAVE_BF16DOT
    if (fmt == FASTLN_PACK_BF16) {
        n[0] = 2 * SFX(packed_size_bf16)(Gh, Kh);
        n[1] = rf ? 2 * SFX(packed_size_bf16)(H, H) : 0;
        n[2] = 2 * SFX(packed_size_bf16)(G, I);
        n[3] = P ? 2 * SFX(packed_size_bf16)(P, H) : 0;
    } else
#endif
    {
        (void)fmt;
        const int64_t es = (int64_t)sizeof(T);
        n[0] = es * PACKED_SIZE(Gh, Kh);
        n[1] = rf ? es * PACKED_SIZE(H, H) : 0;
        n[2] = es * PACKED_SIZE(G, I);
        n[3] = P ? es * PACKED_SIZE(P, H) : 0;
    }
    for (int i = 0; i < 4; i++) {
        off[i] = at;
        at += (n[i] + 63) / 64 * 64;
    }
    return at;
}

/* The parts of a packed layer (blob + off[i]) from W_ih (G, I), W_hh (G,
 * Kh) and, with a projection P > 0, W_hr (P, H), int8 for FASTLN_PACK_I8,
 * bfloat16 for FASTLN_PACK_BF16, else T: shared by the enclosing team. */
static void SFX(pack_parts)(char *blob, const int64_t off[4], int fmt, int rf, int64_t G,
                            int64_t H, int64_t I, int64_t P, const void *w_ih,
                            const void *w_hh, const void *w_hr)
{
    int64_t Gh = rf ? 2 * H : G, Kh = P ? P : H;
#if HAVE_I8
    if (fmt == FASTLN_PACK_I8) {
        const int8_t *wh = (const int8_t *)w_hh;
        SFX(pack_nt_i8)(blob + off[0], wh, Gh, Kh);
        if (rf) SFX(pack_nt_i8)(blob + off[1], wh + 2 * H * H, H, H);
        SFX(pack_nt_i8)(blob + off[2], (const int8_t *)w_ih, G, I);
        if (P) SFX(pack_nt_i8)(blob + off[3], (const int8_t *)w_hr, P, H);
        return;
    }
#endif
#if HAVE_BF16DOT
    if (fmt == FASTLN_PACK_BF16) {
        const uint16_t *wh = (const uint16_t *)w_hh;
        SFX(pack_nt_bf16)((uint16_t *)(blob + off[0]), wh, Gh, Kh);
        if (rf) SFX(pack_nt_bf16)((uint16_t *)(blob + off[1]), wh + 2 * H * H, H, H);
        SFX(pack_nt_bf16)((uint16_t *)(blob + off[2]), (const uint16_t *)w_ih, G, I);
        if (P) SFX(pack_nt_bf16)((uint16_t *)(blob + off[3]), (const uint16_t *)w_hr, P, H);
        return;
    }
#endif
    (void)fmt;
    const T *wh = (const T *)w_hh;
    PACK_NT((T *)(blob + off[0]), wh, Gh, Kh, Kh);
    if (rf) PACK_NT((T *)(blob + off[1]), wh + 2 * H * H, H, H, H);
    PACK_NT((T *)(blob + off[2]), (const T *)w_ih, G, I, I);
    if (P) PACK_NT((T *)(blob + off[3]), (const T *)w_hr, P, H, H);
}

/* The parts of a packed layer, panels of T, from W_ih^T (I, G) and W_hh^T
 * (Kh, G) row-major (Fortran-ordered W_ih and W_hh; Kh = P with a
 * projection, else H), and W_hr^T (H, P): each panel row is a slice of a
 * row of W^T, so the panels are those pack_parts makes from W_ih, W_hh and
 * W_hr. Shared by the enclosing team. */
static void SFX(pack_parts_t)(char *blob, const int64_t off[4], int rf, int64_t G, int64_t H,
                              int64_t I, int64_t P, const T *wt_ih, const T *wt_hh,
                              const T *wt_hr)
{
    PACK_NN((T *)(blob + off[0]), wt_hh, P ? P : H, rf ? 2 * H : G, G);
    if (rf) PACK_NN((T *)(blob + off[1]), wt_hh + 2 * H, H, H, G);
    PACK_NN((T *)(blob + off[2]), wt_ih, I, G, G);
    if (P) PACK_NN((T *)(blob + off[3]), wt_hr, H, P, P);
}

/* Whether a forward packs transposed weights instead of reading them in
 * place. A panel read in place has its rows G elements apart, each on
 * another page from 4 KiB on (G = 1024 floats, 512 doubles), where a packed
 * panel is contiguous: unless the weights sit on huge pages, the products
 * stall on the TLB and the prefetchers do not follow the rows. Packing
 * costs about two passes over the weights, once a call. Weights that fit
 * the L2 caches (up to 2 MiB of W_hh) are read in place by all but long
 * calls over a batch. Larger ones are streamed from L3 or memory at every
 * step; a batch reads each row of W^T in slices of 128 or 256 bytes and
 * pays a page walk for each, so the in-place read loses on each step what a
 * pack costs once: past 16 MiB, a batch of 64 rows repays it within 4
 * steps, and so does any batch past 64 MiB and a single sequence past 128
 * MiB. A single sequence reads longer slices and gains less, which repays
 * the pack only over more steps. A step, or a short call over smaller
 * weights, reads them where they are. G: the layer's gate rows (4H for an
 * LSTM). */
static int SFX(packs_transposed)(const fastln_rnn_args *a, int64_t G)
{
    const int64_t w = G * a->hidden * (int64_t)sizeof(T), steps = a->steps, B = a->batch;
    if (steps >= RNN_PACK_SHORT_STEPS &&
        (w >= RNN_PACK_VAST || (w >= 2 * RNN_PACK_HUGE && B > 1) ||
         (w >= RNN_PACK_SHORT_BYTES && B >= RNN_PACK_SHORT_ROWS)))
        return 1;
    if (steps < RNN_PACK_MIN_STEPS) return 0;
    if (w >= RNN_PACK_HUGE || (w >= RNN_PACK_LARGE && B > 1)) return 1;
    if (w >= RNN_PACK_BIG && steps >= RNN_PACK_SEQ_STEPS) return 1;
    return steps >= RNN_PACK_SMALL_STEPS && steps * B >= RNN_PACK_ROWS;
}

#if IS_F32
/* w (n) = the bfloat16 values of src as float, in a new array (NULL: no memory). */
static float *SFX(widened)(const void *src, int64_t n)
{
    float *w = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (w) widen_half(FASTLN_BF16, w, (const uint16_t *)src, n);
    return w;
}

/* fastln_rnn_pack on this path (api/rnn.c checks the arguments): out NULL
 * returns the size in bytes. */
static int64_t SFX(rnn_pack)(void *out, int64_t size, int cell, int wtype, int64_t I,
                             int64_t H, int64_t P, const void *w_ih, const void *w_hh,
                             const void *w_hr, int nt)
{
    fastln_rnn_layout L;
    fastln_rnn_layout_for(&L, cell, 1, 1, H);
    int fmt = SFX(pack_format)(wtype);
    int64_t off[4];
    int64_t total = SFX(pack_layout)(off, fmt, L.reset_first, L.G, H, I, P);
    if (!out) return total;
    if (size < total) return -FASTLN_EINVAL;
    float *wi = NULL, *wh = NULL, *wr = NULL;
    if (wtype == FASTLN_RNN_W_BF16 && fmt == FASTLN_PACK_F32) {
        wi = SFX(widened)(w_ih, L.G * I);
        wh = SFX(widened)(w_hh, L.G * (P ? P : H));
        wr = P ? SFX(widened)(w_hr, P * H) : NULL;
        if (!wi || !wh || (P && !wr)) {
            free(wi);
            free(wh);
            free(wr);
            return -FASTLN_ENOMEM;
        }
    }
    fastln_rnn_pack_header hd;
    memset(&hd, 0, sizeof hd);
    hd.magic = FASTLN_PACK_MAGIC;
    hd.format = fmt;
    hd.cell = cell;
    hd.input = I;
    hd.hidden = H;
    hd.proj = P;
    memcpy(out, &hd, sizeof hd);
    ON_TEAM(nt, SFX(pack_parts)((char *)out, off, fmt, L.reset_first, L.G, H, I, P,
                                wi ? (const void *)wi : w_ih, wh ? (const void *)wh : w_hh,
                                wr ? (const void *)wr : w_hr););
    free(wi);
    free(wh);
    free(wr);
    return total;
}

#endif

/* Whether a->packed holds this layer packed in format fmt. */
static int SFX(prepacked)(const fastln_rnn_args *a, int fmt)
{
    const fastln_rnn_pack_header *hd = (const fastln_rnn_pack_header *)a->packed;
    return fmt && hd && hd->magic == FASTLN_PACK_MAGIC && hd->format == fmt &&
           hd->cell == a->cell && hd->input == a->input && hd->hidden == a->hidden &&
           hd->proj == a->proj;
}

/* Forward: the products of a layer on the packed kernels, for every B (so
 * that a row's results do not depend on the batch it is in), with a->packed
 * when it was packed for this path, cell and sizes, else packed here, or,
 * with a->transposed, W_ih^T, W_hh^T (and a projection's W_hr^T) read where
 * they are or packed from that layout (packs_transposed decides; the packed
 * kernels' panels are row-major (K, N) blocks of NRT columns, so reading the
 * whole rows of W^T does the same operations in the same order; api/rnn.c
 * passes transposed weights only where G, H for RESET_FIRST and P are
 * multiples of NRT); w_ih, w_hh, w_hr are T, or bfloat16 for the bfloat16
 * format. abuf gets room for Tc
 * steps of input in bfloat16, hbuf for h (RESET_FIRST, whose products round
 * h and r h themselves, takes them in abuf). */
static int SFX(rec_init_fwd)(SFX(rec) *rc, const fastln_rnn_args *a, int fmt, const void *w_ih,
                             const void *w_hh, const void *w_hr, int64_t Tc, int nt)
{
    memset(rc, 0, sizeof *rc);
    fastln_rnn_layout L;
    fastln_rnn_layout_for(&L, a->cell, 1, 1, a->hidden);
    const int64_t B = a->batch, I = a->input, H = a->hidden, P = a->proj;
    /* RESET_FIRST and a projection take the A of each product rounded or
     * quantized by the product itself, not by the rows */
    const int own_a = L.reset_first || P;
    int64_t off[4], total = SFX(pack_layout)(off, fmt, L.reset_first, L.G, H, I, P);
    const char *blob = (const char *)a->packed;
    int64_t nab = 0, nhb = 0;
    (void)B;
    (void)Tc;
    (void)own_a;
#if HAVE_BF16DOT
    if (fmt == FASTLN_PACK_BF16) {
        nab = bf16_rows_size(Tc * B, I);
        nhb = bf16_rows_size(B, H);
        if (own_a) {   /* h (B, P) is no wider than that */
            int64_t np = P ? bf16_rows_size(B, P) : 0;
            nab = nab > nhb ? nab : nhb;
            nab = nab > np ? nab : np;
            nhb = 0;
        }
        rc->amx = fastln_cpu_has_amx_bf16();
    }
#endif
    /* int8: bytes of quantized rows (Tc steps of input, or h), then their scales */
    int64_t nq = 0, nhq = 0;
#if HAVE_I8
    int64_t nqr = 0;
    if (fmt == FASTLN_PACK_I8) {
        nqr = Tc * B * i8_kp(I) > B * i8_kp(H) ? Tc * B * i8_kp(I) : B * i8_kp(H);
        nqr = P && B * i8_kp(P) > nqr ? B * i8_kp(P) : nqr;
        nqr = (nqr + 63) / 64 * 64;
        nq = nqr + (Tc * B * (int64_t)sizeof(float) + 63) / 64 * 64;
        /* h quantized by the rows, and its scales (not own_a) */
        nhq = own_a ? 0 : (B * i8_kp(H) + 63) / 64 * 64 + B * (int64_t)sizeof(float);
    }
#endif
    int fresh = !SFX(prepacked)(a, fmt);
    if (fresh && a->transposed &&
        (fmt != SFX(pack_format)(FASTLN_RNN_W_SAME) || L.G % NRT || (L.reset_first && H % NRT) ||
         P % NRT))
        return FASTLN_EINVAL;
    if (fresh && a->transposed && !SFX(packs_transposed)(a, L.G)) {
        rc->method = FASTLN_REC_PACKED;
        rc->packed = w_hh;
        rc->packed_n = L.reset_first ? (const T *)w_hh + 2 * H : NULL;
        rc->packed_ih = w_ih;
        rc->packed_r = P ? w_hr : NULL;
        rc->ldp = rc->ldp_ih = L.G;
        rc->ldp_r = P;
        return FASTLN_OK;
    }
    /* from the cache of large buffers (runtime/pool.h): 64-byte aligned, without
     * the page faults of fresh memory each call */
    char *buf =
        (char *)fastln_pool_alloc((size_t)((fresh ? total : 0) + 2 * (nab + nhb) + nq + nhq));
    if (!buf) return FASTLN_ENOMEM;
    rc->own = buf;
    rc->abuf = nab ? (uint16_t *)(buf + (fresh ? total : 0)) : NULL;
    rc->hbuf = nhb ? rc->abuf + nab : NULL;
    /* AMX reads whole blocks of 16 rows */
    if (nab) memset(rc->abuf, 0, (size_t)(nab + nhb) * sizeof(uint16_t));
    if (fresh) {
        if (a->transposed)
            ON_TEAM(nt, SFX(pack_parts_t)(buf, off, L.reset_first, L.G, H, I, P,
                                          (const T *)w_ih, (const T *)w_hh,
                                          (const T *)w_hr););
        else
            ON_TEAM(nt, SFX(pack_parts)(buf, off, fmt, L.reset_first, L.G, H, I, P, w_ih,
                                        w_hh, w_hr););
        blob = buf;
    }
#if HAVE_I8
    if (fmt == FASTLN_PACK_I8) {   /* the parts with their scales; A's rows after the pack */
        const float *s_ih = a->scales[0], *s_hh = a->scales[1];
        rc->i8[0] = SFX(i8_part)(blob + off[0], s_hh, L.reset_first ? 2 * H : L.G, P ? P : H);
        rc->i8[1] = SFX(i8_part)(blob + off[1], s_hh + 2 * H, H, H);
        rc->i8[2] = SFX(i8_part)(blob + off[2], s_ih, L.G, I);
        rc->i8[3] = SFX(i8_part)(blob + off[3], a->scale_hr, P, H);
        rc->qa = (uint8_t *)(buf + (fresh ? total : 0));
        rc->qs = (float *)(rc->qa + nqr);
        if (nhq) {
            rc->hq = rc->qa + nq;
            rc->hqs = (float *)(rc->hq + (B * i8_kp(H) + 63) / 64 * 64);
        }
        rc->method = FASTLN_REC_INT8;
        rc->packed = &rc->i8[0];
        rc->packed_n = L.reset_first ? &rc->i8[1] : NULL;
        rc->packed_ih = &rc->i8[2];
        rc->packed_r = P ? &rc->i8[3] : NULL;
        return FASTLN_OK;
    }
#endif
    rc->method = fmt == FASTLN_PACK_BF16 ? FASTLN_REC_BF16 : FASTLN_REC_PACKED;
    rc->packed = blob + off[0];
    rc->packed_n = L.reset_first ? blob + off[1] : NULL;
    rc->packed_ih = blob + off[2];
    rc->packed_r = P ? blob + off[3] : NULL;
    rc->ldp = rc->ldp_ih = rc->ldp_r = NRT;
    return FASTLN_OK;
}
