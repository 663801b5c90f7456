# cython: language_level=3, boundscheck=False, wraparound=False, binding=True, embedsignature=True
"""The fused residual add and normalization, forward and backward: four of
fastln's public functions.

:mod:`fastln` re-exports :func:`add_layer_norm`, :func:`add_rms_norm` and
their backward functions from here. The forwards take a fast path where x and
the residual are C-contiguous, aligned, native-order float32 or float64
arrays of one shape normalized over the last axis, with no input bias and
with weight, bias and the outputs of the matching type and layout; it calls
one kernel of fastln._rows. Anything else, and the backward functions, go to
fastln._general.

Imports fastln._rows, fastln._norms, fastln._general and fastln._validate.
"""
cimport numpy as cnp

from fastln._ndarray cimport (
    _fast, _fast_eps, _fast_out, _fast_vec, _float_type, _last_axis, _overlap_any,
    _overlap_partly, _same_shape)
from fastln._norms cimport check_flag
from fastln._rows cimport add_fwd, empty_like

cnp.import_array()

from fastln import _general, _validate


# ---- the fast path -----------------------------------------------------------

cdef inline bint _fast_add_out(object o, cnp.ndarray x, object res, int tn, object w,
                               object b) noexcept:
    """An output of add_layer_norm's fast path: None, or a fast out of x's shape
    that is x or the residual itself or overlaps neither, nor weight or bias."""
    return o is None or (_fast_out(o, x, tn, (w, b))
                         and not _overlap_partly(<cnp.ndarray>o, <cnp.ndarray>res))


cdef object _add_fast(bint rms, x, residual, input_bias, weight, bias, axis, eps, out,
                      bint return_stats):
    """The fast path of add_layer_norm (add_rms_norm with rms): C-contiguous
    float32/float64 x and residual of one shape, over the last axis, no input
    bias, fast outputs; its result, or None where it does not apply."""
    cdef int tn = _float_type(x)
    cdef cnp.ndarray xa, y, s
    cdef int nd
    cdef cnp.npy_intp H, N
    y_out = s_out = None
    if out is None or type(out) is cnp.ndarray:
        y_out = out
    elif type(out) is tuple and len(out) == 2:
        y_out, s_out = out
    else:
        return None
    if tn < 0 or input_bias is not None:
        return None
    xa = <cnp.ndarray>x
    nd = cnp.PyArray_NDIM(xa)
    H = cnp.PyArray_DIM(xa, nd - 1)
    if not (H > 0 and _last_axis(axis, nd) and _fast(residual, tn)
            and _same_shape(xa, residual, nd) and _fast_eps(eps)
            and _fast_vec(weight, tn, H) and _fast_vec(bias, tn, H)
            and _fast_add_out(y_out, xa, residual, tn, weight, bias)
            and _fast_add_out(s_out, xa, residual, tn, weight, bias)
            and (y_out is None or s_out is None
                 or not _overlap_any(<cnp.ndarray>y_out, <cnp.ndarray>s_out))):
        return None
    N = cnp.PyArray_SIZE(xa) // H
    y = empty_like(xa, nd, tn) if y_out is None else <cnp.ndarray>y_out
    s = empty_like(xa, nd, tn) if s_out is None else <cnp.ndarray>s_out
    if not return_stats:
        add_fwd(tn, rms, y, s, None, None, xa, residual, N, None, weight, bias, N, H, eps)
        return y, s
    mean = None if rms else empty_like(xa, nd - 1, tn)
    rstd = empty_like(xa, nd - 1, tn)
    add_fwd(tn, rms, y, s, mean, rstd, xa, residual, N, None, weight, bias, N, H, eps)
    return (y, s, rstd) if rms else (y, s, mean, rstd)


# ---- the public functions: the fast path, else fastln._general ---------------

def add_layer_norm(x, residual, weight=None, bias=None, *, input_bias=None, axis=-1, eps=1e-5,
                   out=None, return_stats=False):
    """Fused residual add and layer norm: ``s = x + residual (+ input_bias)``, ``y = layer_norm(s)``.

    One pass over memory: s is written and normalized while it is in cache,
    and y is bitwise ``layer_norm(s)`` (in float16 and bfloat16, y is the
    norm of the float32 sum, and s that sum rounded once). This is ONNX Runtime's
    SkipLayerNormalization (x its input, residual its skip, input_bias its
    bias), and the post-norm residual block of a transformer.

    Parameters
    ----------
    x, residual : array_like
        The two summands. residual has x's shape, or broadcasts to it over
        the batch (non-normalized) axes only, as a skip of shape (S, H)
        against x of (B, S, H) does. Each takes the dtype rules of
        :func:`layer_norm`; where they differ, the sum is computed in the
        promotion of their compute dtypes, and y and s take
        ``np.result_type`` of the dtypes each alone would give (float16 with
        float32 gives float32; float32 with an integer array gives float64).
        Torch tensors as in :func:`layer_norm`.
    weight, bias : array_like, optional
        Gain and bias of the normalized shape; None means 1 and 0.
    input_bias : array_like, optional
        A vector of the normalized shape added into s, as
        ``(x + residual) + input_bias``: the bias of the dense layer that
        produced x.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.
    out : ndarray or tuple, optional
        y's buffer, or a tuple ``(y_out, s_out)`` (either may be None). Each
        must be a writable plain ndarray of x's shape and the result dtype,
        or a CPU torch tensor (written and returned as in :func:`layer_norm`);
        the two must not overlap each other, but may be ``x`` and
        ``residual`` (``out=(x, residual)`` works in place). With both given,
        nothing is allocated that grows with x (statistics aside).
    return_stats : bool, default False
        Also return the ``mean`` and ``rstd`` of s, as :func:`layer_norm`.

    Returns
    -------
    y : ndarray
        ``layer_norm(s)``.
    s : ndarray
        ``x + residual``, of x's shape, in y's dtype.
    mean, rstd : ndarray
        Only with ``return_stats=True``: s's statistics, of x's shape without
        the normalized axes, in the compute dtype.

    Raises
    ------
    TypeError
        As :func:`layer_norm`, for residual too; ``out`` neither an ndarray
        nor a 2-tuple.
    ValueError
        As :func:`layer_norm`; residual not broadcasting to x's shape over
        the batch axes; input_bias not of the normalized shape; y_out and
        s_out overlapping each other.

    See Also
    --------
    add_layer_norm_backward : its gradients.
    add_rms_norm : the same with RMSNorm.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.]])
    >>> residual = np.array([[0., 2., 4.]])
    >>> y, s = fastln.add_layer_norm(x, residual)
    >>> s
    array([[1., 4., 7.]])
    >>> np.array_equal(y, fastln.layer_norm(s))
    True
    >>> y, s = fastln.add_layer_norm(x, residual, input_bias=[1., 1., 1.])
    >>> s
    array([[2., 5., 8.]])
    """
    check_flag(return_stats, "return_stats")
    r = _add_fast(False, x, residual, input_bias, weight, bias, axis, eps, out, return_stats)
    if r is not None:
        return r
    return _general.add_norm(False, x, residual, input_bias, weight, bias, axis, eps, out,
                             return_stats)


@_validate.hide_bias
def add_rms_norm(x, residual, weight=None, *bias, input_bias=None, axis=-1, eps=1e-6, out=None,
                 return_stats=False):
    """Fused residual add and RMS norm: ``s = x + residual (+ input_bias)``, ``y = rms_norm(s)``.

    One pass over memory, as :func:`add_layer_norm`: y is bitwise
    ``rms_norm(s)`` (in float16 and bfloat16, the norm of the float32 sum).
    This is ONNX Runtime's SkipSimplifiedLayerNormalization,
    the pre-norm residual block of Llama-style models: s is the residual
    stream that goes on, y the normalized input of the next layer.

    Parameters
    ----------
    x, residual : array_like
        The two summands, as in :func:`add_layer_norm`: residual has x's
        shape or broadcasts to it over the batch axes. float16 and bfloat16
        (ml_dtypes) storage as in :func:`layer_norm`.
    weight : array_like, optional
        Gain of the normalized shape; None means 1.
    input_bias : array_like, optional
        A vector of the normalized shape added into s, as
        ``(x + residual) + input_bias``.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-6
        Added to the mean square; finite and >= 0.
    out : ndarray or tuple, optional
        y's buffer, or a tuple ``(y_out, s_out)``, as in
        :func:`add_layer_norm`.
    return_stats : bool, default False
        Also return ``rstd``, the reciprocal root mean square of s.

    Returns
    -------
    y : ndarray
        ``rms_norm(s)``.
    s : ndarray
        ``x + residual (+ input_bias)``, of x's shape, in y's dtype.
    rstd : ndarray
        Only with ``return_stats=True``: of x's shape without the normalized
        axes, in the compute dtype.

    Raises
    ------
    TypeError, ValueError
        As :func:`add_layer_norm`.
    TypeError
        A fourth positional argument: RMSNorm has no bias, and the message
        names :func:`add_layer_norm`, which takes one.

    See Also
    --------
    add_rms_norm_backward : its gradients.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.], [4., 5., 6.]], np.float32)
    >>> y, s = fastln.add_rms_norm(x, np.ones(3, np.float32))   # one residual row for both
    >>> s
    array([[2., 3., 4.],
           [5., 6., 7.]], dtype=float32)
    >>> np.array_equal(y, fastln.rms_norm(s))
    True
    """
    if bias:
        _validate.no_bias(add_rms_norm, bias)
    check_flag(return_stats, "return_stats")
    r = _add_fast(True, x, residual, input_bias, weight, None, axis, eps, out, return_stats)
    if r is not None:
        return r
    return _general.add_norm(True, x, residual, input_bias, weight, None, axis, eps, out,
                             return_stats)


def add_layer_norm_backward(dy, s, mean, rstd, weight=None, *, ds=None, axis=-1, out=None,
                            input_bias_grad=False, residual_shape=None):
    """The gradients of :func:`add_layer_norm`, in one sweep.

    With ``y, s, mean, rstd = add_layer_norm(x, residual, weight, bias,
    input_bias=..., return_stats=True)`` and a loss L, given ``dy = dL/dy``
    (and ``ds``, a gradient of L that reaches s by another way, such as the
    residual stream of a pre-norm block), the gradient of the sum is
    ``dsum = layer_norm_backward(dy, s, mean, rstd, weight)[0] + ds``, and it
    is the gradient of x and of the residual. Deterministic: bitwise the same
    on any thread count.

    Parameters
    ----------
    dy : array_like
        Gradient of y, of s's shape.
    s, mean, rstd : array_like
        The sum and its statistics, as add_layer_norm returned them.
    weight : array_like, optional
        The gain the forward used; None means 1.
    ds : array_like, optional
        An incoming gradient of s, of s's shape, added into dsum.
    axis : int or tuple of int, default -1
        The normalized axes, as in the forward.
    out : ndarray or torch.Tensor, optional
        dsum's buffer: a writable ndarray of s's shape and dsum's dtype, or a
        CPU torch tensor (written and returned as in :func:`layer_norm`). It
        may be dy or ds (in place).
    input_bias_grad : bool, default False
        Also return the gradient of ``input_bias``: dsum summed over the
        batch axes, reduced as dweight is.
    residual_shape : tuple of int, optional
        The shape of a residual that broadcast in the forward: also return
        its gradient, dsum summed over the broadcast axes. (dsum itself when
        it is s's shape.)

    Returns
    -------
    dsum : ndarray
        Gradient of x and of a residual of x's shape: s's shape and dtype
        (float16 and bfloat16 are computed in float32 and rounded once).
    dweight, dbias : ndarray
        Gradients of weight and bias, of the normalized shape.
    dinput_bias : ndarray
        Only with ``input_bias_grad=True``.
    dresidual : ndarray
        Only with ``residual_shape``: of that shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm_backward`, for ds too; input_bias_grad not a
        bool; residual_shape not broadcasting to s's shape over its batch
        axes.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> rng = np.random.default_rng(0)
    >>> x, r = rng.standard_normal((2, 4, 8)), rng.standard_normal((4, 8))
    >>> y, s, mean, rstd = fastln.add_layer_norm(x, r, return_stats=True)
    >>> dy, ds = rng.standard_normal(y.shape), rng.standard_normal(y.shape)
    >>> dsum, dw, db, dr = fastln.add_layer_norm_backward(
    ...     dy, s, mean, rstd, ds=ds, residual_shape=r.shape)
    >>> dx, _, _ = fastln.layer_norm_backward(dy, s, mean, rstd)
    >>> np.allclose(dsum, dx + ds), np.allclose(dr, dsum.sum(axis=0))
    (True, True)
    """
    check_flag(input_bias_grad, "input_bias_grad")
    return _general.add_norm_backward(False, dy, s, mean, rstd, weight, ds, axis, out,
                                      input_bias_grad, residual_shape)


def add_rms_norm_backward(dy, s, rstd, weight=None, *, ds=None, axis=-1, out=None,
                          input_bias_grad=False, residual_shape=None):
    """The gradients of :func:`add_rms_norm`, in one sweep.

    ``dsum = rms_norm_backward(dy, s, rstd, weight)[0] + ds``, the gradient
    of x and of the residual, as :func:`add_layer_norm_backward` describes.

    Parameters
    ----------
    dy : array_like
        Gradient of y, of s's shape.
    s, rstd : array_like
        The sum and its rstd, as add_rms_norm returned them.
    weight : array_like, optional
        The gain the forward used; None means 1.
    ds : array_like, optional
        An incoming gradient of s, added into dsum.
    axis : int or tuple of int, default -1
        The normalized axes, as in the forward.
    out : ndarray or torch.Tensor, optional
        dsum's buffer, as in :func:`add_layer_norm_backward`.
    input_bias_grad : bool, default False
        Also return the gradient of ``input_bias``.
    residual_shape : tuple of int, optional
        Also return the gradient of a residual of this (broadcast) shape.

    Returns
    -------
    dsum : ndarray
        Gradient of x and of a residual of x's shape.
    dweight : ndarray
        Gradient of weight, of the normalized shape.
    dinput_bias : ndarray
        Only with ``input_bias_grad=True``.
    dresidual : ndarray
        Only with ``residual_shape``.

    Raises
    ------
    TypeError, ValueError
        As :func:`add_layer_norm_backward`.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> rng = np.random.default_rng(0)
    >>> x, r = rng.standard_normal((4, 8)), rng.standard_normal((4, 8))
    >>> y, s, rstd = fastln.add_rms_norm(x, r, return_stats=True)
    >>> dy = rng.standard_normal(y.shape)
    >>> dsum, dw, dbi = fastln.add_rms_norm_backward(dy, s, rstd, input_bias_grad=True)
    >>> np.allclose(dbi, dsum.sum(axis=0))
    True
    """
    check_flag(input_bias_grad, "input_bias_grad")
    return _general.add_norm_backward(True, dy, s, None, rstd, weight, ds, axis, out,
                                      input_bias_grad, residual_shape)
