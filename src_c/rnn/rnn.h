/*
 * rnn/: the LN-RNN engine: one layer of a (layer-normalized) RNN, LSTM or GRU
 * over a whole sequence, forward and backward. layout.c holds what every
 * path shares (the cache layout); the rest is written once per (element
 * type, ISA) and compiled by each instruction-set path (paths/typed.h
 * includes them in this order, each needing those before it):
 *   layer.h        a layer's sizes and parameters, its active rows, its
 *                  chunks of steps
 *   cells.h        the cells, one row at a time: activations, LayerNorm over
 *                  a vector, the fused forward and backward row kernels
 *   products.h     how a layer does its recurrent products (gemm/)
 *   pack.h         the forward's packed weights: fastln_rnn_pack's format on
 *                  this path, and the products set up from them
 *   forward_step.h a forward's steps: the product, then the rows
 *   forward_own_rows.h  int8: each thread its own rows, steps without
 *                  barriers
 *   forward.h      the forward of a layer, chunk by chunk
 *   backward.h     the backward of a layer
 * api/rnn.c and api/rnn_step.c are the entry points that call them.
 * rnn/ includes gemm/, norm/ (the row statistics), isa/, runtime/ and the
 * public headers.
 */
#ifndef FASTLN_RNN_ENGINE_H
#define FASTLN_RNN_ENGINE_H

#include <stdint.h>
#include "api/fastln_rnn.h"

/* Where each cached array of one layer starts, in elements, or -1 if unused:
 * xih, xhh, act (T, B, G): normalized A_ih, normalized A_hh, activations
 * (GRU only: LSTM backward recomputes its gates from xih and xhh, which costs
 * less than writing and reading 4H more values per row and step);
 * hseq, cseq (T+1, B, H): h_{t-1} and c_{t-1} at index t; xc (T, B, H): the
 * normalized c (LSTM), h W_hn^T + bias_hn (plain GRU) or r h (RESET_FIRST); rstd (T, B,
 * nrstd). A plain LSTM keeps its gates' pre-activations in xih, and h, c; a
 * plain GRU its gates (r, z, n) in act; a plain RNN only h. An LN LSTM with
 * FASTLN_CELL_LN_SUM or _LN_GATE keeps its normalized sum in xih and has no
 * xhh, and its rstd rows end with c's, as the pair's do. Indexed by step,
 * which is time run backwards in a reverse layer.
 * fastln_rnn_layout_for (layout.c) returns FASTLN_EINVAL for an unknown cell. */
typedef enum { FASTLN_NORM_PAIR = 0, FASTLN_NORM_SUM, FASTLN_NORM_GATE } fastln_gate_norm;
typedef struct {
    int cell, plain;   /* the cell without its flags, and FASTLN_CELL_PLAIN */
    int reset_first;   /* FASTLN_CELL_RESET_FIRST (plain GRU): xc holds r h_{t-1} */
    fastln_gate_norm norm;   /* LN LSTM: FASTLN_CELL_LN_SUM, _LN_GATE, or the pair */
    int carry_ln;      /* LN LSTM: FASTLN_CELL_CARRY_LN */
    int gates, nrstd, split;   /* split: dA_ih and dA_hh are separate arrays */
    int64_t G, gw, xih, xhh, act, hseq, cseq, xc, rstd, size;   /* gw: see cells.h */
} fastln_rnn_layout;
int fastln_rnn_layout_for(fastln_rnn_layout *L, int cell, int64_t T, int64_t B, int64_t H);

/* How a layer does its recurrent products (products.h): the packed
 * kernels over panels of T (gemm/packed.h), the axpy kernel over W_hh (the
 * backward of one sequence), bfloat16 pair panels (gemm/bf16.h) or int8
 * quad panels (gemm/int8.h). Set up by rec_init_fwd (pack.h) and
 * rec_init_bwd (products.h). */
typedef enum {
    FASTLN_REC_PACKED = 1,
    FASTLN_REC_AXPY,
    FASTLN_REC_BF16,
    FASTLN_REC_INT8
} fastln_rec_method;

/* The cached normalized values that a backward's LN-parameter sums pair
 * with the LN-output gradients (backward.h): A_ih, A_hh or c normalized */
typedef enum { FASTLN_SEG_XIH, FASTLN_SEG_XHH, FASTLN_SEG_XC } fastln_seg_src;

/* The header of fastln_rnn_pack's output: what it packed, and how (the
 * format of one path's kernels). The engine uses packed weights only when
 * all of it matches the layer and the path. */
#define FASTLN_PACK_MAGIC 0x504e4c46u   /* "FLNP" */
#define FASTLN_PACK_F32 1               /* float panels (fastln_pack_nt) */
#define FASTLN_PACK_BF16 2              /* bfloat16 pair panels (gemm/bf16.h) */
#define FASTLN_PACK_I8 3                /* int8 quad panels (gemm/int8.h) */
#define FASTLN_PACK_F64 4               /* double panels (fastln_pack_nt_f64) */
typedef struct {
    uint32_t magic;
    int32_t format, cell, reserved;
    int64_t input, hidden, proj;
    char pad[24];   /* the parts start 64 bytes in */
} fastln_rnn_pack_header;

#endif
