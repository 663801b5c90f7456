/* A driver of fastln's C API for AddressSanitizer/UBSan builds (ctest runs
 * it in CMakeLists.txt's FASTLN_SANITIZE=ON build; tests/test_c.py). Values
 * are arbitrary: the Python tests check the results, this checks memory and
 * undefined behaviour.
 *  - the normalization kernels (fastln.h): every function, dtype (float16
 *    and bfloat16 storage too) and ISA path; rows of 1 to 4099 elements, 0 to 3100 rows (the largest past the
 *    streaming-store threshold), in place and not, 1 and 3 threads;
 *  - the LN-RNN engine (fastln_rnn.h): every cell, ISA path and dtype; odd
 *    sizes, B = 1, lengths, 1 and 3 threads; one direction, reversed, and
 *    both (forward2/backward2); forward with and without a cache, backward
 *    with and without the caller's scratch; inference with weights packed
 *    by fastln_rnn_pack and with bfloat16 weights, unpacked and packed, and
 *    with transposed weights (forward and both directions); one step through
 *    fastln_rnn_step_* (in place and on rows of a table, plain and transposed
 *    weights);
 *  - the cache of large outputs (pool.h): blocks of every size class
 *    allocated, written to their last byte, resized, freed and reused from 3
 *    threads at once while the limit changes; every block released at the
 *    end, so that LeakSanitizer sees what the cache would lose. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "api/fastln_rnn.h"
#include "runtime/pool.h"

static void *fill(size_t n, size_t es, unsigned seed) {
    void *p = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        double v = ((seed * 2654435761u + i * 40503u) % 1000) / 1000.0 - 0.5;
        if (es == 4) ((float *)p)[i] = (float)v; else ((double *)p)[i] = v;
    }
    return p;
}

/* Inference (float, no cache) of the nd directions in a: each direction's
 * weights packed by fastln_rnn_pack, then in bfloat16 (the upper halves of
 * their float values) unpacked and packed. a is left as it was. */
static int run_packed(fastln_rnn_args *a, int nd, int cell, int64_t I, int64_t H) {
    int base = cell & ~(FASTLN_CELL_PLAIN | FASTLN_CELL_RESET_FIRST);
    int64_t G = (base == FASTLN_CELL_LSTM ? 4 : base == FASTLN_CELL_GRU ? 3 : 1) * H;
    int64_t count[2] = {G * I, G * H};   /* elements of W_ih, W_hh */
    int rc = 0;
    for (int wt = FASTLN_RNN_W_SAME; wt <= FASTLN_RNN_W_BF16; wt++) {
        void *w[2][2], *pk[2] = {NULL, NULL};
        for (int d = 0; d < nd; d++)
            for (int m = 0; m < 2; m++) {
                w[d][m] = (void *)a[d].params[m];
                if (wt == FASTLN_RNN_W_BF16) {
                    uint16_t *b = malloc(count[m] * 2);
                    for (int64_t i = 0; i < count[m]; i++) {
                        uint32_t u;
                        memcpy(&u, (const float *)w[d][m] + i, 4);
                        b[i] = (uint16_t)(u >> 16);
                    }
                    a[d].params[m] = b;
                    a[d].wtype = FASTLN_RNN_W_BF16;
                }
            }
        rc |= nd == 2 ? fastln_rnn_forward2_f32(a) : fastln_rnn_forward_f32(a);   /* unpacked */
        for (int d = 0; d < nd; d++) {
            int64_t size = fastln_rnn_packed_size(cell, wt, I, H);
            if (size < 0) rc |= FASTLN_EINVAL;
            if (size <= 0) continue;   /* the path has no packed kernels */
            pk[d] = malloc(size);
            rc |= fastln_rnn_pack(pk[d], size, cell, wt, I, H, a[d].params[0], a[d].params[1]);
            a[d].packed = pk[d];
        }
        rc |= nd == 2 ? fastln_rnn_forward2_f32(a) : fastln_rnn_forward_f32(a);   /* packed */
        for (int d = 0; d < nd; d++) {
            free(pk[d]);
            a[d].packed = NULL;
            a[d].wtype = FASTLN_RNN_W_SAME;
            for (int m = 0; m < 2; m++) {
                if (wt == FASTLN_RNN_W_BF16) free((void *)a[d].params[m]);
                a[d].params[m] = w[d][m];
            }
        }
    }
    return rc;
}

/* A new (K, G) row-major copy of w (G, K), elements of es bytes: w^T. */
static void *transposed(const void *w, int64_t G, int64_t K, size_t es) {
    char *t = malloc(G * K * es);
    for (int64_t n = 0; n < G; n++)
        for (int64_t k = 0; k < K; k++)
            memcpy(t + (k * G + n) * es, (const char *)w + (n * K + k) * es, es);
    return t;
}

/* Inference with W_ih and W_hh stored transposed (column-major W: read in
 * place by a float forward where G allows, else copied). a is left as it was. */
static int run_transposed(fastln_rnn_args *a, int nd, int64_t G, int64_t I, int64_t H,
                          size_t es, int f64) {
    int64_t K[2] = {I, H};
    const void *w[2][2];
    int rc = 0;
    for (int d = 0; d < nd; d++)
        for (int m = 0; m < 2; m++) {
            w[d][m] = a[d].params[m];
            a[d].params[m] = transposed(w[d][m], G, K[m], es);
            a[d].transposed = FASTLN_RNN_W_IH_T | FASTLN_RNN_W_HH_T;
        }
    rc |= nd == 2 ? (f64 ? fastln_rnn_forward2_f64(a) : fastln_rnn_forward2_f32(a))
                  : (f64 ? fastln_rnn_forward_f64(a) : fastln_rnn_forward_f32(a));
    for (int d = 0; d < nd; d++) {
        for (int m = 0; m < 2; m++) {
            free((void *)a[d].params[m]);
            a[d].params[m] = w[d][m];
        }
        a[d].transposed = 0;
    }
    return rc;
}

/* One step of the layer (its first time step's input) through
 * fastln_rnn_step_*: the state in place, and as rows of a table of B + 3
 * streams named in reverse, plain and transposed weights. a is left as it was. */
static int run_step(fastln_rnn_args *a, int64_t B, int64_t G, int64_t I, int64_t H, size_t es,
                    int f64) {
    int64_t S = B + 3, K[2] = {I, H};
    void *ht = fill(S * H, es, 21), *ct = fill(S * H, es, 22), *y = malloc(B * H * es);
    int64_t *rows = malloc(B * 8);
    for (int64_t b = 0; b < B; b++) rows[b] = S - 1 - 2 * b % S;
    for (int64_t b = 0; b < B; b++)   /* distinct: S - 1 - 2b wraps past B + 3 rows */
        for (int64_t q = 0; q < b; q++)
            if (rows[q] == rows[b]) rows[b] = (rows[b] + 1) % S;
    fastln_rnn_args layer = a[0];
    fastln_rnn_step_args s;
    memset(&s, 0, sizeof s);
    s.layers = &layer; s.num_layers = 1; s.batch = B; s.x = a[0].x; s.y = y;
    int rc = 0, cell = (a[0].cell & ~(FASTLN_CELL_PLAIN | FASTLN_CELL_RESET_FIRST)) == FASTLN_CELL_LSTM;
    for (int t = 0; t < 2; t++) {
        if (t) {   /* transposed weights */
            for (int m = 0; m < 2; m++) layer.params[m] = transposed(a[0].params[m], G, K[m], es);
            layer.transposed = FASTLN_RNN_W_IH_T | FASTLN_RNN_W_HH_T;
        }
        s.rows = NULL; s.table_rows = B; s.h = ht; s.c = cell ? ct : NULL;   /* in place */
        s.h_in = NULL; s.c_in = NULL;
        rc |= f64 ? fastln_rnn_step_f64(&s) : fastln_rnn_step_f32(&s);
        s.rows = rows; s.table_rows = S;                                      /* rows */
        rc |= f64 ? fastln_rnn_step_f64(&s) : fastln_rnn_step_f32(&s);
        if (t)
            for (int m = 0; m < 2; m++) free((void *)layer.params[m]);
    }
    free(ht); free(ct); free(y); free(rows);
    return rc;
}

/* One layer of cell forward (without and with a cache) and backward (without
 * and with the caller's scratch). dirs: 0 one direction, 1 reversed, 2 both
 * (fastln_rnn_forward2/backward2, y and dy (T, B, 2H)). */
static int run(int cell, int64_t T, int64_t B, int64_t I, int64_t H, int f64, int lens, int dirs) {
    size_t es = f64 ? 8 : 4;
    int base = cell & ~(FASTLN_CELL_PLAIN | FASTLN_CELL_RESET_FIRST), nd = dirs == 2 ? 2 : 1;
    int64_t G = (base == FASTLN_CELL_LSTM ? 4 : base == FASTLN_CELL_GRU ? 3 : 1) * H;
    int64_t sizes[10]; int np;
    if ((cell & FASTLN_CELL_PLAIN) && base == FASTLN_CELL_GRU) { int64_t s[] = {G*I, G*H, G, H}; np = 4; memcpy(sizes, s, sizeof s); }
    else if (cell & FASTLN_CELL_PLAIN) { int64_t s[] = {G*I, G*H, G}; np = 3; memcpy(sizes, s, sizeof s); }
    else if (cell == FASTLN_CELL_LSTM) { int64_t s[] = {G*I, G*H, G, G, G, G, G, H, H}; np = 9; memcpy(sizes, s, sizeof s); }
    else if (cell == FASTLN_CELL_GRU) { int64_t s[] = {G*I, G*H, 2*H, 2*H, 2*H, 2*H, H, H, H, H}; np = 10; memcpy(sizes, s, sizeof s); }
    else { int64_t s[] = {G*I, G*H, H, H}; np = 4; memcpy(sizes, s, sizeof s); }
    int64_t *len = NULL;
    if (lens) { len = malloc(B * 8); for (int64_t b = 0; b < B; b++) len[b] = 1 + (b * 7) % T; }
    void *x = fill(T * B * I, es, 11), *y = malloc(T * B * H * nd * es), *dy = fill(T * B * H * nd, es, 14);
    void *dx = malloc(T * B * I * es);
    int64_t cs = fastln_rnn_cache_size(cell, T, B, H), ws = fastln_rnn_work_size(cell, T, B, H);
    fastln_rnn_args a[2];
    void *params[2][10], *grads[2][10], *h[2], *c[2], *cache[2], *dh[2], *dc[2], *work[2];
    for (int d = 0; d < nd; d++) {
        memset(&a[d], 0, sizeof a[d]);
        a[d].cell = cell; a[d].steps = T; a[d].batch = B; a[d].input = I; a[d].hidden = H; a[d].eps = 1e-5;
        for (int k = 0; k < np; k++) { params[d][k] = fill(sizes[k], es, k + 1 + d); grads[d][k] = malloc(sizes[k] * es); a[d].params[k] = params[d][k]; a[d].grads[k] = grads[d][k]; }
        h[d] = fill(B * H, es, 12); c[d] = fill(B * H, es, 13); cache[d] = malloc(cs * es);
        dh[d] = fill(B * H, es, 15); dc[d] = fill(B * H, es, 16); work[d] = malloc(ws * es);
        a[d].lengths = len; a[d].reverse = dirs == 1 || d == 1; a[d].ldy = nd * H;
        a[d].x = x; a[d].y = (char *)y + d * H * es; a[d].h = h[d]; a[d].c = c[d];
        a[d].dy = (char *)dy + d * H * es; a[d].dx = dx; a[d].dh = dh[d]; a[d].dc = dc[d];
    }
#define FWD() (nd == 2 ? (f64 ? fastln_rnn_forward2_f64(a) : fastln_rnn_forward2_f32(a)) \
                       : (f64 ? fastln_rnn_forward_f64(a) : fastln_rnn_forward_f32(a)))
#define BWD() (nd == 2 ? (f64 ? fastln_rnn_backward2_f64(a) : fastln_rnn_backward2_f32(a)) \
                       : (f64 ? fastln_rnn_backward_f64(a) : fastln_rnn_backward_f32(a)))
    int rc = FWD();   /* inference */
    if (!f64)         /* inference with packed weights, and with bfloat16 ones */
        rc |= run_packed(a, nd, cell, I, H);
    rc |= run_transposed(a, nd, G, I, H, es, f64);
    if (nd == 1) rc |= run_step(a, B, G, I, H, es, f64);
    for (int d = 0; d < nd; d++) {
        void *h0 = fill(B * H, es, 12); memcpy(h[d], h0, B * H * es); free(h0);
        a[d].cache = cache[d];
    }
    rc |= FWD();
    for (int w = 0; w < 2; w++) {
        for (int d = 0; d < nd; d++) a[d].work = w ? work[d] : NULL;
        rc |= BWD();
    }
#undef FWD
#undef BWD
    for (int d = 0; d < nd; d++) {
        for (int k = 0; k < np; k++) { free(params[d][k]); free(grads[d][k]); }
        free(h[d]); free(c[d]); free(cache[d]); free(dh[d]); free(dc[d]); free(work[d]);
    }
    free(len); free(x); free(y); free(dy); free(dx);
    return rc;
}

/* Every normalization kernel on (N, H), out of place and in place. */
#define LN_CASES(T, SFX)                                                                     \
    static int ln_##SFX(int64_t N, int64_t H) {                                              \
        size_t n = (size_t)(N * H);                                                          \
        T *x = fill(n + 1, sizeof(T), 1), *r = fill(n + 1, sizeof(T), 2);                    \
        T *dy = fill(n + 1, sizeof(T), 3), *w = fill(H, sizeof(T), 4), *b = fill(H, sizeof(T), 5); \
        T *y = malloc((n + 1) * sizeof(T)), *s = malloc((n + 1) * sizeof(T));                \
        T *mean = malloc((N + 1) * sizeof(T)), *rstd = malloc((N + 1) * sizeof(T));          \
        T *dw = malloc(H * sizeof(T)), *db = malloc(H * sizeof(T));                          \
        int rc = 0;                                                                          \
        rc |= fastln_layer_norm_##SFX(y, mean, rstd, x, w, b, N, H, 1e-5);                   \
        rc |= fastln_layer_norm_##SFX(y, NULL, NULL, x, NULL, NULL, N, H, 1e-5);             \
        rc |= fastln_layer_norm_backward_##SFX(s, dw, db, dy, x, mean, rstd, w, N, H);       \
        rc |= fastln_layer_norm_backward_##SFX(s, dw, db, dy, x, mean, rstd, NULL, N, H);    \
        rc |= fastln_add_layer_norm_##SFX(y, s, mean, rstd, x, r, w, b, N, H, 1e-5);         \
        rc |= fastln_rms_norm_##SFX(y, rstd, x, w, N, H, 1e-6);                              \
        /* the general add: one residual row, an input bias; its backward with ds */         \
        rc |= fastln_add_norm_##SFX(1, y, s, NULL, rstd, x, r, 1, b, w, NULL, N, H, 1e-6);    \
        rc |= fastln_add_norm_##SFX(0, y, s, mean, rstd, x, r, N, b, w, b, N, H, 1e-5);      \
        rc |= fastln_add_norm_backward_##SFX(0, y, dw, db, w, dy, s, r, mean, rstd, w, N, H); \
        rc |= fastln_add_norm_backward_##SFX(1, dy, dw, NULL, b, dy, s, NULL, NULL, rstd, w, N, H); \
        if (N > 0) {   /* the same data as (N, H, 1), (1, N, H) and (1, H, N): channels first */ \
            rc |= fastln_layer_norm_channels_##SFX(y, mean, rstd, x, w, b, N, H, 1, 1e-5);   \
            rc |= fastln_layer_norm_channels_##SFX(y, NULL, NULL, x, NULL, NULL, 1, N, H, 1e-5); \
            rc |= fastln_layer_norm_channels_##SFX(x, mean, rstd, x, w, b, 1, H, N, 1e-5);   \
            rc |= fastln_rms_norm_channels_##SFX(y, NULL, x, NULL, 1, N, H, 1e-6);           \
            rc |= fastln_rms_norm_channels_##SFX(y, rstd, x, w, 1, H, N, 1e-6);              \
            rc |= fastln_layer_norm_channels_##SFX(y, mean, rstd, x, w, b, 1, H, N, 1e-5);   \
            rc |= fastln_layer_norm_channels_backward_##SFX(s, dw, db, dy, x, mean, rstd, w, 1, H, N); \
            rc |= fastln_rms_norm_channels_backward_##SFX(dy, dw, dy, x, rstd, NULL, 1, H, N); \
        }                                                                                    \
        rc |= fastln_rms_norm_backward_##SFX(s, dw, dy, x, rstd, w, N, H);                   \
        memcpy(y, x, n * sizeof(T));   /* in place: y is the input and the output */          \
        rc |= fastln_layer_norm_##SFX(y, mean, rstd, y, w, b, N, H, 1e-5);                   \
        rc |= fastln_layer_norm_backward_##SFX(dy, dw, db, dy, x, mean, rstd, w, N, H);      \
        rc |= fastln_rms_norm_##SFX(y, rstd, y, w, N, H, 1e-6);                              \
        free(x); free(r); free(dy); free(w); free(b); free(y); free(s);                      \
        free(mean); free(rstd); free(dw); free(db);                                          \
        return rc;                                                                           \
    }
LN_CASES(float, f32)
LN_CASES(double, f64)

/* The 16-bit storage kernels (kind FASTLN_F16 or FASTLN_BF16) on (N, H). */
static int ln_half(int kind, int64_t N, int64_t H) {
    size_t n = (size_t)(N * H);
    uint16_t *x = malloc((n + 1) * 2), *r = malloc((n + 1) * 2), *dy = malloc((n + 1) * 2);
    uint16_t *y = malloc((n + 1) * 2), *s = malloc((n + 1) * 2);
    float *xf = fill(n + 1, 4, 1), *w = fill(H, 4, 4), *b = fill(H, 4, 5);
    for (size_t i = 0; i <= n; i++) {   /* bit patterns of small values, both kinds */
        x[i] = (uint16_t)(0x3c00 + (i * 37) % 1024 - (kind == FASTLN_BF16 ? 0x0400 : 0));
        r[i] = (uint16_t)(x[i] ^ 0x8000);
        dy[i] = (uint16_t)(x[i] + 3);
    }
    float *mean = malloc((N + 1) * 4), *rstd = malloc((N + 1) * 4), *dw = malloc(H * 4), *db = malloc(H * 4);
    int rc = 0;
    rc |= fastln_layer_norm_half(kind, y, mean, rstd, x, w, b, N, H, 1e-5);
    rc |= fastln_layer_norm_half(kind, y, NULL, NULL, x, NULL, NULL, N, H, 1e-5);
    rc |= fastln_layer_norm_backward_half(kind, s, dw, db, dy, x, mean, rstd, w, N, H);
    rc |= fastln_add_layer_norm_half(kind, y, s, mean, rstd, x, r, w, b, N, H, 1e-5);
    rc |= fastln_add_norm_half(kind, 1, y, s, NULL, rstd, x, r, 1, b, w, NULL, N, H, 1e-6);
    rc |= fastln_add_norm_half(kind, 0, y, s, mean, rstd, x, r, N, b, w, b, N, H, 1e-5);
    rc |= fastln_rms_norm_half(kind, y, rstd, x, w, N, H, 1e-6);
    rc |= fastln_rms_norm_backward_half(kind, s, dw, dy, x, rstd, w, N, H);
    memcpy(y, x, n * 2);   /* in place */
    rc |= fastln_layer_norm_half(kind, y, mean, rstd, y, w, b, N, H, 1e-5);
    rc |= fastln_layer_norm_backward_half(kind, dy, dw, db, dy, x, mean, rstd, w, N, H);
    rc |= fastln_rms_norm_half(kind, y, rstd, y, w, N, H, 1e-6);
    free(x); free(r); free(dy); free(y); free(s); free(xf); free(w); free(b);
    free(mean); free(rstd); free(dw); free(db);
    return rc;
}

/* The cache from several threads: every block written whole, its contents
 * checked after a resize; returns 1 on a wrong byte. */
static int pool_run(void) {
    const size_t MiB = (size_t)1 << 20;
    const size_t sizes[] = {0, 1, 100, 4 * MiB - 1, 4 * MiB, 5 * MiB + 3, 9 * MiB, 33 * MiB};
    int bad = 0;
#pragma omp parallel for reduction(| : bad) schedule(static, 1)
    for (int it = 0; it < 96; it++) {
        size_t n = sizes[it % 8], m = sizes[(it * 5 + 3) % 8];
        if (it % 17 == 0) fastln_pool_set_limit(it % 2 ? 0 : 64 * MiB);
        unsigned char *p = it % 3 ? fastln_pool_alloc(n) : fastln_pool_calloc(n);
        if (!p) { bad = 1; continue; }
        if (it % 3 == 0 && n && (p[0] || p[n - 1])) bad = 1;   /* calloc: zeroed */
        memset(p, it & 0xff, n ? n : 1);
        unsigned char *q = fastln_pool_realloc(p, m);
        if (!q) { fastln_pool_free(p); bad = 1; continue; }
        size_t keep = n < m ? n : m;
        if (keep && (q[0] != (it & 0xff) || q[keep - 1] != (it & 0xff))) bad = 1;
        memset(q, 0x5a, m ? m : 1);
        fastln_pool_free(q);
    }
    fastln_pool_free(NULL);
    fastln_pool_set_limit(FASTLN_POOL_DEFAULT_LIMIT);
    fastln_pool_stats st;
    fastln_pool_get_stats(&st);
    if (st.bytes > st.limit || st.blocks > 8) bad = 1;
    fastln_pool_release();
    fastln_pool_get_stats(&st);
    return bad | (st.bytes != 0) | (st.blocks != 0);
}

int main(void) {
    const char *isas[] = {"generic", "avx2", "avx512"};
    int bad = 0, n = 0;
    for (int i = 0; i < 3; i++) {
        if (!fastln_isa_supported(isas[i])) continue;
        fastln_set_isa(isas[i]);
        /* the LN cells, then the plain RNN (tanh, relu), LSTM and GRU (both forms) */
        int cells[] = {0, 1, 2, 3, 8, 9, 10, 11, 11 | FASTLN_CELL_RESET_FIRST};
        for (int ci = 0; ci < 9; ci++)
            for (int f64 = 0; f64 < 2; f64++)
                for (int lens = 0; lens < 2; lens++) {
                    int64_t cfg[][4] = {{1, 1, 1, 1}, {5, 1, 3, 40}, {7, 3, 5, 37}, {3, 9, 2, 33}, {9, 34, 17, 64}, {2, 2, 300, 8}};
                    for (int q = 0; q < 6; q++) {
                        for (int nt = 1; nt <= 3; nt += 2) {
                            fastln_set_num_threads(nt);
                            bad |= run(cells[ci], cfg[q][0], cfg[q][1], cfg[q][2], cfg[q][3],
                                       f64, lens, (q + lens) % 3);
                            n++;
                        }
                    }
                }
    }
    for (int i = 0; i < 3; i++) {
        if (!fastln_isa_supported(isas[i])) continue;
        fastln_set_isa(isas[i]);
        int64_t cfg[][2] = {{0, 8}, {1, 1}, {1, 768}, {7, 4099}, {33, 64}, {300, 17}, {16, 1024}};
        for (int nt = 1; nt <= 3; nt += 2) {
            fastln_set_num_threads(nt);
            for (int q = 0; q < 7; q++) {
                bad |= ln_f32(cfg[q][0], cfg[q][1]) | ln_f64(cfg[q][0], cfg[q][1]);
                bad |= ln_half(FASTLN_F16, cfg[q][0], cfg[q][1]);
                bad |= ln_half(FASTLN_BF16, cfg[q][0], cfg[q][1]);
                n += 4;
            }
        }
        /* past the streaming thresholds (32 MiB forward, 16 MiB on AVX-512, 8
         * MiB backward); short rows of whole vectors (16-bit: an even number)
         * stream from registers (the ntw writer of src_c/isa/simd.h), with partial
         * lines at both ends */
        bad |= ln_f32(3100, 4096);
        bad |= ln_f32(65541, 64);
        bad |= ln_half(FASTLN_BF16, 6200, 4096);
        bad |= ln_half(FASTLN_BF16, 131083, 64);
        n += 4;
    }
    bad |= pool_run();
    n++;
    printf("%d runs, rc %d\n", n, bad);
    return bad;
}
