/*
 * The kernels of one element type on the path that isa/begin.h opened
 * (kernels.h includes it for float, then double): norm/ and rnn/, in
 * the order in which each needs those before it. The includer defines
 * IS_F32.
 */
#include "isa/type_begin.h"
#include "norm/sums.h"
#include "norm/stats.h"
#include "norm/bwd_stats.h"
#include "norm/rows.h"
#include "norm/range.h"
#include "norm/add.h"
#include "norm/half.h"
#include "norm/drivers.h"
#include "norm/channels.h"
#include "rnn/cells.h"
#include "rnn/products.h"
#include "rnn/pack.h"
#include "rnn/layer.h"
#include "rnn/forward_step.h"
#include "rnn/forward_own_rows.h"
#include "rnn/forward.h"
#include "rnn/backward.h"
#undef HAVE_BF16DOT   /* gemm/bf16.h's and int8.h's, for T */
#undef HAVE_I8
#include "isa/type_end.h"
