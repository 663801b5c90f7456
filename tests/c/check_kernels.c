/* Checks the results of every function of fastln's C API against plain
 * double-precision loops written here (ctest runs it natively: CMakeLists.txt;
 * tests/test_cross.py builds it for aarch64 and runs it under qemu-user):
 *  - fastln.h: LayerNorm, RMSNorm and add + LayerNorm, forward and backward,
 *    on float, double, float16 and bfloat16 storage, with and without weight
 *    and bias, in place and not; H = 1, 7, 16, 33, 300, 1024 and N = 1, 5, 67;
 *  - fastln_rnn.h, float and double:
 *    - every cell (LN-RNN tanh/relu, LN-LSTM, LN-GRU, plain RNN tanh/relu,
 *      plain LSTM, plain GRU and its RESET_FIRST form), odd sizes, B = 1,
 *      lengths: forward with and without a cache against a loop over time;
 *      backward (every gradient, dx and the initial state's, with and without
 *      scratch) against central differences of that loop's loss
 *      sum(dy y) + sum(dh h_T) + sum(dc c_T);
 *    - reverse = 1 (LN-RNN, LN-LSTM, LN-GRU, plain LSTM, both plain GRUs; B = 1
 *      with and without lengths, and a padded batch) the same way, against the
 *      loop run over each sequence's own times from its last back to its first;
 *    - both directions at once (fastln_rnn_forward2_* and backward2_*, y and dy
 *      one (T, B, 2H) array, ldy = 2H; LN-LSTM and plain GRU): y against the
 *      two loops side by side, each direction's final state, and each one's
 *      gradients and dx (the sum of both directions') against central
 *      differences of the sum of the two losses; and a layer large enough for
 *      threads within each direction and, on x86, for the directions to run
 *      side by side, its gradients against the single-direction calls.
 * Each ISA path this CPU runs, on 1 and 3 threads (the RNN cases' loops and
 * central differences are computed once for all paths). No BLAS is set: the RNN engine's products
 * take its own C loop.
 *
 * An output passes when max|got - ref| <= tol * max(1, max|ref|). Outputs are
 * NaN-filled first, so an element a kernel leaves unwritten fails. Prints the
 * mismatches and a summary; exits 1 on any mismatch or error code. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fastln_rnn.h"

#define EPS 1e-5
#define RMS_EPS 1e-6
#define NELEM(a) (sizeof (a) / sizeof *(a))

enum { F32, F64, F16, BF16 };
static const char *DT_NAME[] = {"float32", "float64", "float16", "bfloat16"};
/* tolerance of an output stored in each type: float and double results of
 * float and double math; a 16-bit result is float math rounded once */
static const double TOL[] = {3e-5, 1e-11, 0x1p-10, 0x1p-7};

/* the paths checked: each ISA this CPU runs, on 1 and 3 threads */
static struct { const char *isa; int threads, failures; } paths[6];
static int npaths, path;   /* path: the one in use */

static void use_path(int i) {
    path = i;
    fastln_set_isa(paths[i].isa);
    fastln_set_num_threads(paths[i].threads);
}

static int checks, failures;
static double worst;       /* the largest error / allowed error of a passing check */
static char worst_at[300];
static char where[200];   /* the case being checked, for messages */

/* ---- storage ---- */

static size_t size_of(int t) { return t == F64 ? 8 : t == F32 ? 4 : 2; }

static uint16_t to_f16(double v) {   /* nearest even; |v| < 65504 */
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    v = fabs(v);
    if (v < 0x1p-14) return sign | (uint16_t)nearbyint(v * 0x1p24);   /* subnormal */
    int e;
    frexp(v, &e);                                    /* v = f 2^e, f in [0.5, 1) */
    int m = (int)nearbyint(ldexp(v, 11 - e));        /* 1024 .. 2048 */
    if (m == 2048) { m = 1024; e++; }
    return sign | (uint16_t)((e + 14) << 10) | (uint16_t)(m - 1024);
}

static double from_f16(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? NAN : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

static uint16_t to_bf16(double v) {   /* nearest even */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static double from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double get(const void *p, int t, size_t i) {
    switch (t) {
    case F32: return ((const float *)p)[i];
    case F64: return ((const double *)p)[i];
    case F16: return from_f16(((const uint16_t *)p)[i]);
    default: return from_bf16(((const uint16_t *)p)[i]);
    }
}

static void put(void *p, int t, size_t i, double v) {
    switch (t) {
    case F32: ((float *)p)[i] = (float)v; break;
    case F64: ((double *)p)[i] = v; break;
    case F16: ((uint16_t *)p)[i] = to_f16(v); break;
    default: ((uint16_t *)p)[i] = to_bf16(v); break;
    }
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static double urand(void) {   /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (double)(rng_state >> 11) * 0x1p-52 - 1.0;
}

/* n doubles: center + spread * U(-1, 1) */
static double *randv(size_t n, double center, double spread) {
    double *d = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = center + spread * urand();
    return d;
}

/* d stored as type t; d then holds the stored values exactly */
static void *store(int t, double *d, size_t n) {
    void *p = xmalloc(n * size_of(t));
    for (size_t i = 0; i < n; i++) {
        put(p, t, i, d[i]);
        d[i] = get(p, t, i);
    }
    return p;
}

static void fill_nan(void *p, int t, size_t n) {
    for (size_t i = 0; i < n; i++) put(p, t, i, NAN);
}

static void *nans(int t, size_t n) {   /* an output buffer */
    void *p = xmalloc(n * size_of(t));
    fill_nan(p, t, n);
    return p;
}

static void load(double *d, const void *p, int t, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = get(p, t, i);
}

/* got (type t) against ref within tol * max(1, max|ref|) */
static void expect(const char *what, const void *got, int t, const double *ref, size_t n,
                   double tol) {
    double scale = 1.0, err = 0.0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs(get(got, t, i) - ref[i]);
        err = e <= err ? err : isnan(e) ? INFINITY : e;
    }
    checks++;
    if (err <= tol * scale && err > worst * tol * scale) {
        worst = err / (tol * scale);
        snprintf(worst_at, sizeof worst_at, "%s: %s", where, what);
    }
    if (!(err <= tol * scale)) {
        failures++;
        paths[path].failures++;
        if (failures <= 40)
            printf("MISMATCH %s, %d thread(s), %s: %s: max|got - ref| = %.3g > %.3g (max|ref| %.3g)\n",
                   paths[path].isa, paths[path].threads, where, what, err, tol * scale, scale);
    }
}

static void expect_ok(int rc, const char *what) {
    checks++;
    if (rc != FASTLN_OK) {
        failures++;
        paths[path].failures++;
        printf("ERROR %s, %d thread(s), %s: %s returned %d\n", paths[path].isa,
               paths[path].threads, where, what, rc);
    }
}

/* ---- the normalization kernels ---- */

static void ref_ln(double *y, double *mean, double *rstd, const double *x, const double *w,
                   const double *b, int64_t N, int64_t H, double eps) {
    for (int64_t i = 0; i < N; i++) {
        const double *xr = x + i * H;
        double m = 0, v = 0;
        for (int64_t j = 0; j < H; j++) m += xr[j];
        m /= H;
        for (int64_t j = 0; j < H; j++) v += (xr[j] - m) * (xr[j] - m);
        double r = 1 / sqrt(v / H + eps);
        for (int64_t j = 0; j < H; j++)
            y[i * H + j] = (xr[j] - m) * r * (w ? w[j] : 1) + (b ? b[j] : 0);
        mean[i] = m;
        rstd[i] = r;
    }
}

/* fastln.h's formula: xhat = (x - m) rstd with m = mean + mean(x - mean) */
static void ref_ln_bwd(double *dx, double *dw, double *db, const double *dy, const double *x,
                       const double *mean, const double *rstd, const double *w, int64_t N,
                       int64_t H) {
    for (int64_t j = 0; j < H; j++) dw[j] = db[j] = 0;
    for (int64_t i = 0; i < N; i++) {
        const double *xr = x + i * H, *dyr = dy + i * H;
        double m = 0, r = rstd[i], sg = 0, sgx = 0;
        for (int64_t j = 0; j < H; j++) m += xr[j] - mean[i];
        m = mean[i] + m / H;
        for (int64_t j = 0; j < H; j++) {
            double g = dyr[j] * (w ? w[j] : 1), xh = (xr[j] - m) * r;
            sg += g;
            sgx += g * xh;
            dw[j] += dyr[j] * xh;
            db[j] += dyr[j];
        }
        for (int64_t j = 0; j < H; j++) {
            double g = dyr[j] * (w ? w[j] : 1), xh = (xr[j] - m) * r;
            dx[i * H + j] = r * (g - sg / H - xh * sgx / H);
        }
    }
}

static void ref_rms(double *y, double *rstd, const double *x, const double *w, int64_t N,
                    int64_t H, double eps) {
    for (int64_t i = 0; i < N; i++) {
        double ms = 0;
        for (int64_t j = 0; j < H; j++) ms += x[i * H + j] * x[i * H + j];
        rstd[i] = 1 / sqrt(ms / H + eps);
        for (int64_t j = 0; j < H; j++) y[i * H + j] = x[i * H + j] * rstd[i] * (w ? w[j] : 1);
    }
}

static void ref_rms_bwd(double *dx, double *dw, const double *dy, const double *x,
                        const double *rstd, const double *w, int64_t N, int64_t H) {
    for (int64_t j = 0; j < H; j++) dw[j] = 0;
    for (int64_t i = 0; i < N; i++) {
        double r = rstd[i], sgx = 0;
        for (int64_t j = 0; j < H; j++) {
            double xh = x[i * H + j] * r;
            sgx += dy[i * H + j] * (w ? w[j] : 1) * xh;
            dw[j] += dy[i * H + j] * xh;
        }
        for (int64_t j = 0; j < H; j++) {
            double xh = x[i * H + j] * r;
            dx[i * H + j] = r * (dy[i * H + j] * (w ? w[j] : 1) - xh * sgx / H);
        }
    }
}

/* the C API by storage type; mean, rstd, weight, bias and their gradients
 * are double for F64 and float otherwise */
static int half_kind(int dt) { return dt == F16 ? FASTLN_F16 : FASTLN_BF16; }

static int k_ln(int dt, void *y, void *mean, void *rstd, const void *x, const void *w,
                const void *b, int64_t N, int64_t H) {
    if (dt == F32) return fastln_layer_norm_f32(y, mean, rstd, x, w, b, N, H, EPS);
    if (dt == F64) return fastln_layer_norm_f64(y, mean, rstd, x, w, b, N, H, EPS);
    return fastln_layer_norm_half(half_kind(dt), y, mean, rstd, x, w, b, N, H, EPS);
}

static int k_ln_bwd(int dt, void *dx, void *dw, void *db, const void *dy, const void *x,
                    const void *mean, const void *rstd, const void *w, int64_t N, int64_t H) {
    if (dt == F32) return fastln_layer_norm_backward_f32(dx, dw, db, dy, x, mean, rstd, w, N, H);
    if (dt == F64) return fastln_layer_norm_backward_f64(dx, dw, db, dy, x, mean, rstd, w, N, H);
    return fastln_layer_norm_backward_half(half_kind(dt), dx, dw, db, dy, x, mean, rstd, w, N, H);
}

static int k_add_ln(int dt, void *y, void *s, void *mean, void *rstd, const void *x,
                    const void *r, const void *w, const void *b, int64_t N, int64_t H) {
    if (dt == F32) return fastln_add_layer_norm_f32(y, s, mean, rstd, x, r, w, b, N, H, EPS);
    if (dt == F64) return fastln_add_layer_norm_f64(y, s, mean, rstd, x, r, w, b, N, H, EPS);
    return fastln_add_layer_norm_half(half_kind(dt), y, s, mean, rstd, x, r, w, b, N, H, EPS);
}

static int k_rms(int dt, void *y, void *rstd, const void *x, const void *w, int64_t N,
                 int64_t H) {
    if (dt == F32) return fastln_rms_norm_f32(y, rstd, x, w, N, H, RMS_EPS);
    if (dt == F64) return fastln_rms_norm_f64(y, rstd, x, w, N, H, RMS_EPS);
    return fastln_rms_norm_half(half_kind(dt), y, rstd, x, w, N, H, RMS_EPS);
}

static int k_rms_bwd(int dt, void *dx, void *dw, const void *dy, const void *x,
                     const void *rstd, const void *w, int64_t N, int64_t H) {
    if (dt == F32) return fastln_rms_norm_backward_f32(dx, dw, dy, x, rstd, w, N, H);
    if (dt == F64) return fastln_rms_norm_backward_f64(dx, dw, dy, x, rstd, w, N, H);
    return fastln_rms_norm_backward_half(half_kind(dt), dx, dw, dy, x, rstd, w, N, H);
}

/* the general add as RMSNorm, one residual row (r's first), input bias bi */
static int k_add_rms(int dt, void *y, void *s, void *rstd, const void *x, const void *r,
                     const void *bi, const void *w, int64_t N, int64_t H) {
    if (dt == F32)
        return fastln_add_norm_f32(1, y, s, NULL, rstd, x, r, 1, bi, w, NULL, N, H, RMS_EPS);
    if (dt == F64)
        return fastln_add_norm_f64(1, y, s, NULL, rstd, x, r, 1, bi, w, NULL, N, H, RMS_EPS);
    return fastln_add_norm_half(half_kind(dt), 1, y, s, NULL, rstd, x, r, 1, bi, w, NULL, N, H,
                                RMS_EPS);
}

/* Every normalization kernel on (N, H) of storage dt; weighted = 0 passes
 * NULL weight and bias. */
static void check_norm(int dt, int64_t N, int64_t H, int weighted) {
    int pt = dt == F64 ? F64 : F32;
    double to = TOL[dt], tp = TOL[pt];
    size_t n = (size_t)(N * H), nb = n * size_of(dt);
    double *x = randv(n, 0.5, 2.0), *r = randv(n, -0.3, 1.0), *dy = randv(n, 0.1, 1.0);
    double *w = randv(H, 1.0, 0.3), *b = randv(H, 0.0, 0.3);
    void *X = store(dt, x, n), *R = store(dt, r, n), *DY = store(dt, dy, n);
    void *W = store(pt, w, H), *B = store(pt, b, H);
    const double *wr = weighted ? w : NULL, *br = weighted ? b : NULL;
    const void *Wk = weighted ? W : NULL, *Bk = weighted ? B : NULL;
    double *y = randv(n, 0, 0), *s = randv(n, 0, 0), *dx = randv(n, 0, 0);
    double *mean = randv(N, 0, 0), *rstd = randv(N, 0, 0), *dw = randv(H, 0, 0), *db = randv(H, 0, 0);
    void *Y = nans(dt, n), *S = nans(dt, n), *DX = nans(dt, n);
    void *MEAN = nans(pt, N), *RSTD = nans(pt, N), *DW = nans(pt, H), *DB = nans(pt, H);
    snprintf(where, sizeof where, "%s N=%lld H=%lld%s", DT_NAME[dt], (long long)N, (long long)H,
             weighted ? "" : " no weight/bias");

    ref_ln(y, mean, rstd, x, wr, br, N, H, EPS);
    expect_ok(k_ln(dt, Y, MEAN, RSTD, X, Wk, Bk, N, H), "layer_norm");
    expect("layer_norm y", Y, dt, y, n, to);
    expect("layer_norm mean", MEAN, pt, mean, N, tp);
    expect("layer_norm rstd", RSTD, pt, rstd, N, tp);
    memcpy(Y, X, nb);
    expect_ok(k_ln(dt, Y, NULL, NULL, Y, Wk, Bk, N, H), "layer_norm in place");
    expect("layer_norm in place y", Y, dt, y, n, to);

    load(mean, MEAN, pt, N);   /* the backward takes the forward's stats */
    load(rstd, RSTD, pt, N);
    ref_ln_bwd(dx, dw, db, dy, x, mean, rstd, wr, N, H);
    expect_ok(k_ln_bwd(dt, DX, DW, DB, DY, X, MEAN, RSTD, Wk, N, H), "layer_norm_backward");
    expect("layer_norm_backward dx", DX, dt, dx, n, to);
    expect("layer_norm_backward dweight", DW, pt, dw, H, tp);
    expect("layer_norm_backward dbias", DB, pt, db, H, tp);
    memcpy(DX, DY, nb);
    expect_ok(k_ln_bwd(dt, DX, DW, DB, DX, X, MEAN, RSTD, Wk, N, H), "layer_norm_backward in place");
    expect("layer_norm_backward in place dx", DX, dt, dx, n, to);

    for (size_t i = 0; i < n; i++) s[i] = x[i] + r[i];
    ref_ln(y, mean, rstd, s, wr, br, N, H, EPS);
    expect_ok(k_add_ln(dt, Y, S, MEAN, RSTD, X, R, Wk, Bk, N, H), "add_layer_norm");
    expect("add_layer_norm y", Y, dt, y, n, to);
    expect("add_layer_norm s", S, dt, s, n, to);
    expect("add_layer_norm mean", MEAN, pt, mean, N, tp);
    expect("add_layer_norm rstd", RSTD, pt, rstd, N, tp);

    ref_rms(y, rstd, x, wr, N, H, RMS_EPS);
    expect_ok(k_rms(dt, Y, RSTD, X, Wk, N, H), "rms_norm");
    expect("rms_norm y", Y, dt, y, n, to);
    expect("rms_norm rstd", RSTD, pt, rstd, N, tp);
    memcpy(Y, X, nb);
    expect_ok(k_rms(dt, Y, RSTD, Y, Wk, N, H), "rms_norm in place");
    expect("rms_norm in place y", Y, dt, y, n, to);

    load(rstd, RSTD, pt, N);
    ref_rms_bwd(dx, dw, dy, x, rstd, wr, N, H);
    expect_ok(k_rms_bwd(dt, DX, DW, DY, X, RSTD, Wk, N, H), "rms_norm_backward");
    expect("rms_norm_backward dx", DX, dt, dx, n, to);
    expect("rms_norm_backward dweight", DW, pt, dw, H, tp);

    /* the general add (RMSNorm of x + r[0] + b), and its backward with ds = r */
    for (size_t i = 0; i < n; i++) s[i] = x[i] + r[i % H] + b[i % H];
    ref_rms(y, rstd, s, wr, N, H, RMS_EPS);
    expect_ok(k_add_rms(dt, Y, S, RSTD, X, R, B, Wk, N, H), "add_rms_norm");
    expect("add_rms_norm y", Y, dt, y, n, to);
    expect("add_rms_norm s", S, dt, s, n, to);
    expect("add_rms_norm rstd", RSTD, pt, rstd, N, tp);
    if (dt == F32 || dt == F64) {
        double *di = randv(H, 0, 0);
        void *DI = nans(pt, H);
        load(s, S, dt, n);
        load(rstd, RSTD, pt, N);
        ref_rms_bwd(dx, dw, dy, s, rstd, wr, N, H);
        for (int64_t j = 0; j < H; j++) di[j] = 0;
        for (size_t i = 0; i < n; i++) {
            dx[i] += r[i];
            di[i % H] += dx[i];
        }
        expect_ok(dt == F32 ? fastln_add_norm_backward_f32(1, DX, DW, NULL, DI, DY, S, R, NULL,
                                                           RSTD, Wk, N, H)
                            : fastln_add_norm_backward_f64(1, DX, DW, NULL, DI, DY, S, R, NULL,
                                                           RSTD, Wk, N, H),
                  "add_rms_norm_backward");
        expect("add_rms_norm_backward dsum", DX, dt, dx, n, to);
        expect("add_rms_norm_backward dweight", DW, pt, dw, H, tp);
        expect("add_rms_norm_backward dinput_bias", DI, pt, di, H, tp);
        free(di);
        free(DI);
    }

    void *all[] = {x, r, dy, w, b, X, R, DY, W, B, y, s, dx, mean, rstd, dw, db,
                   Y, S, DX, MEAN, RSTD, DW, DB};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* ---- the RNN engine ---- */

typedef struct {
    int cell, base, plain, reset_first, lstm, gru, np;
    int64_t T, B, I, H, G, size[10];
} rnn_case;

static rnn_case rnn_shape(int cell, int64_t T, int64_t B, int64_t I, int64_t H) {
    rnn_case c;
    memset(&c, 0, sizeof c);
    c.cell = cell; c.T = T; c.B = B; c.I = I; c.H = H;
    c.base = cell & ~(FASTLN_CELL_PLAIN | FASTLN_CELL_RESET_FIRST);
    c.plain = (cell & FASTLN_CELL_PLAIN) != 0;
    c.reset_first = (cell & FASTLN_CELL_RESET_FIRST) != 0;
    c.lstm = c.base == FASTLN_CELL_LSTM;
    c.gru = c.base == FASTLN_CELL_GRU;
    c.G = (c.lstm ? 4 : c.gru ? 3 : 1) * H;
    int64_t G = c.G;
    /* W_ih, W_hh, then the cell's vectors (fastln_rnn.h's legend) */
    int64_t lstm[] = {G * I, G * H, G, G, G, G, G, H, H};
    int64_t gru[] = {G * I, G * H, 2 * H, 2 * H, 2 * H, 2 * H, H, H, H, H};
    int64_t rnn[] = {G * I, G * H, H, H};
    int64_t plain[] = {G * I, G * H, G, H};   /* bias, and the plain GRU's bias_hn */
    const int64_t *s = c.plain ? plain : c.lstm ? lstm : c.gru ? gru : rnn;
    c.np = c.plain ? (c.gru ? 4 : 3) : c.lstm ? 9 : c.gru ? 10 : 4;
    memcpy(c.size, s, c.np * sizeof(int64_t));
    return c;
}

static double sigmoid(double a) { return 1 / (1 + exp(-a)); }

/* LN over n values of a (fastln.rnn_reference.layer_norm), into out */
static void ln_vec(double *out, const double *a, int64_t n, const double *w, const double *b) {
    double m = 0, v = 0;
    for (int64_t j = 0; j < n; j++) m += a[j];
    m /= n;
    for (int64_t j = 0; j < n; j++) v += (a[j] - m) * (a[j] - m);
    double r = 1 / sqrt(v / n + EPS);
    for (int64_t j = 0; j < n; j++) out[j] = (a[j] - m) * r * w[j] + b[j];
}

/* One layer over the sequence in double: y (T, B, H); h, c (B, H) from the
 * initial to the final state. Sequence b steps through its own times 0 .. n-1
 * (n = len[b], or T without lengths) in order, or from n-1 back to 0 when
 * rev; its y is 0 at the times from n on, and its final state is the one
 * after its last step. */
static void ref_rnn(const rnn_case *c, double *const *p, const double *x, const int64_t *len,
                    int rev, double *y, double *h, double *cs) {
    int64_t T = c->T, B = c->B, I = c->I, H = c->H, G = c->G;
    double *ai = xmalloc(G * sizeof(double)), *ah = xmalloc(G * sizeof(double));
    double *li = xmalloc(G * sizeof(double)), *lh = xmalloc(G * sizeof(double));
    double *hn = xmalloc(H * sizeof(double));
    for (int64_t b = 0; b < B; b++) {
        int64_t n = len ? len[b] : T;
        double *hr = h + b * H, *cr = cs ? cs + b * H : NULL;
        for (int64_t t = n; t < T; t++)
            for (int64_t j = 0; j < H; j++) y[(t * B + b) * H + j] = 0;
        for (int64_t s = 0; s < n; s++) {
            int64_t t = rev ? n - 1 - s : s;
            double *yr = y + (t * B + b) * H;
            const double *xr = x + (t * B + b) * I;
            for (int64_t g = 0; g < G; g++) {
                ai[g] = ah[g] = 0;
                for (int64_t k = 0; k < I; k++) ai[g] += p[0][g * I + k] * xr[k];
                for (int64_t k = 0; k < H; k++) ah[g] += p[1][g * H + k] * hr[k];
            }
            if (c->lstm) {   /* gates i, f, g, o */
                if (c->plain) {
                    for (int64_t g = 0; g < G; g++) li[g] = ai[g] + ah[g] + p[2][g];
                } else {
                    ln_vec(li, ai, G, p[3], p[4]);
                    ln_vec(lh, ah, G, p[5], p[6]);
                    for (int64_t g = 0; g < G; g++) li[g] += lh[g] + p[2][g];
                }
                for (int64_t j = 0; j < H; j++)
                    cr[j] = sigmoid(li[H + j]) * cr[j] + sigmoid(li[j]) * tanh(li[2 * H + j]);
                if (!c->plain) ln_vec(lh, cr, H, p[7], p[8]);
                for (int64_t j = 0; j < H; j++)
                    hn[j] = sigmoid(li[3 * H + j]) * tanh(c->plain ? cr[j] : lh[j]);
            } else if (c->gru && c->plain) {   /* blocks r, z, n; li: r, lh: r h */
                for (int64_t j = 0; j < H; j++) {
                    li[j] = sigmoid(ai[j] + ah[j] + p[2][j]);
                    lh[j] = li[j] * hr[j];
                }
                for (int64_t j = 0; j < H; j++) {
                    double z = sigmoid(ai[H + j] + ah[H + j] + p[2][H + j]);
                    double a = ai[2 * H + j] + p[2][2 * H + j];
                    if (c->reset_first) {   /* + (r h) W_hn^T + bias_hn */
                        a += p[3][j];
                        for (int64_t k = 0; k < H; k++) a += p[1][(2 * H + j) * H + k] * lh[k];
                    } else {                /* + r (h W_hn^T + bias_hn) */
                        a += li[j] * (ah[2 * H + j] + p[3][j]);
                    }
                    hn[j] = (1 - z) * tanh(a) + z * hr[j];
                }
            } else if (c->gru) {   /* blocks z, r, n */
                ln_vec(li, ai, 2 * H, p[2], p[3]);
                ln_vec(lh, ah, 2 * H, p[4], p[5]);
                for (int64_t j = 0; j < 2 * H; j++) li[j] += lh[j];
                ln_vec(lh, ai + 2 * H, H, p[6], p[7]);
                ln_vec(lh + H, ah + 2 * H, H, p[8], p[9]);
                for (int64_t j = 0; j < H; j++) {
                    double z = sigmoid(li[j]), r = sigmoid(li[H + j]);
                    double nn = tanh(lh[j] + r * lh[H + j]);
                    hn[j] = (1 - z) * hr[j] + z * nn;
                }
            } else {
                for (int64_t g = 0; g < G; g++) ai[g] += ah[g] + (c->plain ? p[2][g] : 0);
                if (!c->plain) ln_vec(ai, ai, G, p[2], p[3]);
                for (int64_t j = 0; j < H; j++)
                    hn[j] = c->base == FASTLN_CELL_RNN_RELU ? fmax(ai[j], 0) : tanh(ai[j]);
            }
            memcpy(hr, hn, H * sizeof(double));
            memcpy(yr, hn, H * sizeof(double));
        }
    }
    free(ai); free(ah); free(li); free(lh); free(hn);
}

/* t[k]: params 0..np-1, then x, h0, c0 (LSTM); the loss the backward differentiates */
static double rnn_loss(const rnn_case *c, double *const *t, const int64_t *len, int rev,
                       const double *dy, const double *dh, const double *dc) {
    size_t ny = (size_t)(c->T * c->B * c->H), nh = (size_t)(c->B * c->H);
    double *y = xmalloc(ny * sizeof(double)), *h = xmalloc(nh * sizeof(double));
    double *cs = c->lstm ? xmalloc(nh * sizeof(double)) : NULL;
    memcpy(h, t[c->np + 1], nh * sizeof(double));
    if (cs) memcpy(cs, t[c->np + 2], nh * sizeof(double));
    ref_rnn(c, t, t[c->np], len, rev, y, h, cs);
    double L = 0;
    for (size_t i = 0; i < ny; i++) L += dy[i] * y[i];
    for (size_t i = 0; i < nh; i++) L += dh[i] * h[i] + (cs ? dc[i] * cs[i] : 0);
    free(y); free(h); free(cs);
    return L;
}

/* Lengths of a padded batch: mode 1: the first row T, the others spread over
 * 1 .. T; mode 2: every row spread over 1 .. T (B = 1 is padded too); 0: none */
static int64_t *rnn_lengths(int64_t T, int64_t B, int mode) {
    if (!mode) return NULL;
    int64_t *len = xmalloc(B * sizeof(int64_t));
    for (int64_t b = 0; b < B; b++)
        len[b] = mode == 1 ? (b == 0 ? T : 1 + (b * 7) % T) : 1 + (b * 3 + T / 2) % T;
    return len;
}

/* One direction of a layer: its tensors (params, x, h0, c0 for an LSTM) in
 * double (t, holding the stored values) and stored (K), the weights of its
 * loss sum(dy y) + sum(dh h_T) + sum(dc c_T), the reference forward, the
 * central differences g of the loss at picked elements, and the buffers the
 * engine writes. */
typedef struct {
    rnn_case c;
    int dt, rev, nt, shares_x;
    size_t n[13], nh, ny;
    double *t[13], g[13][40];
    void *K[13], *GK[10];
    int picked[13][40], npick[13];
    double *dy, *dh, *dc;
    void *DY, *DH0, *DC0;
    double *y, *h, *cs;
    void *Y, *HK, *CK, *DHK, *DCK, *DX, *cache, *work;
} rnn_dir;

static const char *rnn_tensor_name(const rnn_dir *d, int k) {
    static const char *name[] = {"W_ih", "W_hh", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"};
    int np = d->c.np;
    return k < np ? name[k] : k == np ? "x" : k == np + 1 ? "h0" : "c0";
}

/* the engine's gradient of tensor k */
static void *rnn_grad_out(const rnn_dir *d, int k) {
    int np = d->c.np;
    return k < np ? d->GK[k] : k == np ? d->DX : k == np + 1 ? d->DHK : d->DCK;
}

/* x_of: the direction whose input this one shares, or NULL for an input of its own */
static void rnn_dir_init(rnn_dir *d, int cell, int dt, int64_t T, int64_t B, int64_t I,
                         int64_t H, int rev, const rnn_dir *x_of) {
    memset(d, 0, sizeof *d);
    rnn_case c = d->c = rnn_shape(cell, T, B, I, H);
    size_t es = size_of(dt);
    d->dt = dt; d->rev = rev; d->shares_x = x_of != NULL;
    d->nt = c.np + (c.lstm ? 3 : 2);
    d->nh = (size_t)(B * H);
    d->ny = (size_t)(T * B * H);
    for (int k = 0; k < c.np; k++) d->n[k] = (size_t)c.size[k];
    d->n[c.np] = (size_t)(T * B * I);
    d->n[c.np + 1] = d->n[c.np + 2] = d->nh;
    for (int k = 0; k < d->nt; k++) {
        if (k == c.np && x_of) {
            d->t[k] = x_of->t[k];
            d->K[k] = x_of->K[k];
            continue;
        }
        /* LN gains (around 1) and biases; other vectors and the weights around 0 */
        int is_ln = !c.plain && k >= 2 && k < c.np && !(c.lstm && k == 2);
        int gain = is_ln && (k % 2 == (c.lstm ? 1 : 0));
        double scale = k == 0 ? 1 / sqrt((double)I) : k == 1 ? 1 / sqrt((double)H) : 0.5;
        d->t[k] = randv(d->n[k], gain ? 1.0 : 0.0, gain ? 0.3 : scale);
        d->K[k] = store(dt, d->t[k], d->n[k]);
        if (k < c.np) d->GK[k] = nans(dt, d->n[k]);
    }
    d->dy = randv(d->ny, 0, 1);
    d->dh = randv(d->nh, 0, 1);
    d->dc = randv(d->nh, 0, 1);
    d->DY = store(dt, d->dy, d->ny);
    d->DH0 = store(dt, d->dh, d->nh);
    d->DC0 = store(dt, d->dc, d->nh);
    d->y = xmalloc(d->ny * sizeof(double));
    d->h = xmalloc(d->nh * sizeof(double));
    d->cs = xmalloc(d->nh * sizeof(double));
    d->Y = nans(dt, d->ny);
    d->HK = nans(dt, d->nh);
    d->CK = nans(dt, d->nh);
    d->DHK = nans(dt, d->nh);
    d->DCK = nans(dt, d->nh);
    d->DX = nans(dt, d->n[c.np]);
    d->cache = xmalloc(fastln_rnn_cache_size(cell, T, B, H) * es);
    d->work = xmalloc(fastln_rnn_work_size(cell, T, B, H) * es);
}

static void rnn_dir_free(rnn_dir *d) {
    for (int k = 0; k < d->nt; k++) {
        if (k == d->c.np && d->shares_x) continue;
        free(d->t[k]);
        free(d->K[k]);
    }
    for (int k = 0; k < d->c.np; k++) free(d->GK[k]);
    void *all[] = {d->dy, d->dh, d->dc, d->DY, d->DH0, d->DC0, d->y, d->h, d->cs, d->Y,
                   d->HK, d->CK, d->DHK, d->DCK, d->DX, d->cache, d->work};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* the reference forward from the initial state */
static void rnn_dir_ref(rnn_dir *d, const int64_t *len) {
    int np = d->c.np;
    memcpy(d->h, d->t[np + 1], d->nh * sizeof(double));
    if (d->c.lstm) memcpy(d->cs, d->t[np + 2], d->nh * sizeof(double));
    ref_rnn(&d->c, d->t, d->t[np], len, d->rev, d->y, d->h, d->c.lstm ? d->cs : NULL);
}

static double rnn_losses(rnn_dir *d, int nd, const int64_t *len) {
    double L = 0;
    for (int i = 0; i < nd; i++)
        L += rnn_loss(&d[i].c, d[i].t, len, d[i].rev, d[i].dy, d[i].dh, d[i].dc);
    return L;
}

/* Central differences of the summed loss of nd directions at up to 40
 * elements of each tensor, spread over it (every element of a small one).
 * d[1] shares d[0]'s x: its elements are picked once, in d[0], and their
 * differences are the sum of both directions' input gradients. */
static void rnn_diffs(rnn_dir *d, int nd, const int64_t *len) {
    const double step = 1e-6;
    for (int i = 0; i < nd; i++)
        for (int k = 0; k < d[i].nt; k++) {
            size_t n = d[i].n[k];
            int m = i > 0 && k == d[i].c.np ? 0 : n < 40 ? (int)n : 40;
            d[i].npick[k] = m;
            for (int q = 0; q < m; q++) {
                size_t e = m == (int)n ? (size_t)q : (n - 1) * (size_t)q / 39;
                double *v = d[i].t[k] + e, keep = *v;
                *v = keep + step;
                double up = rnn_losses(d, nd, len);
                *v = keep - step;
                double down = rnn_losses(d, nd, len);
                *v = keep;
                d[i].g[k][q] = (up - down) / (2 * step);
                d[i].picked[k][q] = (int)e;
            }
        }
}

/* the engine's arguments for this direction alone (y, dy: (T, B, H)) */
static void rnn_dir_args(const rnn_dir *d, fastln_rnn_args *a, const int64_t *len) {
    memset(a, 0, sizeof *a);
    a->cell = d->c.cell; a->steps = d->c.T; a->batch = d->c.B; a->input = d->c.I;
    a->hidden = d->c.H; a->eps = EPS; a->reverse = d->rev; a->lengths = len;
    for (int k = 0; k < d->c.np; k++) { a->params[k] = d->K[k]; a->grads[k] = d->GK[k]; }
    a->x = d->K[d->c.np]; a->y = d->Y; a->h = d->HK; a->c = d->c.lstm ? d->CK : NULL;
    a->cache = d->cache; a->dy = d->DY; a->dh = d->DHK; a->dc = d->c.lstm ? d->DCK : NULL;
}

/* the initial state into h, c, for a forward */
static void rnn_dir_start_forward(rnn_dir *d) {
    size_t es = size_of(d->dt);
    memcpy(d->HK, d->K[d->c.np + 1], d->nh * es);
    if (d->c.lstm) memcpy(d->CK, d->K[d->c.np + 2], d->nh * es);
}

/* the final state's gradient into dh, dc, NaN-filled gradients, and a's
 * scratch and dx for a backward (use_work: scratch given, no dx asked for) */
static void rnn_dir_start_backward(rnn_dir *d, fastln_rnn_args *a, int use_work) {
    size_t es = size_of(d->dt);
    memcpy(d->DHK, d->DH0, d->nh * es);
    if (d->c.lstm) memcpy(d->DCK, d->DC0, d->nh * es);
    for (int k = 0; k < d->c.np; k++) fill_nan(d->GK[k], d->dt, d->n[k]);
    fill_nan(d->DX, d->dt, d->n[d->c.np]);
    a->work = use_work ? d->work : NULL;
    a->dx = use_work ? NULL : d->DX;
}

/* the recurrence compounds rounding over the steps */
static double rnn_tol_fwd(const rnn_dir *d) { return (d->dt == F64 ? 1e-11 : 1e-5) * d->c.T; }
static double rnn_tol_bwd(const rnn_dir *d) { return d->dt == F64 ? 1e-6 : 2e-4 * d->c.T; }

static void rnn_dir_expect_state(const rnn_dir *d, const char *tag) {
    char what[80];
    snprintf(what, sizeof what, "forward h%s", tag);
    expect(what, d->HK, d->dt, d->h, d->nh, rnn_tol_fwd(d));
    snprintf(what, sizeof what, "forward c%s", tag);
    if (d->c.lstm) expect(what, d->CK, d->dt, d->cs, d->nh, rnn_tol_fwd(d));
}

/* the engine's gradients at the picked elements against the central differences */
static void rnn_dir_expect_grads(const rnn_dir *d, int use_work, const char *tag) {
    for (int k = 0; k < d->nt; k++) {
        if (!d->npick[k] || (k == d->c.np && use_work)) continue;   /* no dx asked for */
        const void *got = rnn_grad_out(d, k);
        double gv[40];
        char what[80];
        for (int q = 0; q < d->npick[k]; q++) gv[q] = get(got, d->dt, d->picked[k][q]);
        snprintf(what, sizeof what, "backward d%s%s%s", rnn_tensor_name(d, k), tag,
                 use_work ? " (work)" : "");
        expect(what, gv, F64, d->g[k], d->npick[k], rnn_tol_bwd(d));
    }
}

typedef int (*rnn_fn)(const fastln_rnn_args *);

/* Every output of one cell's forward and backward on (T, B, I, H), storage
 * dt (F32 or F64), lengths of mode lens, in one direction (rev: reverse). */
static void check_rnn(int cell, int dt, int64_t T, int64_t B, int64_t I, int64_t H, int lens,
                      int rev) {
    rnn_dir d;
    rnn_dir_init(&d, cell, dt, T, B, I, H, rev, NULL);
    int64_t *len = rnn_lengths(T, B, lens);
    snprintf(where, sizeof where, "rnn cell %d %s T=%lld B=%lld I=%lld H=%lld%s%s", cell,
             DT_NAME[dt], (long long)T, (long long)B, (long long)I, (long long)H,
             lens ? " lengths" : "", rev ? " reverse" : "");
    rnn_dir_ref(&d, len);
    rnn_diffs(&d, 1, len);
    fastln_rnn_args a;
    rnn_dir_args(&d, &a, len);
    rnn_fn fwd = dt == F64 ? fastln_rnn_forward_f64 : fastln_rnn_forward_f32;
    rnn_fn bwd = dt == F64 ? fastln_rnn_backward_f64 : fastln_rnn_backward_f32;
    for (int p = 0; p < npaths; p++) {   /* the same inputs on every path */
        use_path(p);
        for (int with_cache = 0; with_cache < 2; with_cache++) {
            rnn_dir_start_forward(&d);
            a.cache = with_cache ? d.cache : NULL;
            expect_ok(fwd(&a), with_cache ? "forward (cache)" : "forward");
            expect(with_cache ? "forward y (cache)" : "forward y", d.Y, dt, d.y, d.ny,
                   rnn_tol_fwd(&d));
            rnn_dir_expect_state(&d, "");
        }
        for (int use_work = 0; use_work < 2; use_work++) {
            a.cache = d.cache;
            rnn_dir_start_backward(&d, &a, use_work);
            expect_ok(bwd(&a), use_work ? "backward (work)" : "backward");
            rnn_dir_expect_grads(&d, use_work, "");
        }
    }
    rnn_dir_free(&d);
    free(len);
}

/* Both directions of a layer through fastln_rnn_forward2_* and backward2_*,
 * sharing x, with y and dy one (T, B, 2H) array: y against the forward
 * reference in its first H columns and the reverse one in its last H, and each
 * direction's final state. With diffs, each direction's gradients, dh and dc,
 * and dx (the sum of both directions' input gradients) against central
 * differences of the sum of the two losses; without (a layer too large for
 * those), every element of them against the single-direction calls on the
 * same path (dx: the sum of theirs), within dt's rounding. */
static void check_rnn_pair(int cell, int dt, int64_t T, int64_t B, int64_t I, int64_t H,
                           int lens, int diffs) {
    rnn_dir d[2];
    rnn_dir_init(&d[0], cell, dt, T, B, I, H, 0, NULL);
    rnn_dir_init(&d[1], cell, dt, T, B, I, H, 1, &d[0]);
    int64_t *len = rnn_lengths(T, B, lens);
    snprintf(where, sizeof where, "rnn pair cell %d %s T=%lld B=%lld I=%lld H=%lld%s%s", cell,
             DT_NAME[dt], (long long)T, (long long)B, (long long)I, (long long)H,
             lens ? " lengths" : "", diffs ? "" : " (against one direction's calls)");
    rnn_dir_ref(&d[0], len);
    rnn_dir_ref(&d[1], len);
    if (diffs) rnn_diffs(d, 2, len);
    int np = d[0].c.np, nt = d[0].nt;
    size_t ny = d[0].ny, es = size_of(dt), rows = (size_t)(T * B);
    double *y2 = xmalloc(2 * ny * sizeof(double));
    void *Y2 = nans(dt, 2 * ny), *DY2 = xmalloc(2 * ny * es);
    for (size_t r = 0; r < rows; r++)   /* row r: the forward's H values, then the reverse's */
        for (int i = 0; i < 2; i++)
            for (int64_t j = 0; j < H; j++) {
                y2[(2 * r + i) * H + j] = d[i].y[r * H + j];
                put(DY2, dt, (2 * r + i) * H + j, d[i].dy[r * H + j]);
            }
    fastln_rnn_args a[2], one[2];
    double *ref[2][13];
    for (int i = 0; i < 2; i++) {
        rnn_dir_args(&d[i], &one[i], len);
        a[i] = one[i];
        a[i].y = (char *)Y2 + i * H * es;
        a[i].dy = (char *)DY2 + i * H * es;
        a[i].ldy = 2 * H;
        for (int k = 0; k < nt; k++) ref[i][k] = diffs ? NULL : xmalloc(d[i].n[k] * sizeof(double));
    }
    rnn_fn fwd = dt == F64 ? fastln_rnn_forward_f64 : fastln_rnn_forward_f32;
    rnn_fn bwd = dt == F64 ? fastln_rnn_backward_f64 : fastln_rnn_backward_f32;
    rnn_fn fwd2 = dt == F64 ? fastln_rnn_forward2_f64 : fastln_rnn_forward2_f32;
    rnn_fn bwd2 = dt == F64 ? fastln_rnn_backward2_f64 : fastln_rnn_backward2_f32;
    static const char *tag[] = {"", " (reverse)"};
    for (int p = 0; p < npaths; p++) {
        use_path(p);
        if (!diffs) {   /* the reference gradients: each direction on its own */
            for (int i = 0; i < 2; i++) {
                rnn_dir_start_forward(&d[i]);
                expect_ok(fwd(&one[i]), "forward (one direction)");
                rnn_dir_start_backward(&d[i], &one[i], 0);
                expect_ok(bwd(&one[i]), "backward (one direction)");
                for (int k = 0; k < nt; k++) load(ref[i][k], rnn_grad_out(&d[i], k), dt, d[i].n[k]);
            }
            for (size_t e = 0; e < d[0].n[np]; e++) ref[0][np][e] += ref[1][np][e];
        }
        for (int with_cache = 0; with_cache < 2; with_cache++) {
            for (int i = 0; i < 2; i++) {
                rnn_dir_start_forward(&d[i]);
                a[i].cache = with_cache ? d[i].cache : NULL;
            }
            fill_nan(Y2, dt, 2 * ny);
            expect_ok(fwd2(a), with_cache ? "forward2 (cache)" : "forward2");
            expect(with_cache ? "forward2 y (cache)" : "forward2 y", Y2, dt, y2, 2 * ny,
                   rnn_tol_fwd(&d[0]));
            for (int i = 0; i < 2; i++) rnn_dir_expect_state(&d[i], tag[i]);
        }
        for (int use_work = 0; use_work < 2; use_work++) {
            for (int i = 0; i < 2; i++) {
                a[i].cache = d[i].cache;
                rnn_dir_start_backward(&d[i], &a[i], use_work);
            }
            a[1].dx = NULL;   /* backward2 writes both directions' sum to a[0].dx */
            expect_ok(bwd2(a), use_work ? "backward2 (work)" : "backward2");
            for (int i = 0; i < 2; i++) {
                if (diffs) {
                    rnn_dir_expect_grads(&d[i], use_work, tag[i]);
                    continue;
                }
                for (int k = 0; k < nt; k++) {
                    if (k == np && (i || use_work)) continue;   /* dx: a[0]'s, when asked for */
                    char what[80];
                    snprintf(what, sizeof what, "backward2 d%s%s%s", rnn_tensor_name(&d[i], k),
                             tag[i], use_work ? " (work)" : "");
                    expect(what, rnn_grad_out(&d[i], k), dt, ref[i][k], d[i].n[k], TOL[dt]);
                }
            }
        }
    }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < nt; k++) free(ref[i][k]);
    rnn_dir_free(&d[1]);   /* before d[0], whose x it shares */
    rnn_dir_free(&d[0]);
    free(len); free(y2); free(Y2); free(DY2);
}

int main(void) {
    const char *isas[] = {"generic", "avx2", "avx512"};
    const int64_t Hs[] = {1, 7, 16, 33, 300, 1024}, Ns[] = {1, 5, 67};
    enum { PLAIN = FASTLN_CELL_PLAIN, GRU_RF = FASTLN_CELL_PLAIN | FASTLN_CELL_GRU |
                                               FASTLN_CELL_RESET_FIRST };
    /* T, B, I, H: single elements, B = 1 (the dot-product path), odd sizes,
     * more rows than a packed block; the last three with lengths */
    const int64_t rnn_cfg[][4] = {{1, 1, 1, 1}, {4, 1, 3, 9}, {3, 5, 7, 7}, {2, 19, 4, 16},
                                  {3, 3, 5, 33}};
    const int cells[] = {FASTLN_CELL_RNN_TANH, FASTLN_CELL_RNN_RELU, FASTLN_CELL_LSTM,
                         FASTLN_CELL_GRU, PLAIN | FASTLN_CELL_RNN_TANH,
                         PLAIN | FASTLN_CELL_RNN_RELU, PLAIN | FASTLN_CELL_LSTM,
                         PLAIN | FASTLN_CELL_GRU, GRU_RF};
    /* reverse = 1 and the pair: T, B, I, H, lengths mode (rnn_lengths) */
    const int64_t rev_cfg[][5] = {{1, 1, 1, 1, 0}, {4, 1, 3, 9, 0}, {5, 1, 3, 6, 2},
                                  {7, 5, 4, 7, 2}};
    const int rev_cells[] = {FASTLN_CELL_RNN_TANH, FASTLN_CELL_LSTM, FASTLN_CELL_GRU,
                             PLAIN | FASTLN_CELL_LSTM, PLAIN | FASTLN_CELL_GRU, GRU_RF};
    const int64_t pair_cfg[][5] = {{3, 1, 2, 5, 0}, {6, 4, 3, 7, 2}};
    const int pair_cells[] = {FASTLN_CELL_LSTM, PLAIN | FASTLN_CELL_GRU};
    for (int i = 0; i < 3; i++) {
        if (!fastln_isa_supported(isas[i])) continue;
        if (fastln_set_isa(isas[i]) != 0) { printf("ERROR: fastln_set_isa(%s)\n", isas[i]); return 1; }
        for (int nt = 1; nt <= 3; nt += 2) {
            paths[npaths].isa = isas[i];
            paths[npaths++].threads = nt;
        }
    }
    for (int p = 0; p < npaths; p++) {   /* the kernels' stats feed their backward: per path */
        use_path(p);
        for (int dt = F32; dt <= BF16; dt++)
            for (int h = 0; h < 6; h++)
                for (int q = 0; q < 3; q++)
                    for (int weighted = 0; weighted < 2; weighted++)
                        if (weighted || q == 1) check_norm(dt, Ns[q], Hs[h], weighted);
    }
    for (size_t ci = 0; ci < NELEM(cells); ci++)   /* each case on every path */
        for (int dt = F32; dt <= F64; dt++)
            for (size_t q = 0; q < NELEM(rnn_cfg); q++)
                check_rnn(cells[ci], dt, rnn_cfg[q][0], rnn_cfg[q][1], rnn_cfg[q][2],
                          rnn_cfg[q][3], q >= 2, 0);
    for (size_t ci = 0; ci < NELEM(rev_cells); ci++)
        for (int dt = F32; dt <= F64; dt++)
            for (size_t q = 0; q < NELEM(rev_cfg); q++)
                check_rnn(rev_cells[ci], dt, rev_cfg[q][0], rev_cfg[q][1], rev_cfg[q][2],
                          rev_cfg[q][3], (int)rev_cfg[q][4], 1);
    for (size_t ci = 0; ci < NELEM(pair_cells); ci++)
        for (int dt = F32; dt <= F64; dt++)
            for (size_t q = 0; q < NELEM(pair_cfg); q++)
                check_rnn_pair(pair_cells[ci], dt, pair_cfg[q][0], pair_cfg[q][1],
                               pair_cfg[q][2], pair_cfg[q][3], (int)pair_cfg[q][4], 1);
    /* large enough for threads within each direction, and on x86 for the two
     * directions running side by side (rnn.c's thresholds) */
    check_rnn_pair(FASTLN_CELL_LSTM, F32, 8, 10, 64, 64, 2, 0);
    for (int p = 0; p < npaths; p++)
        printf("%s, %d thread(s): %s\n", paths[p].isa, paths[p].threads,
               paths[p].failures ? "FAIL" : "ok");
    printf("%d checks, %d failed; the closest pass: %.2g of the tolerance (%s)\n", checks,
           failures, worst, worst_at);
    return failures != 0;
}
