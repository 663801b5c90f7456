/*
 * One layer of the LN-RNN engine as its drivers (forward.h, backward.h) and
 * row kernels (cells.h) see it, written once per (element type, ISA)
 * (isa/type_begin.h): its sizes and parameters, which rows are active at a
 * step and the time each reads, its chunks of steps, and its input rows
 * gathered in step order.
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
 */
#include "rnn/rnn.h"

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
    ly->proj = a->proj;
    ly->P = a->proj ? a->proj : a->hidden;
    ly->ldy = a->ldy > 0 ? a->ldy : ly->P;
    ly->eps = a->eps;
    ly->p = (const T *const *)a->params;
    ly->fixed = a->wtype == FASTLN_RNN_W_INT8;
    ly->len = a->lengths;
    ly->G = ly->L.G;
    ly->gw = ly->L.gw;
    return FASTLN_OK;
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
