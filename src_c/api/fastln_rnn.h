/*
 * fastln LN-RNN engine: one layer of a layer-normalized RNN, LSTM or GRU over
 * a whole sequence, forward and backward (BPTT). Plain C99, no Python.
 *
 * Shape legend (one layer; time-major; G = gates * H)
 *   x (T, B, I)  layer input            y, dy (T, B, H)  layer output
 *   h, c (B, H)  state                  dx (T, B, I)
 *   params, grads: the layer's parameters in the order of fastln.rnn's params
 *     dict (W_ih (G, I), W_hh (G, H), then the cell's gains and biases):
 *       LSTM (G = 4H, gates i,f,g,o): W_ih, W_hh, bias, ln_ih_w, ln_ih_b,
 *                                     ln_hh_w, ln_hh_b (4H), ln_c_w, ln_c_b (H)
 *       GRU (G = 3H, blocks z,r,n):   W_ih, W_hh, ln_ih_w, ln_ih_b, ln_hh_w,
 *                                     ln_hh_b (2H), ln_in_w, ln_in_b, ln_hn_w,
 *                                     ln_hn_b (H)
 *       RNN (G = H):                  W_ih, W_hh, ln_w, ln_b (H)
 *     Plain cells (cell | FASTLN_CELL_PLAIN) have no LN:
 *       LSTM (G = 4H):                W_ih, W_hh, bias (4H)
 *         gates = x W_ih^T + h W_hh^T + bias, c' = f c + i g, h' = o tanh(c')
 *       RNN (G = H):                  W_ih, W_hh, bias (H)
 *         h' = f(x W_ih^T + h W_hh^T + bias)
 *       GRU (G = 3H, blocks r,z,n):   W_ih, W_hh, bias (3H), bias_hn (H)
 *         r, z = sigmoid(x W_i[r,z]^T + h W_h[r,z]^T + bias[r,z]),
 *         n = tanh(x W_in^T + bias[n] + r * (h W_hn^T + bias_hn)),
 *         h' = (1 - z) n + z h
 *         With FASTLN_CELL_RESET_FIRST: n = tanh(x W_in^T + bias[n] + (r h) W_hn^T + bias_hn)
 *       (torch.nn.LSTM, nn.GRU and nn.RNN with bias = b_ih + b_hh where the
 *       two sum; ONNX's GRU with linear_before_reset = 0 under RESET_FIRST)
 *   lengths (B) or NULL: row b is active at step t while t < lengths[b]; an
 *     inactive row holds its state, its y is 0 and its dy is ignored.
 *   reverse: step s of row b reads and writes time lengths[b] - 1 - s (T - 1 - s
 *     without lengths) while active, and time s after, so that each sequence
 *     runs from its last valid time back to its first (the reverse half of a
 *     bidirectional layer); the final state is the one after time 0.
 *   ldy: elements between the rows of y and dy (0: H; else at least H), so that the two
 *     directions of a bidirectional layer share one (T, B, 2H) output.
 *
 * Math: Ba, Kiros & Hinton (2016), eq. 4 and supplementary eqs. 20-28, as
 * written out in docs/design.md. LN(a) = (a - mean) / sqrt(var + eps) * w + b.
 *
 * Forward writes y and the final state over the initial one (h, c). With
 * cache != NULL (fastln_rnn_cache_size elements) it keeps what backward needs;
 * without, it keeps nothing beyond scratch of O(B * G) per chunk of steps.
 * Backward takes the cache of one forward, the layer input x, dy, and the
 * gradient of the final state in dh, dc; it writes the gradient of the
 * initial state over them, dx (may be NULL) and every grads[k].
 *
 * Every product is the engine's own: packed-weight kernels for float and
 * double on each instruction-set path (AVX-512, AVX2, and a portable one),
 * each element of a product one sum over k in a fixed order. Results are
 * bitwise identical for any thread count, on any CPU that runs the same
 * path, and a row's results do not depend on the other rows of its batch.
 * No BLAS library is used.
 *
 * Returns FASTLN_OK, FASTLN_EINVAL (bad sizes or cell; T * B, G or I past
 * INT_MAX), FASTLN_ENOMEM, or FASTLN_EINTR when interrupt() returned nonzero
 * (checked between chunks of steps, outside any parallel region; the outputs
 * are then incomplete).
 */
#ifndef FASTLN_RNN_H
#define FASTLN_RNN_H

#include <stdint.h>
#include "fastln.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FASTLN_EINTR 3

enum { FASTLN_CELL_RNN_TANH = 0, FASTLN_CELL_RNN_RELU = 1, FASTLN_CELL_LSTM = 2,
       FASTLN_CELL_GRU = 3 };
/* Or'ed into a cell: the same cell without LayerNorm. */
#define FASTLN_CELL_PLAIN 8
/* Or'ed into a plain GRU: the reset gate scales h before W_hn (ONNX's default form). */
#define FASTLN_CELL_RESET_FIRST 16
/* Or'ed into the LN LSTM: the variants of its gate LayerNorm and state that
 * trained LN-LSTMs use. With FASTLN_CELL_LN_SUM or FASTLN_CELL_LN_GATE (not
 * both) the parameters are W_ih, W_hh, bias (4H), ln_w, ln_b (4H), ln_c_w,
 * ln_c_b (H), and
 *   LN_SUM:  gates = LN(x W_ih^T + h W_hh^T; ln) + bias, one LN over 4H;
 *   LN_GATE: the same with one LN over each gate's block of H (ln_w, ln_b
 *            hold the four blocks' gains and biases in gate order).
 * FASTLN_CELL_CARRY_LN: the cell state carried to the next step is
 * c = LN(c'; ln_c), c' = f c_prev + i g, and h' = o tanh(c); without it c'
 * is carried and h' = o tanh(LN(c'; ln_c)) (the paper). */
#define FASTLN_CELL_LN_SUM 32
#define FASTLN_CELL_LN_GATE 64
#define FASTLN_CELL_CARRY_LN 128

typedef struct {
    int cell;                     /* FASTLN_CELL_*, with FASTLN_CELL_PLAIN and flags */
    int64_t steps, batch, input, hidden;   /* T, B, I, H of the legend: all >= 1 */
    double eps;                   /* unused by plain cells */
    const void *params[10];       /* float * or double *, per the legend */
    const int64_t *lengths;       /* (B) or NULL */
    void *h, *c;                  /* forward: state, in and out (c: LSTM only) */
    void *dh, *dc;                /* backward: state gradient, in and out (dc: LSTM only) */
    const void *x;                /* (T, B, I): forward input; backward: the same input */
    void *y;                      /* forward output (T, B, H) */
    void *cache;                  /* forward: NULL or out; backward: in */
    const void *dy;               /* backward (T, B, H) */
    void *dx;                     /* backward (T, B, I) or NULL */
    void *grads[10];              /* backward, shaped like params */
    void *work;                   /* backward: NULL, or fastln_rnn_work_size elements of
                                     scratch (a caller that reuses it saves page faults) */
    int (*interrupt)(void *ctx);  /* NULL, or polled between chunks of steps */
    void *interrupt_ctx;
    int reverse;                  /* 0, or 1: run each sequence backwards in time */
    int64_t ldy;                  /* row stride of y and dy; 0: H */
    int wtype;                    /* FASTLN_RNN_W_SAME, or FASTLN_RNN_W_BF16 (forward, float) */
    const void *packed;           /* forward: NULL, or this layer's weights from fastln_rnn_pack */
    int transposed;               /* FASTLN_RNN_W_IH_T | FASTLN_RNN_W_HH_T | FASTLN_RNN_W_HR_T,
                                     or 0 */
    const float *scales[2];       /* FASTLN_RNN_W_INT8: the scales of W_ih's and W_hh's rows (G) */
    int64_t proj;                 /* 0, or P: a plain LSTM's projection (see below) */
    const float *scale_hr;        /* FASTLN_RNN_W_INT8 with proj: the scales of W_hr's rows (P) */
} fastln_rnn_args;

/* A projected LSTM (LSTMP; torch.nn.LSTM with proj_size = P): a plain LSTM
 * (cell FASTLN_CELL_LSTM | FASTLN_CELL_PLAIN) whose state h and output y
 * have P features,
 *   gates = x W_ih^T + h W_hh^T + bias, c' = f c + i g,
 *   h' = (o tanh(c')) W_hr^T,
 * with params[3] = W_hr (P, H), of the weights' type (wtype), W_hh (G, P),
 * h (B, P), y (T, B, P) (ldy: 0 or at least P) and c (B, H). Forward
 * without a cache only (inference), in every wtype; W_hr is always in the
 * plain layout, or with FASTLN_RNN_W_HR_T transposed (see below). */

/* The storage of W_ih and W_hh (params[0], params[1]). FASTLN_RNN_W_BF16:
 * bfloat16 (uint16_t bit patterns), for inference: fastln_rnn_forward_f32
 * and _forward2_f32 without a cache. The products then take A (the input, or
 * h) rounded to bfloat16, with float sums: AMX tiles where the CPU has
 * AMX-BF16 and the OS grants them (FASTLN_NO_AMX=1 in the environment turns
 * them off), else VDPBF16PS where it has AVX512-BF16, else the weights
 * widened to float. Everything else (the
 * state, the LN statistics, the gates) is float. */
#define FASTLN_RNN_W_SAME 0
#define FASTLN_RNN_W_BF16 1

/* FASTLN_RNN_W_INT8: int8 weights (int8_t), row j of W standing for
 * scales[i][j] times its values, for inference as W_BF16 is (a float
 * forward without a cache). The products quantize each row of A (the input,
 * or h) at run time to int8 with a scale of its own (max |a| / 127), sum
 * the int8 products exactly in int32, and scale each sum by the two scales;
 * so a row's products depend on nothing but that row and the weights, on
 * every path (VPDPBUSD where the CPU has AVX512-VNNI, VPMADDWD on the other
 * x86 paths, C on the generic one), for every thread count. Everything else
 * is float, as for W_BF16. */
#define FASTLN_RNN_W_INT8 2

/* The layout of W_ih and W_hh (fastln_rnn_args.transposed, wtype
 * FASTLN_RNN_W_SAME only): with FASTLN_RNN_W_IH_T, params[0] holds W_ih^T,
 * (I, G) row-major, which is W_ih (G, I) in column-major order (a
 * Fortran-ordered array); with FASTLN_RNN_W_HH_T, params[1] holds W_hh^T
 * (H, G). A float forward on the x86 paths reads both in place when both are
 * transposed and G (and H for FASTLN_CELL_RESET_FIRST) is a multiple of 32:
 * the product kernels' own layout, so nothing is packed and any change to
 * the weights is seen by the next call. Every other call copies them into
 * the plain layout first. Results do not depend on the layout. A projected
 * LSTM's W_hr takes FASTLN_RNN_W_HR_T likewise (params[3] holds W_hr^T, (H,
 * P)); with all three transposed, and P a multiple of 32 too, its forward
 * reads them in place. */
#define FASTLN_RNN_W_IH_T 1
#define FASTLN_RNN_W_HH_T 2
#define FASTLN_RNN_W_HR_T 4

/* Packed weights. A forward packs W_ih and W_hh into the layout of its
 * product kernels on every call; fastln_rnn_pack does it once, for weights
 * that do not change, and fastln_rnn_args.packed hands the result to every
 * forward (float) of that layer. The layout belongs to the instruction-set
 * path in use: a forward on another path, or of another cell or size,
 * ignores it and packs again. The engine reads the weights only through the
 * packed copy, so it must be redone when they change.
 * fastln_rnn_packed_size: the bytes fastln_rnn_pack writes for a layer of
 * this cell (with its flags), wtype and sizes on the current path (float
 * weights: every path packs them; float64 layers are packed by each
 * forward); -1 for bad arguments. fastln_rnn_pack: FASTLN_OK, FASTLN_EINVAL (bad
 * arguments, size too small), FASTLN_ENOMEM. out may have any alignment;
 * at a multiple of 64 bytes the kernels read whole cache lines. */
int64_t fastln_rnn_packed_size(int cell, int wtype, int64_t input, int64_t hidden);
int fastln_rnn_pack(void *out, int64_t size, int cell, int wtype, int64_t input,
                    int64_t hidden, const void *w_ih, const void *w_hh);
/* The same for a projected LSTM (proj = P >= 1, w_hr (P, H)); with proj 0
 * they are the two above. */
int64_t fastln_rnn_packed_size_proj(int cell, int wtype, int64_t input, int64_t hidden,
                                    int64_t proj);
int fastln_rnn_pack_proj(void *out, int64_t size, int cell, int wtype, int64_t input,
                         int64_t hidden, int64_t proj, const void *w_ih, const void *w_hh,
                         const void *w_hr);

/* Elements of the forward cache of one layer (same type as the data), and of
 * the optional backward scratch. */
int64_t fastln_rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H);
int64_t fastln_rnn_work_size(int cell, int64_t T, int64_t B, int64_t H);

int fastln_rnn_forward_f32(const fastln_rnn_args *a);
int fastln_rnn_forward_f64(const fastln_rnn_args *a);
int fastln_rnn_backward_f32(const fastln_rnn_args *a);
int fastln_rnn_backward_f64(const fastln_rnn_args *a);

/* Both directions of a bidirectional layer: a[0] forward, a[1] with
 * reverse = 1, the same cell, sizes and x (y, dy: the two halves of one
 * (T, B, 2H) array, ldy = 2H). They run concurrently, each on half of the
 * threads, where there are two threads or more and the layer is large
 * enough, else one after the other. Backward writes the sum of the two directions' input
 * gradients to a[0].dx (a[1].dx is not used). Returns as the calls above. */
int fastln_rnn_forward2_f32(const fastln_rnn_args a[2]);
int fastln_rnn_forward2_f64(const fastln_rnn_args a[2]);
int fastln_rnn_backward2_f32(const fastln_rnn_args a[2]);
int fastln_rnn_backward2_f64(const fastln_rnn_args a[2]);

/* One time step of a stack of layers (the forward of each at T = 1, one
 * call), for B streams whose states are rows of state tables:
 *   layers[k]: layer k's arguments, as for fastln_rnn_forward_*, with cell
 *     (the same for every layer), input, hidden (the same for every layer),
 *     eps, params, wtype and packed set; the step sets the rest. Layer 0
 *     reads x (B, layers[0].input), layer k > 0 layer k-1's output.
 *   y (B, H): the top layer's output.
 *   h, c (num_layers, table_rows, H): the state tables (c: LSTM only, else
 *     NULL). A projected LSTM (every layer with the same proj P) has P
 *     wherever h, y or a layer's output has H above; its c rows keep H. With rows (B indices in [0, table_rows), no two alike) stream b's
 *     state is row rows[b] of each layer's table, gathered before the step
 *     and written back after it, only when every layer succeeded. Without
 *     rows, table_rows == B and the tables are the batch's state, updated in
 *     place; h_in, c_in (num_layers, B, H), when given, are copied into them
 *     first (the step's input state, left unchanged).
 * Returns FASTLN_OK, FASTLN_EINVAL (bad sizes, cells, chaining or rows; repeated
 * rows are the caller's to rule out) or FASTLN_ENOMEM. */
typedef struct {
    const fastln_rnn_args *layers;
    int64_t num_layers, batch, table_rows;
    const int64_t *rows;          /* (B) or NULL */
    void *h, *c;                  /* state tables */
    const void *h_in, *c_in;      /* NULL, or the input state (without rows only) */
    const void *x;
    void *y;
} fastln_rnn_step_args;

int fastln_rnn_step_f32(const fastln_rnn_step_args *s);
int fastln_rnn_step_f64(const fastln_rnn_step_args *s);

/* Accepted and ignored: the engine computes every product itself. Kept so
 * that programs written against the earlier interface, which handed in a
 * Fortran BLAS ?gemm, still build and link. */
typedef void (*fastln_sgemm_fn)(char *, char *, int *, int *, int *, float *, float *, int *,
                                float *, int *, float *, float *, int *);
typedef void (*fastln_dgemm_fn)(char *, char *, int *, int *, int *, double *, double *,
                                int *, double *, int *, double *, double *, int *);
void fastln_rnn_set_blas(fastln_sgemm_fn sgemm, fastln_dgemm_fn dgemm);

#ifdef __cplusplus
}
#endif
#endif /* FASTLN_RNN_H */
