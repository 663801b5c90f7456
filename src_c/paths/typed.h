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
#include "rnn/engine.h"
#include "isa/type_end.h"
