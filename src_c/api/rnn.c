/*
 * The entry points of the LN-RNN engine (fastln_rnn.h): argument checks,
 * weights copied into the layout the path reads, the thread count of a
 * layer, both directions of a bidirectional layer side by side, and
 * fastln_rnn_pack. The layer itself runs on the path in use (rnn/).
 */
#include <limits.h>
#include "api/internal.h"
#include "gemm/gemm.h"
#include "paths/table.h"
#include "rnn/rnn.h"
#if defined(_OPENMP) && (defined(__unix__) || defined(__APPLE__))
#include <pthread.h>
#define HAVE_PTHREADS 1
#else
#define HAVE_PTHREADS 0
#endif

/* ---- BLAS: none ---- */

/* The engine computes every product itself, in a fixed order (gemm/packed.h),
 * so that its results do not depend on a BLAS library or its kernels. The
 * hook stays for programs built against the earlier interface. */
void fastln_rnn_set_blas(fastln_sgemm_fn sgemm, fastln_dgemm_fn dgemm)
{
    (void)sgemm;
    (void)dgemm;
}

/* ---- entry points ---- */

/* The largest K of an int8 product (gemm/int8.h: its int32 sums stay exact). */
#define RNN_I8_MAX_K 65535

/* Sizes the engine takes (T * B, G and I within int); bfloat16 and
 * int8 weights only for a float forward without a cache. */
static int check_args(const fastln_rnn_args *a, int backward, int f32)
{
    fastln_rnn_layout L;
    if (!a || a->steps < 1 || a->batch < 1 || a->input < 1 || a->hidden < 1 ||
        fastln_rnn_layout_for(&L, a->cell, 1, 1, a->hidden))
        return FASTLN_EINVAL;
    int64_t big = a->steps * a->batch;
    if (big > INT_MAX || L.G > INT_MAX || a->input > INT_MAX) return FASTLN_EINVAL;
    if (backward ? !a->cache || !a->dy || !a->dh || !a->x
                 : !a->x || !a->y || !a->h)
        return FASTLN_EINVAL;
    if (L.cell == FASTLN_CELL_LSTM && !(backward ? a->dc : a->c)) return FASTLN_EINVAL;
    /* a projection: a plain LSTM's forward without a cache */
    if (a->proj < 0 || a->proj > INT_MAX ||
        (a->proj && (a->cell != (FASTLN_CELL_LSTM | FASTLN_CELL_PLAIN) || backward ||
                     a->cache || !a->params[3] ||
                     (a->wtype == FASTLN_RNN_W_INT8 &&
                      (!a->scale_hr || a->proj > RNN_I8_MAX_K)))))
        return FASTLN_EINVAL;
    const int64_t width = a->proj ? a->proj : a->hidden;   /* of h and y */
    if (a->ldy < 0 || (a->ldy > 0 && a->ldy < width)) return FASTLN_EINVAL;
    if (a->wtype != FASTLN_RNN_W_SAME &&
        ((a->wtype != FASTLN_RNN_W_BF16 && a->wtype != FASTLN_RNN_W_INT8) || backward || !f32 ||
         a->cache))
        return FASTLN_EINVAL;
    /* int8: the scales, and K < 2^16 so that no int32 sum can overflow */
    if (a->wtype == FASTLN_RNN_W_INT8 &&
        (!a->scales[0] || !a->scales[1] || a->input > RNN_I8_MAX_K || a->hidden > RNN_I8_MAX_K))
        return FASTLN_EINVAL;
    if (a->transposed & ~(FASTLN_RNN_W_IH_T | FASTLN_RNN_W_HH_T | FASTLN_RNN_W_HR_T) ||
        ((a->transposed & FASTLN_RNN_W_HR_T) && !a->proj) ||
        (a->transposed && a->wtype != FASTLN_RNN_W_SAME))
        return FASTLN_EINVAL;
    return FASTLN_OK;
}

/* Whether this call reads transposed weights where they are, both matrices
 * transposed: a forward where every block of columns the product reads is a
 * multiple of the panels' width (FASTLN_NR floats, FASTLN_NR_F64 doubles;
 * rnn/pack.h reads or packs them); a backward over a batch, which packs W_hh
 * from W_hh^T and takes dx = dA W_ih from W_ih^T (rnn/products.h,
 * rnn/backward.h: the same panels, so the same results). A backward of one
 * sequence takes axpys over rows of W_hh, and a copy. A projected LSTM's
 * forward reads W_hr^T too, whose product has P columns. */
static int reads_transposed(const fastln_rnn_args *a, int backward, int f32)
{
    fastln_rnn_layout L;
    const int64_t nr = f32 ? FASTLN_NR : FASTLN_NR_F64;
    const int all = FASTLN_RNN_W_IH_T | FASTLN_RNN_W_HH_T | (a->proj ? FASTLN_RNN_W_HR_T : 0);
    if (a->transposed != all || fastln_rnn_layout_for(&L, a->cell, 1, 1, a->hidden))
        return 0;
    if (backward) return a->batch > 1;
    return L.G % nr == 0 && !(L.reset_first && a->hidden % nr) && a->proj % nr == 0;
}

/* dst (N, K) = src^T, src (K, N) row-major, float (f32) or double, in
 * blocks of 32 x 32 that stay in L1 for both sides. */
static void transpose(void *dst, const void *src, int64_t K, int64_t N, int f32)
{
    for (int64_t k0 = 0; k0 < K; k0 += 32)
        for (int64_t n0 = 0; n0 < N; n0 += 32) {
            int64_t k1 = k0 + 32 < K ? k0 + 32 : K, n1 = n0 + 32 < N ? n0 + 32 : N;
            for (int64_t n = n0; n < n1; n++)
                for (int64_t k = k0; k < k1; k++) {
                    if (f32) ((float *)dst)[n * K + k] = ((const float *)src)[k * N + n];
                    else ((double *)dst)[n * K + k] = ((const double *)src)[k * N + n];
                }
        }
}

/* b = a, with the transposed weight matrices of a copied into the plain
 * layout where this call does not read them in place; *own holds the
 * copies (NULL: none), for the caller to free. */
static int plain_weights(fastln_rnn_args *b, const fastln_rnn_args *a, int backward, int f32,
                         void **own)
{
    *b = *a;
    *own = NULL;
    if (!a->transposed || reads_transposed(a, backward, f32)) return FASTLN_OK;
    fastln_rnn_layout L;
    fastln_rnn_layout_for(&L, a->cell, 1, 1, a->hidden);   /* checked: a valid cell */
    const size_t es = f32 ? sizeof(float) : sizeof(double);
    /* W_ih^T (I, G), W_hh^T (K, G), W_hr^T (H, P): params 0, 1, 3 */
    const int64_t P = a->proj, K[3] = {a->input, P ? P : a->hidden, a->hidden};
    const int64_t N[3] = {L.G, L.G, P};
    const int flag[3] = {FASTLN_RNN_W_IH_T, FASTLN_RNN_W_HH_T, FASTLN_RNN_W_HR_T};
    char *buf = (char *)malloc((size_t)(N[0] * K[0] + N[1] * K[1] + N[2] * K[2] + 1) * es);
    if (!buf) return FASTLN_ENOMEM;
    *own = buf;
    char *w = buf;
    for (int i = 0; i < 3; w += (size_t)(N[i] * K[i]) * es, i++) {
        if (!(a->transposed & flag[i])) continue;
        transpose(w, a->params[i < 2 ? i : 3], K[i], N[i], f32);
        b->params[i < 2 ? i : 3] = w;
    }
    b->transposed = 0;
    return FASTLN_OK;
}

/* Threads for a layer: one below the per-step work threshold, where the two
 * barriers of a step would cost more than a second thread saves; a single
 * sequence (B = 1) gains from splitting the weights of its matrix-vector
 * product over two L2 caches once they pass 128 KiB, given enough steps to
 * pay for the parallel region. */
static int rnn_threads(const fastln_rnn_args *a)
{
    fastln_rnn_layout L;
    fastln_rnn_layout_for(&L, a->cell, 1, 1, a->hidden);   /* checked: a valid cell */
    int64_t work = a->batch * L.G * a->hidden;
    if (work < (1 << 17) && !(a->batch == 1 && a->steps >= 16 && work >= (1 << 15)))
        return 1;
    return fastln_get_num_threads();
}

#define ENTRY(name, fn, backward, f32)                                 \
    int name(const fastln_rnn_args *a)                                 \
    {                                                                  \
        fastln_rnn_args b;                                             \
        void *own = NULL;                                              \
        int rc = check_args(a, backward, f32);                         \
        if (!rc) rc = plain_weights(&b, a, backward, f32, &own);       \
        if (!rc) rc = fastln_kernels()->fn(&b, rnn_threads(&b));       \
        free(own);                                                     \
        return rc;                                                     \
    }
ENTRY(fastln_rnn_forward_f32, rnn_fwd_f32, 0, 1)
ENTRY(fastln_rnn_forward_f64, rnn_fwd_f64, 0, 0)
ENTRY(fastln_rnn_backward_f32, rnn_bwd_f32, 1, 1)
ENTRY(fastln_rnn_backward_f64, rnn_bwd_f64, 1, 0)

static int pack_args_ok(int cell, int wtype, int64_t I, int64_t H, int64_t P)
{
    fastln_rnn_layout L;
    return I >= 1 && H >= 1 && I <= INT_MAX && !fastln_rnn_layout_for(&L, cell, 1, 1, H) &&
           L.G <= INT_MAX && P >= 0 && P <= INT_MAX &&
           (!P || cell == (FASTLN_CELL_LSTM | FASTLN_CELL_PLAIN)) &&
           (wtype == FASTLN_RNN_W_SAME || wtype == FASTLN_RNN_W_BF16 ||
            (wtype == FASTLN_RNN_W_INT8 && I <= RNN_I8_MAX_K && H <= RNN_I8_MAX_K &&
             P <= RNN_I8_MAX_K));
}

const char *fastln_rnn_bf16_products(void)
{
    if (strcmp(fastln_get_isa(), "avx512") != 0 || !fastln_cpu_has_avx512bf16()) return "float32";
    return fastln_cpu_has_amx_bf16() ? "AMX" : "AVX512-BF16";
}

const char *fastln_rnn_int8_products(void)
{
    const char *isa = fastln_get_isa();
    if (strcmp(isa, "avx512") == 0)
        return fastln_cpu_has_avx512vnni() ? "AVX512-VNNI" : "AVX-512 (VPMADDWD)";
    return strcmp(isa, "avx2") == 0 ? "AVX2 (VPMADDWD)" : "C";
}

int64_t fastln_rnn_packed_size_proj(int cell, int wtype, int64_t I, int64_t H, int64_t P)
{
    if (!pack_args_ok(cell, wtype, I, H, P)) return -1;
    return fastln_kernels()->rnn_pack(NULL, 0, cell, wtype, I, H, P, NULL, NULL, NULL, 1);
}

int fastln_rnn_pack_proj(void *out, int64_t size, int cell, int wtype, int64_t I, int64_t H,
                         int64_t P, const void *w_ih, const void *w_hh, const void *w_hr)
{
    if (!out || !w_ih || !w_hh || (P && !w_hr) || !pack_args_ok(cell, wtype, I, H, P))
        return FASTLN_EINVAL;
    int64_t n = fastln_kernels()->rnn_pack(out, size, cell, wtype, I, H, P, w_ih, w_hh, w_hr,
                                           fastln_get_num_threads());
    return n > 0 ? FASTLN_OK : n == 0 ? FASTLN_EINVAL : (int)-n;
}

int64_t fastln_rnn_packed_size(int cell, int wtype, int64_t I, int64_t H)
{
    return fastln_rnn_packed_size_proj(cell, wtype, I, H, 0);
}

int fastln_rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t I, int64_t H,
                    const void *w_ih, const void *w_hh)
{
    return fastln_rnn_pack_proj(out, size, cell, wtype, I, H, 0, w_ih, w_hh, NULL);
}

/* ---- both directions of a layer ---- */

typedef int (*layer_fn)(const fastln_rnn_args *, int);

typedef struct {
    layer_fn fn;
    fastln_rnn_args args;   /* a copy: the second direction polls stop, not interrupt() */
    int nt, rc;
    int stop;               /* set when the first direction was interrupted */
} direction_job;

#if HAVE_PTHREADS
static int stop_requested(void *ctx) { return __atomic_load_n((int *)ctx, __ATOMIC_ACQUIRE); }
#endif

static void *run_direction(void *p)
{
    direction_job *j = (direction_job *)p;
    j->rc = j->fn(&j->args, j->nt);
    return NULL;
}

/* Whether to run the two directions side by side: when there are threads
 * for both and the layer is large enough to pay for starting a thread. Each
 * direction then avoids half of the per-step barriers and keeps its own
 * weights in its own cores' caches. */
#if HAVE_PTHREADS
static int concurrent(const fastln_rnn_args *a, int nt)
{
    fastln_rnn_layout L;
    fastln_rnn_layout_for(&L, a->cell, 1, 1, a->hidden);
    int64_t work = a->steps * a->batch * L.G * (a->input + a->hidden);
    return nt >= 2 && work >= (1 << 21);
}
#endif

/* Runs fn on a[0] and a[1] (dx1: a[1]'s dx), side by side or in turn. */
static int run_pair(layer_fn fn, const fastln_rnn_args a[2], void *dx1)
{
    direction_job j = {fn, a[1], 1, FASTLN_OK, 0};
    j.args.dx = dx1;
#if HAVE_PTHREADS
    int nt = fastln_get_num_threads();
    if (concurrent(a, nt)) {
        int n0 = rnn_threads(a) > 1 ? nt / 2 : 1;
        j.nt = rnn_threads(&a[1]) > 1 ? nt - nt / 2 : 1;
        j.args.interrupt = stop_requested;
        j.args.interrupt_ctx = &j.stop;
        pthread_t th;
        if (pthread_create(&th, NULL, run_direction, &j) == 0) {
            int rc = fn(a, n0);
            if (rc == FASTLN_EINTR) __atomic_store_n(&j.stop, 1, __ATOMIC_RELEASE);
            pthread_join(th, NULL);
            return rc ? rc : j.rc;
        }
        j.args.interrupt = a[1].interrupt;   /* no thread: in turn */
        j.args.interrupt_ctx = a[1].interrupt_ctx;
    }
#endif
    int rc = fn(a, rnn_threads(a));
    if (rc) return rc;
    j.nt = rnn_threads(&a[1]);
    run_direction(&j);
    return j.rc;
}

static int check_pair(const fastln_rnn_args a[2], int backward, int f32)
{
    if (!a) return FASTLN_EINVAL;
    int rc = check_args(&a[0], backward, f32);
    if (!rc) rc = check_args(&a[1], backward, f32);
    if (!rc && (a[0].steps != a[1].steps || a[0].batch != a[1].batch ||
                a[0].input != a[1].input))
        rc = FASTLN_EINVAL;
    return rc;
}

/* dst += src (n elements of float or double) on fastln's threads */
static void add_into(void *dst, const void *src, int64_t n, int f32)
{
    int nt = n >= (1 << 16) ? fastln_get_num_threads() : 1;
    (void)nt;   /* unused in a serial build */
    if (f32) {
        float *d = (float *)dst;
        const float *s = (const float *)src;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    } else {
        double *d = (double *)dst;
        const double *s = (const double *)src;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    }
}

/* run_pair on a with each direction's weights in a layout it reads */
static int run_pair_plain(layer_fn fn, const fastln_rnn_args a[2], void *dx1, int backward,
                          int f32)
{
    fastln_rnn_args b[2];
    void *own[2] = {NULL, NULL};
    int rc = plain_weights(&b[0], &a[0], backward, f32, &own[0]);
    if (!rc) rc = plain_weights(&b[1], &a[1], backward, f32, &own[1]);
    if (!rc) rc = run_pair(fn, b, dx1);
    free(own[0]);
    free(own[1]);
    return rc;
}

static int forward2(layer_fn fn, const fastln_rnn_args a[2], int f32)
{
    int rc = check_pair(a, 0, f32);
    return rc ? rc : run_pair_plain(fn, a, a[1].dx, 0, f32);
}

/* a[1]'s input gradient goes to scratch, then is added to a[0]'s */
static int backward2(layer_fn fn, const fastln_rnn_args a[2], int f32)
{
    int rc = check_pair(a, 1, f32);
    if (rc) return rc;
    int64_t n = a[0].steps * a[0].batch * a[0].input;
    void *dx1 = NULL;
    if (a[0].dx && !(dx1 = malloc((size_t)n * (f32 ? sizeof(float) : sizeof(double)))))
        return FASTLN_ENOMEM;
    rc = run_pair_plain(fn, a, dx1, 1, f32);
    if (!rc && dx1) add_into(a[0].dx, dx1, n, f32);
    free(dx1);
    return rc;
}

int fastln_rnn_forward2_f32(const fastln_rnn_args a[2])
{
    return forward2(fastln_kernels()->rnn_fwd_f32, a, 1);
}

int fastln_rnn_forward2_f64(const fastln_rnn_args a[2])
{
    return forward2(fastln_kernels()->rnn_fwd_f64, a, 0);
}

int fastln_rnn_backward2_f32(const fastln_rnn_args a[2])
{
    return backward2(fastln_kernels()->rnn_bwd_f32, a, 1);
}

int fastln_rnn_backward2_f64(const fastln_rnn_args a[2])
{
    return backward2(fastln_kernels()->rnn_bwd_f64, a, 0);
}
