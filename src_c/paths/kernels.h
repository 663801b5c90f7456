/*
 * One instruction-set path: the row kernels, their drivers and the LN-RNN
 * engine compiled for float and double, and the path's kernel table. The
 * includer defines the target (isa_begin.h lists the macros). On AVX-512 the
 * float row kernels live in avx512_*.c (avx512.h).
 */
#include "isa/begin.h"
#if defined(FASTLN_X86) && VEC_BYTES == 64
#include "norm/avx512/avx512.h"
#endif

#define IS_F32 1
#include "isa/type_begin.h"
#include "norm/sums.h"
#include "norm/stats.h"
#include "norm/bwd_stats.h"
#include "norm/rows.h"
#include "norm/add.h"
#include "norm/half.h"
#include "norm/drivers.h"
#include "norm/channels.h"
#include "rnn/cells.h"
#include "rnn/products.h"
#include "rnn/pack.h"
#include "rnn/engine.h"
#include "isa/type_end.h"

#define IS_F32 0
#include "isa/type_begin.h"
#include "norm/sums.h"
#include "norm/stats.h"
#include "norm/bwd_stats.h"
#include "norm/rows.h"
#include "norm/add.h"
#include "norm/half.h"
#include "norm/drivers.h"
#include "norm/channels.h"
#include "rnn/cells.h"
#include "rnn/products.h"
#include "rnn/pack.h"
#include "rnn/engine.h"
#include "isa/type_end.h"

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
