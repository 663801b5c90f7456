# cython: language_level=3, boundscheck=False, wraparound=False, binding=True, embedsignature=True
"""The Cython binding of the LN-RNN engine (src_c/api/fastln_rnn.h) for fastln.rnn.

fastln.rnn calls these with canonical arrays (time-major, C-contiguous, the
model's dtype); the sizes are re-checked here so that no caller can make the
engine read or write past a buffer. The engine itself is compiled into
fastln._lib, whose entry points this module cimports (fastln/_lib.pxd).
No math lives here.
"""
cimport cython
from libc.stdint cimport int64_t
from libc.string cimport memset
from cpython.dict cimport PyDict_GetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc
cimport numpy as cnp
import numpy as np

from fastln._lib cimport (
    FASTLN_EINTR, FASTLN_RNN_W_BF16, FASTLN_RNN_W_HH_T, FASTLN_RNN_W_HR_T, FASTLN_RNN_W_IH_T, FASTLN_RNN_W_INT8,
    fastln_rnn_args, fastln_rnn_step_args,
    rnn_backward2_f32, rnn_backward2_f64, rnn_backward_f32, rnn_backward_f64, rnn_bf16_products, rnn_int8_products,
    rnn_cache_size, rnn_forward2_f32, rnn_forward2_f64, rnn_forward_f32, rnn_forward_f64,
    rnn_pack, rnn_packed_size, rnn_step_f32, rnn_step_f64, rnn_work_size,
    to_bf16)
from fastln._ndarray cimport _arr, _check, _fast, _float_type, _ptr

cnp.import_array()


def bf16_products():
    """Where a bfloat16 model's products run on the path in use: "AMX",
    "AVX512-BF16" (VDPBF16PS) or "float32" (weights widened into the float
    kernels' panels)."""
    return rnn_bf16_products().decode()


def int8_products():
    """The kernel an int8 model's products run on (fastln.rnn.quantize).

    Returns
    -------
    str
        On the instruction-set path in use: "AVX512-VNNI" (VPDPBUSD),
        "AVX-512 (VPMADDWD)", "AVX2 (VPMADDWD)" or "C" (the generic path).
        Every one sums the int8 products exactly, so all give bitwise the
        same results.

    Examples
    --------
    >>> from fastln.rnn import int8_products
    >>> int8_products() in ("AVX512-VNNI", "AVX-512 (VPMADDWD)", "AVX2 (VPMADDWD)", "C")
    True
    """
    return rnn_int8_products().decode()

# the storage of a model's weight matrices (fastln_rnn_args.wtype)
W_SAME, W_BF16, W_INT8 = 0, FASTLN_RNN_W_BF16, FASTLN_RNN_W_INT8


cdef extern from "Python.h":
    int PyErr_CheckSignals_raw "PyErr_CheckSignals" () nogil

cdef int _poll_signals(void *ctx) noexcept nogil:
    """The engine's interrupt hook: nonzero (with the exception set) on Ctrl-C."""
    with gil:
        return PyErr_CheckSignals_raw()

cdef int _pending() except -1:
    return -1   # re-raises the exception _poll_signals left set

# the engine's cell codes; "_plain": FASTLN_CELL_PLAIN (8), the cell without LN;
# the LN LSTM's variants: "_sum" FASTLN_CELL_LN_SUM (32), "_per_gate"
# FASTLN_CELL_LN_GATE (64), "_carry_ln" FASTLN_CELL_CARRY_LN (128)
CELLS = {"rnn_tanh": 0, "rnn_relu": 1, "lstm": 2, "gru": 3,
         "rnn_tanh_plain": 8, "rnn_relu_plain": 9, "lstm_plain": 10, "gru_plain": 11,
         "gru_plain_reset_first": 27,
         "lstm_sum": 34, "lstm_per_gate": 66, "lstm_carry_ln": 130,
         "lstm_sum_carry_ln": 162, "lstm_per_gate_carry_ln": 194}

_SIZES = {}

def param_sizes(str cell, int64_t I, int64_t H, int64_t P=0):
    """Element counts of one layer's parameters, in fastln_rnn.h order (P: a
    plain LSTM's projection, W_hr (P, H) last)."""
    key = (cell, I, H, P)
    sizes = _SIZES.get(key)
    if sizes is None:
        if cell in ("lstm", "lstm_carry_ln"):
            sizes = (4 * H * I, 4 * H * H) + (4 * H,) * 5 + (H,) * 2
        elif cell.startswith(("lstm_sum", "lstm_per_gate")):
            sizes = (4 * H * I, 4 * H * H) + (4 * H,) * 3 + (H,) * 2
        elif cell == "gru":
            sizes = (3 * H * I, 3 * H * H) + (2 * H,) * 4 + (H,) * 4
        elif cell == "lstm_plain" and P:
            sizes = (4 * H * I, 4 * H * P, 4 * H, P * H)
        elif cell == "lstm_plain":
            sizes = (4 * H * I, 4 * H * H, 4 * H)
        elif cell.startswith("gru_plain"):
            sizes = (3 * H * I, 3 * H * H, 3 * H, H)
        elif cell.endswith("_plain"):
            sizes = (H * I, H * H, H)
        else:
            sizes = (H * I, H * H, H, H)
        if len(_SIZES) < 64:
            _SIZES[key] = sizes
    return sizes

def cache_size(str cell, int64_t T, int64_t B, int64_t H):
    return rnn_cache_size(CELLS[cell], T, B, H)

def work_size(str cell, int64_t T, int64_t B, int64_t H):
    return rnn_work_size(CELLS[cell], T, B, H)

cdef int _arr_list(void **dst, arrays, int tn, sizes, bint writable, str what) except -1:
    """dst[k] = the data of arrays[k], each checked against sizes[k]."""
    if len(arrays) != len(sizes):
        raise ValueError("internal: wrong number of " + what)
    for k in range(len(sizes)):
        _arr(arrays[k], tn, sizes[k], writable, what)
        dst[k] = cnp.PyArray_DATA(<cnp.ndarray>arrays[k])
    return 0

cdef int _params(fastln_rnn_args *a, params, int tn, sizes, int wtype) except -1:
    """a.params[k] = the data of params[k], each checked against sizes[k];
    a.wtype = wtype. The weight matrices (W_ih, W_hh, and a projection's W_hr
    after the bias) are bfloat16 bits (uint16) for W_BF16, int8 for W_INT8
    (then params ends with the matrices' row scales, float32, G each and P
    for W_hr, for a.scales and a.scale_hr), else they may be Fortran-ordered:
    then they go as transposed (a.transposed). a.input and a.proj are set."""
    cdef int k, n = len(sizes), nm = 3 if a.proj else 2
    cdef bint matrix
    cdef int64_t G = sizes[0] // a.input
    if len(params) != n + (nm if wtype == W_INT8 else 0):
        raise ValueError("internal: wrong number of params")
    a.wtype = wtype
    cdef int wtn = cnp.NPY_UINT16 if wtype == W_BF16 else cnp.NPY_INT8 if wtype == W_INT8 else tn
    for k in range(n):
        p = params[k]
        matrix = k < 2 or (a.proj and k == 3)
        if matrix and wtype == W_SAME and _fortran(p, tn) and not _fast(p, tn):
            if cnp.PyArray_SIZE(<cnp.ndarray>p) != sizes[k]:
                raise ValueError("internal: bad array for params")
            a.transposed |= FASTLN_RNN_W_IH_T if k == 0 else FASTLN_RNN_W_HH_T if k == 1 \
                else FASTLN_RNN_W_HR_T
        else:
            _arr(p, wtn if matrix else tn, sizes[k], False, "params")
        a.params[k] = cnp.PyArray_DATA(<cnp.ndarray>p)
    if wtype == W_INT8:
        for k in range(2):
            _arr(params[n + k], cnp.NPY_FLOAT, G, False, "scales")
            a.scales[k] = <const float *>cnp.PyArray_DATA(<cnp.ndarray>params[n + k])
        if a.proj:
            _arr(params[n + 2], cnp.NPY_FLOAT, a.proj, False, "scales")
            a.scale_hr = <const float *>cnp.PyArray_DATA(<cnp.ndarray>params[n + 2])
    return 0

cdef inline bint _fortran(object a, int tn) noexcept:
    """a is an aligned, Fortran-contiguous, native-order 2-D ndarray of type number tn."""
    return (type(a) is cnp.ndarray and cnp.PyArray_NDIM(<cnp.ndarray>a) == 2
            and cnp.PyArray_TYPE(<cnp.ndarray>a) == tn
            and cnp.PyArray_ISFARRAY_RO(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a))

cdef int _rnn_setup(fastln_rnn_args *a, str cell, int64_t T, int64_t B, int64_t I,
                    int64_t H, double eps, x, params, lengths, cache, bint cache_required,
                    int wtype=W_SAME, int64_t P=0) except -1:
    """Fills the sizes, parameters, x, lengths and cache of a; returns the type number.
    wtype: the storage of the weight matrices (see _params); P: a plain
    LSTM's projection, or 0."""
    cdef int tn = _float_type(x)
    if tn < 0 or T < 1 or B < 1 or I < 1 or H < 1 or P < 0:
        raise ValueError("internal: bad x or sizes")
    _arr(x, tn, T * B * I, False, "x")
    a.input, a.hidden, a.proj = I, H, P
    _params(a, params, tn, param_sizes(cell, I, H, P), wtype)
    if lengths is not None:
        _arr(lengths, cnp.NPY_INT64, B, False, "lengths")
    cdef int code = CELLS[cell]
    if cache is not None or cache_required:
        _arr(cache, tn, rnn_cache_size(code, T, B, H), True, "cache")
    a.cell = code
    a.steps, a.batch, a.input, a.hidden, a.eps = T, B, I, H, eps
    a.x = cnp.PyArray_DATA(<cnp.ndarray>x)
    a.lengths = <const int64_t *>_ptr(lengths)
    a.cache = _ptr(cache)
    a.interrupt = _poll_signals
    return tn

cdef int _rnn_status(int rc) except -1:
    if rc == FASTLN_EINTR:
        return _pending()
    return _check(rc)

cdef int _set_packed(fastln_rnn_args *a, packed) except -1:
    """a.packed = packed's data (None, or pack's array for a's cell and sizes)."""
    if packed is not None:
        _arr(packed, cnp.NPY_UINT8, cnp.PyArray_SIZE(<cnp.ndarray>packed), False, "packed")
        if cnp.PyArray_SIZE(<cnp.ndarray>packed) >= rnn_packed_size(
                a.cell, a.wtype, a.input, a.hidden, a.proj):
            a.packed = _ptr(packed)
    return 0

cdef int _rnn_fill_forward(fastln_rnn_args *a, str cell, int64_t T, int64_t B, int64_t I,
                           int64_t H, double eps, x, params, lengths, cache, y, h, c,
                           int d, int nd, int wtype=W_SAME, packed=None,
                           int64_t P=0) except -1:
    """a = direction d of nd (d = 1: reverse) of one layer forward: y (T, B,
    nd*W) takes its W columns at offset d*W, W = P (a projected LSTM) or H;
    h (B, W), c (B, H) are updated in place. wtype: the weights' storage (see
    _params); packed: None or pack's array."""
    memset(a, 0, sizeof(a[0]))
    cdef int tn = _rnn_setup(a, cell, T, B, I, H, eps, x, params, lengths, cache, False,
                             wtype, P)
    cdef int64_t W = P if P else H
    _set_packed(a, packed)
    _arr(y, tn, T * B * W * nd, True, "y")
    _arr(h, tn, B * W, True, "h")
    if cell.startswith("lstm"):
        _arr(c, tn, B * H, True, "c")
    a.y = <char *>_ptr(y) + d * W * cnp.PyArray_ITEMSIZE(<cnp.ndarray>y)
    a.h, a.c = _ptr(h), _ptr(c)
    a.reverse, a.ldy = d, W * nd
    return tn

def pack(str cell, int wtype, int64_t I, int64_t H, w_ih, w_hh, w_hr=None, int64_t P=0):
    """One layer's weights (stored as wtype) packed for the forward on the
    path in use (fastln_rnn_pack_proj), a uint8 array; None for float64
    weights, which each forward packs (or reads in place) itself. w_hr: a
    projected LSTM's W_hr (P, H), else None."""
    cdef int code = CELLS[cell], wt = wtype
    cdef int tn = cnp.NPY_UINT16 if wtype == W_BF16 else cnp.NPY_INT8 if wtype == W_INT8 \
        else _float_type(w_ih)
    if tn < 0 or I < 1 or H < 1 or P < 0 or (P > 0) != (w_hr is not None):
        raise ValueError("internal: bad weights for _rnn_pack")
    sizes = param_sizes(cell, I, H, P)
    _arr(w_ih, tn, sizes[0], False, "w_ih")
    _arr(w_hh, tn, sizes[1], False, "w_hh")
    if P:
        _arr(w_hr, tn, sizes[3], False, "w_hr")
    cdef int64_t n = rnn_packed_size(code, wt, I, H, P)
    if n <= 0 or tn == cnp.NPY_DOUBLE:
        return None
    buf = np.empty(n + 64, np.uint8)   # 64-byte aligned: the panels' rows are cache lines
    cdef int64_t skip = -<int64_t>cnp.PyArray_DATA(<cnp.ndarray>buf) & 63
    out = buf[skip:skip + n]
    cdef void *o = _ptr(out)
    cdef const void *wi = _ptr(w_ih)
    cdef const void *wh = _ptr(w_hh)
    cdef const void *wr = _ptr(w_hr)
    cdef int rc
    with nogil:
        rc = rnn_pack(o, n, code, wt, I, H, P, wi, wh, wr)
    _check(rc)
    return out

def forward(str cell, int64_t T, int64_t B, int64_t I, int64_t H, double eps,
                 x, params, lengths, cache, y, h, c, bint reverse=False, int wtype=W_SAME,
                 packed=None, int64_t P=0):
    """One layer forward: y (T,B,H), h and c (B,H, c for LSTM only) updated in place;
    with reverse, each sequence runs from its last valid step back to its first.
    wtype: the weights' storage (see _params); packed: None or pack's; P: a
    plain LSTM's projection (y and h then have P features)."""
    cdef fastln_rnn_args a
    cdef int tn = _rnn_fill_forward(&a, cell, T, B, I, H, eps, x, params, lengths, cache,
                                    y, h, c, 0, 1, wtype, packed, P)
    a.reverse = reverse
    cdef int rc
    with nogil:
        rc = rnn_forward_f32(&a) if tn == cnp.NPY_FLOAT else rnn_forward_f64(&a)
    return _rnn_status(rc)

def forward2(str cell, int64_t T, int64_t B, int64_t I, int64_t H, double eps,
                  x, params2, lengths, caches2, y, h2, c2, int wtype=W_SAME, packed2=None,
                  int64_t P=0):
    """Both directions of one layer forward (fastln_rnn_forward2): y (T,B,2H),
    or (T,B,2P) with a projection P; params2, caches2, h2, c2, packed2: a
    pair each (forward, reverse), caches2 and packed2 may be None."""
    cdef fastln_rnn_args a[2]
    cdef int tn = 0, d
    for d in range(2):
        tn = _rnn_fill_forward(&a[d], cell, T, B, I, H, eps, x, params2[d], lengths,
                               None if caches2 is None else caches2[d], y, h2[d],
                               None if c2 is None else c2[d], d, 2, wtype,
                               None if packed2 is None else packed2[d], P)
    cdef int rc
    with nogil:
        rc = rnn_forward2_f32(a) if tn == cnp.NPY_FLOAT else rnn_forward2_f64(a)
    return _rnn_status(rc)

cdef int _rnn_fill_backward(fastln_rnn_args *a, str cell, int64_t T, int64_t B, int64_t I,
                            int64_t H, double eps, x, params, lengths, cache, dy, dh, dc, dx,
                            grads, work, int d, int nd) except -1:
    """a = direction d of nd of one layer backward: dy (T, B, nd*H) read at
    column offset d*H; dh, dc (B,H) from the final to the initial state's
    gradient in place; dx (T,B,I) or None; grads filled (params' sizes);
    work: None or scratch of _rnn_work_size elements."""
    memset(a, 0, sizeof(a[0]))
    cdef int tn = _rnn_setup(a, cell, T, B, I, H, eps, x, params, lengths, cache, True)
    _arr(dy, tn, T * B * H * nd, False, "dy")
    _arr(dh, tn, B * H, True, "dh")
    if cell.startswith("lstm"):
        _arr(dc, tn, B * H, True, "dc")
    if dx is not None:
        _arr(dx, tn, T * B * I, True, "dx")
    _arr_list(a.grads, grads, tn, param_sizes(cell, I, H), True, "grads")
    if work is not None:
        _arr(work, tn, rnn_work_size(a.cell, T, B, H), True, "work")
    a.dy = <char *>_ptr(dy) + d * H * cnp.PyArray_ITEMSIZE(<cnp.ndarray>dy)
    a.dh, a.dc, a.dx, a.work = _ptr(dh), _ptr(dc), _ptr(dx), _ptr(work)
    a.reverse, a.ldy = d, H * nd
    return tn

def backward(str cell, int64_t T, int64_t B, int64_t I, int64_t H, double eps,
                  x, params, lengths, cache, dy, dh, dc, dx, grads, work=None,
                  bint reverse=False):
    """One layer backward (see _rnn_fill_backward), of a forward run with reverse."""
    cdef fastln_rnn_args a
    cdef int tn = _rnn_fill_backward(&a, cell, T, B, I, H, eps, x, params, lengths, cache,
                                     dy, dh, dc, dx, grads, work, 0, 1)
    a.reverse = reverse
    cdef int rc
    with nogil:
        rc = rnn_backward_f32(&a) if tn == cnp.NPY_FLOAT else rnn_backward_f64(&a)
    return _rnn_status(rc)

def backward2(str cell, int64_t T, int64_t B, int64_t I, int64_t H, double eps,
                   x, params2, lengths, caches2, dy, dh2, dc2, dx, grads2, works2):
    """Both directions of one layer backward (fastln_rnn_backward2): dy (T,B,2H);
    dx receives the sum of the two directions' input gradients; the other
    arguments a pair each (forward, reverse), dc2 None without a cell state."""
    cdef fastln_rnn_args a[2]
    cdef int tn = 0, d
    for d in range(2):
        tn = _rnn_fill_backward(&a[d], cell, T, B, I, H, eps, x, params2[d], lengths,
                                caches2[d], dy, dh2[d], None if dc2 is None else dc2[d],
                                dx if d == 0 else None, grads2[d], works2[d], d, 2)
    cdef int rc
    with nogil:
        rc = rnn_backward2_f32(a) if tn == cnp.NPY_FLOAT else rnn_backward2_f64(a)
    return _rnn_status(rc)


# ---- the compiled step --------------------------------------------------------

cpdef bint immutable(object a):
    """Whether no write can reach a's data: a and every array it views are
    read-only, down to memory owned by a bytes object. A read-only array
    that owns its memory is not: a writable view made before it became
    read-only still writes to it, and its writeable flag can be set again."""
    while isinstance(a, cnp.ndarray):
        if cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a):
            return False
        a = a.base
    return type(a) is bytes


@cython.auto_pickle(False)   # a Step holds pointers: a model rebuilds its own
cdef class Step:
    """A model's step, compiled: every layer's arguments checked and filled
    once, then one call into the engine (fastln_rnn_step_*) per step.

    Step(cell, I, H, eps, layers, packs, wtype, bf16, keys, owners, P=0):
    layers[k] is layer k's list of parameter arrays (as forward takes them),
    packs[k] None or its pack() array; P a plain LSTM's projection (h and y
    then have P features, c H); wtype the weights' storage (see _params); bf16
    None, or the bfloat16 dtype of a bfloat16 model (its y is bfloat16); keys
    the model's params keys the step reads and owners the arrays they held
    when it was built (kept, and compared by valid()). The weights of a
    layer that reads a packed copy are "locked": the copy is valid while
    they stay immutable.
    """
    cdef fastln_rnn_args *layers
    cdef readonly int64_t num_layers, input_size, hidden_size, out_size   # out: h's, y's
    cdef int tn
    cdef bint lstm
    cdef object keys, owners, keep, locked, bf16
    cdef list spare

    def __cinit__(self, str cell, int64_t I, int64_t H, double eps, list layers, list packs,
                  int wtype, bf16, list keys, list owners, int64_t P=0):
        cdef int64_t nl = len(layers), k
        if nl < 1 or len(packs) != nl or I < 1 or H < 1 or P < 0:
            raise ValueError("internal: bad layers for Step")
        self.layers = <fastln_rnn_args *>PyMem_Malloc(nl * sizeof(fastln_rnn_args))
        if self.layers == NULL:
            raise MemoryError()
        self.num_layers, self.input_size, self.hidden_size = nl, I, H
        self.out_size = P if P else H
        self.tn = cnp.NPY_FLOAT if wtype != W_SAME else _float_type(layers[0][2])
        if self.tn < 0:
            raise ValueError("internal: bad parameters for Step")
        self.lstm = cell.startswith("lstm")
        for k in range(nl):
            a = &self.layers[k]
            memset(a, 0, sizeof(a[0]))
            a.cell = CELLS[cell]
            a.input, a.hidden, a.eps, a.proj = I if k == 0 else self.out_size, H, eps, P
            _params(a, layers[k], self.tn, param_sizes(cell, a.input, H, P), wtype)
            _set_packed(a, packs[k])
        self.keys, self.owners, self.bf16 = keys, owners, bf16
        self.spare = []
        self.keep = (layers, packs)
        per = len(owners) // nl   # each layer's keys, W_ih and W_hh first
        self.locked = [owners[k * per + m] for k in range(nl) if packs[k] is not None
                       for m in (0, 1)]

    def __dealloc__(self):
        PyMem_Free(self.layers)

    def valid(self, params):
        """Whether params holds the arrays the step was built from, and the
        weights it keeps packed are still immutable."""
        return self._valid(params)

    def __call__(self, params, x, state, out=None, state_out=None):
        """A model's step() in its common case, in one call: params valid,
        x an aligned, C-contiguous (B, I) array of the state's dtype, B >= 1;
        state None (zeros), h or (h, c): such arrays of shape (num_layers,
        B, H); out None or a writable such (B, H) array of the model's
        dtype; state_out None or writable arrays in the form of state.
        Returns (y, state), in out and state_out or new arrays; None when a
        condition fails (step() then takes its general path)."""
        if not (self._valid(params) and _fast(x, self.tn)
                and cnp.PyArray_NDIM(<cnp.ndarray>x) == 2
                and cnp.PyArray_DIM(<cnp.ndarray>x, 1) == self.input_size
                and cnp.PyArray_DIM(<cnp.ndarray>x, 0) > 0):
            return None
        cdef cnp.npy_intp dims[3]   # of h and y; c's: cdims
        cdef cnp.npy_intp cdims[3]
        dims[0], dims[1], dims[2] = self.num_layers, cnp.PyArray_DIM(<cnp.ndarray>x, 0), \
            self.out_size
        cdims[0], cdims[1], cdims[2] = dims[0], dims[1], self.hidden_size
        if out is not None and not (
                type(out) is cnp.ndarray and cnp.PyArray_ISCARRAY(<cnp.ndarray>out)
                and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>out)
                and cnp.PyArray_NDIM(<cnp.ndarray>out) == 2
                and cnp.PyArray_DIM(<cnp.ndarray>out, 0) == dims[1]
                and cnp.PyArray_DIM(<cnp.ndarray>out, 1) == dims[2]
                and (out.dtype == self.bf16 if self.bf16 is not None
                     else cnp.PyArray_TYPE(<cnp.ndarray>out) == self.tn)):
            return None        # checked before state_out is written: a refusal writes nothing
        h_in = c_in = h = c = None
        if state is not None:
            if not self._parts(state, dims, cdims, False):
                return None
            h_in, c_in = (state[0], state[1]) if self.lstm else (state, None)
        if state_out is not None:
            if not self._parts(state_out, dims, cdims, True):
                return None
            h, c = (state_out[0], state_out[1]) if self.lstm else (state_out, None)
            if state is None:
                cnp.PyArray_FILLWBYTE(<cnp.ndarray>h, 0)
                if self.lstm:
                    cnp.PyArray_FILLWBYTE(<cnp.ndarray>c, 0)
        else:
            h = cnp.PyArray_EMPTY(3, dims, self.tn, 0) if state is not None else \
                cnp.PyArray_ZEROS(3, dims, self.tn, 0)
            if self.lstm:
                c = cnp.PyArray_EMPTY(3, cdims, self.tn, 0) if state is not None else \
                    cnp.PyArray_ZEROS(3, cdims, self.tn, 0)
        cdef int64_t n = dims[1] * dims[2]
        if self.bf16 is not None:   # float32 y from the spare arrays, rounded into out
            y = self._spare_y(n)
        else:
            y = out if out is not None else cnp.PyArray_EMPTY(2, &dims[1], self.tn, 0)
        # every array is checked above (or made here): straight to the engine
        cdef fastln_rnn_step_args st
        memset(&st, 0, sizeof(st))
        st.layers, st.num_layers, st.batch, st.table_rows = self.layers, self.num_layers, \
            dims[1], dims[1]
        st.x, st.y, st.h, st.c = _ptr(x), _ptr(y), _ptr(h), _ptr(c)
        st.h_in, st.c_in = _ptr(h_in), _ptr(c_in)
        if self.bf16 is None:
            self._call(&st)
            return y, ((h, c) if self.lstm else h)
        try:
            self._call(&st)
            if out is None:
                out = np.empty((dims[1], dims[2]), self.bf16)
            self._round(out, y, n)
        finally:
            self.spare.append(y)
        return out, ((h, c) if self.lstm else h)

    cdef object _spare_y(self, int64_t n):
        """A float32 array of at least n values for a bfloat16 model's y,
        taken from the spare ones (the caller puts it back): a loop of steps
        allocates none after its first, and each of several threads stepping
        at once holds its own."""
        cdef cnp.npy_intp size = n
        while self.spare:
            a = self.spare.pop()
            if cnp.PyArray_SIZE(<cnp.ndarray>a) >= n:
                return a
        return cnp.PyArray_EMPTY(1, &size, cnp.NPY_FLOAT, 0)

    cdef bint _parts(self, state, cnp.npy_intp *dims, cnp.npy_intp *cdims, bint writable):
        """Whether state is h, or (h, c) for an LSTM, of arrays the fast path
        takes (writable ones for an output): h of dims, c of cdims."""
        if self.lstm:
            if type(state) is not tuple or len(<tuple>state) != 2:
                return False
            return (self._state_ok(state[0], dims, writable)
                    and self._state_ok(state[1], cdims, writable))
        return self._state_ok(state, dims, writable)

    cdef bint _state_ok(self, a, cnp.npy_intp *dims, bint writable):
        return (_fast(a, self.tn) and cnp.PyArray_NDIM(<cnp.ndarray>a) == 3
                and (not writable or cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a))
                and cnp.PyArray_DIM(<cnp.ndarray>a, 0) == dims[0]
                and cnp.PyArray_DIM(<cnp.ndarray>a, 1) == dims[1]
                and cnp.PyArray_DIM(<cnp.ndarray>a, 2) == dims[2])

    cdef void _round(self, out, y, int64_t n):
        """The first n float32 values of y rounded to bfloat16 into out."""
        cdef void *d = cnp.PyArray_DATA(<cnp.ndarray>out)
        cdef const void *s = cnp.PyArray_DATA(<cnp.ndarray>y)
        with nogil:
            to_bf16(d, s, n)

    cdef bint _valid(self, params):
        """valid(): a params that is not a dict is never taken as the same
        (each call then compiles anew: slower, still right)."""
        if not isinstance(params, dict):
            return False
        cdef Py_ssize_t i, n = len(self.keys)
        for i in range(n):
            if PyDict_GetItem(params, self.keys[i]) is not <void *>self.owners[i]:
                return False
        for a in self.locked:
            if not immutable(a):
                return False
        return True

    def run(self, int64_t B, x, h_in, c_in, y, h, c):
        """One step of B rows: x (B, I) -> y (B, W), W = out_size; the state
        (num_layers, B, W) and (num_layers, B, H) goes from h_in, c_in (None:
        h, c hold it) into h, c."""
        cdef fastln_rnn_step_args s
        cdef int64_t n = self.num_layers * B * self.out_size
        cdef int64_t nc = self.num_layers * B * self.hidden_size
        memset(&s, 0, sizeof(s))
        _arr(x, self.tn, B * self.input_size, False, "x")
        _arr(y, self.tn, B * self.out_size, True, "y")
        _arr(h, self.tn, n, True, "h")
        if h_in is not None:
            _arr(h_in, self.tn, n, False, "h_in")
        if self.lstm:
            _arr(c, self.tn, nc, True, "c")
            if c_in is not None:
                _arr(c_in, self.tn, nc, False, "c_in")
            s.c, s.c_in = _ptr(c), _ptr(c_in)
        s.layers, s.num_layers, s.batch, s.table_rows = self.layers, self.num_layers, B, B
        s.h, s.h_in = _ptr(h), _ptr(h_in)
        s.x, s.y = _ptr(x), _ptr(y)
        return self._call(&s)

    def table(self, x, rows, h, c, y):
        """One step of the streams at rows (B) of the state tables h
        (num_layers, S, W), c (num_layers, S, H): x (B, I) -> y (B, W), W =
        out_size; the rows are distinct."""
        cdef fastln_rnn_step_args s
        memset(&s, 0, sizeof(s))
        if not _fast(rows, cnp.NPY_INT64):
            raise ValueError("internal: bad rows")
        cdef int64_t B = cnp.PyArray_SIZE(<cnp.ndarray>rows)
        cdef int64_t per = self.num_layers * self.out_size
        if not _fast(h, self.tn) or cnp.PyArray_SIZE(<cnp.ndarray>h) % per:
            raise ValueError("internal: bad h table")
        cdef int64_t S = cnp.PyArray_SIZE(<cnp.ndarray>h) // per
        _arr(h, self.tn, S * per, True, "h")
        if self.lstm:
            _arr(c, self.tn, S * self.num_layers * self.hidden_size, True, "c")
            s.c = _ptr(c)
        _arr(x, self.tn, B * self.input_size, False, "x")
        _arr(y, self.tn, B * self.out_size, True, "y")
        s.layers, s.num_layers, s.batch, s.table_rows = self.layers, self.num_layers, B, S
        s.rows = <const int64_t *>_ptr(rows)
        s.h, s.x, s.y = _ptr(h), _ptr(x), _ptr(y)
        return self._call(&s)

    cdef int _call(self, fastln_rnn_step_args *s) except -1:
        cdef int rc
        with nogil:
            rc = rnn_step_f32(s) if self.tn == cnp.NPY_FLOAT else rnn_step_f64(s)
        return _check(rc)
