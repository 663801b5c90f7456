/*
 * One instruction-set path: the norms' row kernels and drivers and the LN-RNN
 * engine compiled for float and double (typed.h), and the path's kernel
 * table. The includer (generic.c, avx2.c, avx512.c) defines the target
 * (isa/begin.h lists the macros). On AVX-512 the float row kernels live in
 * norm/avx512/, compiled apart.
 */
/* the declarations the kernels use, ahead of the path's code: from
 * isa/type_begin.h on, T is a macro */
#include "gemm/gemm.h"
#include "paths/table.h"
#include "rnn/rnn.h"
#include "runtime/policy.h"
#include "runtime/pool.h"

#include "isa/begin.h"

#define IS_F32 1
#include "paths/typed.h"
#define IS_F32 0
#include "paths/typed.h"

#include "isa/end.h"

#define STR_(s) #s
#define STR(s) STR_(s)

const fastln_kernel_table CAT3(fastln_kernels_, ISA, ) = {
    STR(ISA),
    CAT3(layer_norm, _f32_, ISA),          CAT3(layer_norm, _f64_, ISA),
    CAT3(layer_norm_backward, _f32_, ISA), CAT3(layer_norm_backward, _f64_, ISA),
    CAT3(add_layer_norm, _f32_, ISA),      CAT3(add_layer_norm, _f64_, ISA),
    CAT3(rms_norm, _f32_, ISA),            CAT3(rms_norm, _f64_, ISA),
    CAT3(rms_norm_backward, _f32_, ISA),   CAT3(rms_norm_backward, _f64_, ISA),
    CAT3(half_fwd, _f32_, ISA),            CAT3(half_bwd, _f32_, ISA),
    CAT3(add_norm, _f32_, ISA),            CAT3(add_norm, _f64_, ISA),
    CAT3(add_backward, _f32_, ISA),        CAT3(add_backward, _f64_, ISA),
    CAT3(norm_channels, _f32_, ISA),       CAT3(norm_channels, _f64_, ISA),
    CAT3(norm_channels_bwd, _f32_, ISA),   CAT3(norm_channels_bwd, _f64_, ISA),
    CAT3(rnn_forward, _f32_, ISA),         CAT3(rnn_forward, _f64_, ISA),
    CAT3(rnn_backward, _f32_, ISA),        CAT3(rnn_backward, _f64_, ISA),
    CAT3(half_convert, _f32_, ISA),        CAT3(rnn_pack, _f32_, ISA),
};
