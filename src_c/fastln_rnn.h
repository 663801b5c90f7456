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
 *     Plain cells (cell | FASTLN_CELL_PLAIN; LSTM and RNN only) have no LN:
 *       LSTM (G = 4H):                W_ih, W_hh, bias (4H)
 *         gates = x W_ih^T + h W_hh^T + bias, c' = f c + i g, h' = o tanh(c')
 *       RNN (G = H):                  W_ih, W_hh, bias (H)
 *         h' = f(x W_ih^T + h W_hh^T + bias)
 *       (torch.nn.LSTM and nn.RNN with bias = b_ih + b_hh)
 *   lengths (B) or NULL: row b is active at step t while t < lengths[b]; an
 *     inactive row holds its state, its y is 0 and its dy is ignored.
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
 * Large products go to BLAS when one is set (fastln_rnn_set_blas; the Python
 * package passes SciPy's), else to a plain C loop. The per-step recurrent
 * product uses packed-weight AVX-512/AVX2 kernels for float (BLAS on other
 * CPUs and for double), and a dot-product kernel when B == 1. No BLAS call is
 * made inside an OpenMP region. Results are bitwise identical for any fastln
 * thread count, given a BLAS whose results do not depend on its own.
 *
 * Returns FASTLN_OK, FASTLN_EINVAL (bad sizes or cell, sizes beyond BLAS's
 * int), FASTLN_ENOMEM, or FASTLN_EINTR when interrupt() returned nonzero
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
/* Or'ed into an LSTM or RNN cell: the same cell without LayerNorm. */
#define FASTLN_CELL_PLAIN 8

typedef struct {
    int cell;                     /* FASTLN_CELL_* */
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
} fastln_rnn_args;

/* Elements of the forward cache of one layer (same type as the data), and of
 * the optional backward scratch. */
int64_t fastln_rnn_cache_size(int cell, int64_t T, int64_t B, int64_t H);
int64_t fastln_rnn_work_size(int cell, int64_t T, int64_t B, int64_t H);

int fastln_rnn_forward_f32(const fastln_rnn_args *a);
int fastln_rnn_forward_f64(const fastln_rnn_args *a);
int fastln_rnn_backward_f32(const fastln_rnn_args *a);
int fastln_rnn_backward_f64(const fastln_rnn_args *a);

/* Fortran BLAS ?gemm (column-major, int arguments), or NULL for the C loop. */
typedef void (*fastln_sgemm_fn)(char *, char *, int *, int *, int *, float *, float *, int *,
                                float *, int *, float *, float *, int *);
typedef void (*fastln_dgemm_fn)(char *, char *, int *, int *, int *, double *, double *,
                                int *, double *, int *, double *, double *, int *);
void fastln_rnn_set_blas(fastln_sgemm_fn sgemm, fastln_dgemm_fn dgemm);

#ifdef __cplusplus
}
#endif
#endif /* FASTLN_RNN_H */
