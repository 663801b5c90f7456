# cython: language_level=3, boundscheck=False, wraparound=False, binding=True, embedsignature=True
"""LayerNorm and RMSNorm, forward and backward: four of fastln's public functions.

:mod:`fastln` re-exports :func:`layer_norm`, :func:`layer_norm_backward`,
:func:`rms_norm` and :func:`rms_norm_backward` from here.

Each takes a fast path for the common case: a C-contiguous, aligned,
native-order array normalized over its last axis (float32 or float64; for the
forwards also float16 or bfloat16 storage), with weight, bias, statistics and
out of the matching type and layout. There it checks shapes and overlaps,
allocates the outputs and calls one kernel of fastln._rows. Anything else goes
to fastln._general, which canonicalizes the arguments (axes, layouts, dtypes,
out=) and raises the errors. No math lives here.

Imports fastln._rows, fastln._general and fastln._validate; fastln._add_norms
cimports check_flag (fastln/_norms.pxd).
"""
from libc.stdint cimport int64_t
cimport numpy as cnp

from fastln._ndarray cimport (
    _fast, _fast_eps, _fast_out, _fast_vec, _float_type, _last_axis, _overlap_partly, _same_shape)
from fastln._rows cimport empty_like, kernel_code, ln_bwd, ln_fwd, rms_bwd, rms_fwd

cnp.import_array()

from fastln import _general, _validate


cdef int check_flag(object v, str name) except -1:
    """v is a flag: True or False passes at once; anything else goes to
    fastln._validate.flag (NumPy's bools pass, other values are a TypeError)."""
    if v is not True and v is not False:
        _validate.flag(v, name)
    return 0


# ---- the fast paths ----------------------------------------------------------

cdef object _norm(bint rms, x, weight, bias, axis, eps, out, bint return_stats):
    """The fast path of layer_norm (rms_norm with rms: bias None): its result,
    or None where it does not apply."""
    cdef int tn, vt
    cdef int code = kernel_code(x, &tn, &vt)
    if code < 0:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(xa)
    cdef cnp.npy_intp H = cnp.PyArray_DIM(xa, nd - 1)
    if not (H > 0 and _last_axis(axis, nd) and _fast_eps(eps) and _fast_vec(weight, vt, H)
            and _fast_vec(bias, vt, H)
            and (out is None or _fast_out(out, xa, tn, (weight, bias)))):
        return None
    cdef int64_t N = cnp.PyArray_SIZE(xa) // H
    y = empty_like(xa, nd, tn) if out is None else out
    mean = empty_like(xa, nd - 1, vt) if return_stats and not rms else None
    rstd = empty_like(xa, nd - 1, vt) if return_stats else None
    if rms:
        rms_fwd(code, y, rstd, xa, weight, N, H, eps)
    else:
        ln_fwd(code, y, mean, rstd, xa, weight, bias, N, H, eps)
    if not return_stats:
        return y
    return (y, rstd) if rms else (y, mean, rstd)


cdef object _norm_backward(bint rms, dy, x, mean, rstd, weight, axis, out):
    """The fast path of layer_norm_backward (rms_norm_backward with rms: mean
    None): its result, or None where it does not apply."""
    cdef int tn = _float_type(x)
    if tn < 0:
        return None
    cdef cnp.ndarray xa = <cnp.ndarray>x
    cdef int nd = cnp.PyArray_NDIM(xa)
    cdef cnp.npy_intp H = cnp.PyArray_DIM(xa, nd - 1)
    if not (H > 0 and _last_axis(axis, nd) and _fast(dy, tn) and _same_shape(xa, dy, nd)
            and (rms or (_fast(mean, tn) and _same_shape(xa, mean, nd - 1)))
            and _fast(rstd, tn) and _same_shape(xa, rstd, nd - 1) and _fast_vec(weight, tn, H)
            and (out is None or (_fast_out(out, xa, tn, (mean, rstd, weight))
                                 and not _overlap_partly(<cnp.ndarray>out, dy)))):
        return None
    cdef int64_t N = cnp.PyArray_SIZE(xa) // H
    dx = empty_like(xa, nd, tn) if out is None else out
    dw = cnp.PyArray_EMPTY(1, &H, tn, 0)
    if rms:
        rms_bwd(tn, dx, dw, dy, xa, rstd, weight, N, H)
        return dx, dw
    db = cnp.PyArray_EMPTY(1, &H, tn, 0)
    ln_bwd(tn, dx, dw, db, dy, xa, mean, rstd, weight, N, H)
    return dx, dw, db


# ---- the public functions: the fast path, else fastln._general ---------------

def layer_norm(x, weight=None, bias=None, *, axis=-1, eps=1e-5, out=None,
               return_stats=False):
    """Layer normalization (Ba, Kiros & Hinton, 2016) over ``axis``.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, with the mean and the
    (biased) variance of each sample taken over the normalized axes.

    Parameters
    ----------
    x : array_like
        Input, at least 1-D, in any layout (strided, Fortran-order, read-only
        and byte-swapped arrays and lists are accepted). float32 and float64
        keep their dtype; float16 and bfloat16 compute in float32 and return
        their own dtype; integers and bool compute in float64 and return
        float64. A CPU torch tensor is read as an array and the result is a
        NumPy array (fastln has no autograd): one that requires grad raises
        TypeError (pass ``x.detach()``).
    weight, bias : array_like, optional
        Gain and bias with the normalized shape (the sizes of ``axis``, in the
        order given), of a real dtype; cast to the compute dtype. None means
        1 and 0.
    axis : int or tuple of int, default -1
        The normalized axes; negative values count from the end. The other
        (batch) axes are independent samples.
    eps : float, default 1e-5
        Added to the variance; finite and >= 0.
    out : ndarray or torch.Tensor, optional
        Where to write y: a plain ndarray of x's shape and y's dtype,
        writable, in any layout. May be ``x`` itself (in place). A CPU torch
        tensor (not requiring grad) is written through the ndarray that
        shares its memory (``out.numpy()``), and that ndarray is returned.
        Input that is not C-contiguous rows of the compute dtype is copied a
        block of rows at a time (a few MiB), so with ``out`` nothing is
        allocated that grows with x (statistics aside).
    return_stats : bool, default False
        Also return the statistics ``mean`` and ``rstd`` that
        :func:`layer_norm_backward` takes.

    Returns
    -------
    y : ndarray
        x's shape, in the dtype given above; ``out`` itself when given (for a
        torch tensor, the ndarray sharing its memory).
    mean, rstd : ndarray
        Only with ``return_stats=True``: each sample's mean and
        ``1 / sqrt(var + eps)``, of x's shape without the normalized axes, in
        the compute dtype (float32 for float16, bfloat16 and float32 input;
        float64 for float64, integer and bool input).

    Raises
    ------
    TypeError
        x, weight or bias of a dtype that is not a real number type (complex,
        object, str, ...); eps not a real number (or a bool); axis not an int
        or a tuple of ints; ``out`` not a plain ndarray or a CPU torch
        tensor, a tensor that requires grad, or of another dtype than y's;
        return_stats not a bool.
    ValueError
        x 0-d, or of size 0 along a normalized axis; an axis out of range or
        repeated; weight or bias not of the normalized shape; eps negative or
        not finite; ``out`` of another shape than x's, or read-only.

    Notes
    -----
    C-contiguous, aligned, native-order float32/float64 input normalized over
    the last axis (with weight, bias and out of the same dtype and layout)
    takes the fast path without a copy. The variance is centered (two passes
    over each row); a NaN or inf stays in its row (see the README's guarantees).
    An x without samples (a batch axis of size 0) gives empty results.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.], [2., 4., 6.]], np.float32)
    >>> np.round(fastln.layer_norm(x), 4)
    array([[-1.2247,  0.    ,  1.2247],
           [-1.2247,  0.    ,  1.2247]], dtype=float32)
    >>> y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    >>> mean
    array([2., 4.], dtype=float32)

    Several axes, with a gain of their shape; integer input gives float64:

    >>> x3 = np.arange(24).reshape(2, 3, 4)
    >>> y3 = fastln.layer_norm(x3, np.ones((3, 4)), axis=(1, 2))
    >>> y3.shape, y3.dtype
    ((2, 3, 4), dtype('float64'))

    In place:

    >>> fastln.layer_norm(x, out=x) is x
    True
    """
    check_flag(return_stats, "return_stats")
    r = _norm(False, x, weight, bias, axis, eps, out, return_stats)
    if r is not None:
        return r
    return _general.norm(False, x, weight, bias, axis, eps, out, return_stats)


def layer_norm_backward(dy, x, mean, rstd, weight=None, *, axis=-1, out=None):
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    With ``xhat = (x - mean) * rstd`` and ``g = dy * weight``, per sample::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dweight = sum over samples of dy * xhat;   dbias = sum of dy

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of x's shape; any real dtype
        (cast to the compute dtype of x).
    x : array_like
        The input of the forward call; its dtype sets the compute and result
        dtypes as in :func:`layer_norm`. Torch tensors as in :func:`layer_norm`.
    mean, rstd : array_like
        The statistics ``layer_norm(..., return_stats=True)`` returned: x's
        shape without the normalized axes.
    weight : array_like, optional
        The forward's gain, of the normalized shape; None means 1.
    axis : int or tuple of int, default -1
        The forward's normalized axes.
    out : ndarray or torch.Tensor, optional
        Where to write dx: a plain ndarray of x's shape and dx's dtype,
        writable. May be ``dy`` itself. A CPU torch tensor as in
        :func:`layer_norm`.

    Returns
    -------
    dx : ndarray
        x's shape; x's dtype for float input, float64 for integers and bool
        (``out`` itself when given; for a torch tensor, the ndarray sharing
        its memory).
    dweight, dbias : ndarray
        The normalized shape, in the compute dtype (float32 for float16,
        bfloat16 and float32 x; else float64). Always returned: without
        ``weight`` they are the gradients of a unit gain and a zero bias.

    Raises
    ------
    TypeError
        dy, x, mean, rstd or weight of a dtype that is not a real number
        type; a bad ``axis`` type; ``out`` not a plain ndarray or of the
        wrong dtype.
    ValueError
        dy not of x's shape; mean or rstd not of x's shape without the
        normalized axes; weight not of the normalized shape; a bad axis or a
        normalized size of 0; ``out`` of the wrong shape or read-only.

    Notes
    -----
    The kernel uses ``mean + mean(x - mean)`` as the row mean, which repairs
    the rounding of a float32 mean next to a large offset. dweight and dbias
    are summed in a fixed order: bitwise the same for any thread count.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[1., 2., 3.], [2., 4., 6.]])
    >>> y, mean, rstd = fastln.layer_norm(x, return_stats=True)
    >>> dx, dweight, dbias = fastln.layer_norm_backward(np.ones_like(x), x, mean, rstd)
    >>> np.allclose(dx, 0)      # a uniform dy does not reach x through the mean
    True
    >>> dbias
    array([2., 2., 2.])
    >>> np.round(dweight, 4)
    array([-2.4495,  0.    ,  2.4495])
    """
    r = _norm_backward(False, dy, x, mean, rstd, weight, axis, out)
    if r is not None:
        return r
    return _general.norm_backward(False, dy, x, mean, rstd, weight, axis, out)


@_validate.hide_bias
def rms_norm(x, weight=None, *bias, axis=-1, eps=1e-6, out=None, return_stats=False):
    """RMS normalization over ``axis``: ``y = x / sqrt(mean(x**2) + eps) * weight``.

    Parameters
    ----------
    x : array_like
        Input, at least 1-D, any layout; dtypes as in :func:`layer_norm`
        (float32/float64 kept; float16 and bfloat16 computed in float32 and
        returned in their dtype; integers and bool give float64). Torch
        tensors as in :func:`layer_norm`.
    weight : array_like, optional
        Gain of the normalized shape (the sizes of ``axis``, in the order
        given); None means 1.
    axis : int or tuple of int, default -1
        The normalized axes.
    eps : float, default 1e-6
        Added to the mean square; finite and >= 0.
    out : ndarray or torch.Tensor, optional
        Where to write y: a plain ndarray of x's shape and y's dtype,
        writable. May be ``x`` itself. A CPU torch tensor, and the memory
        used, as in :func:`layer_norm`.
    return_stats : bool, default False
        Also return ``rstd``, which :func:`rms_norm_backward` takes.

    Returns
    -------
    y : ndarray
        x's shape and dtype as above (``out`` itself when given; for a torch
        tensor, the ndarray sharing its memory).
    rstd : ndarray
        Only with ``return_stats=True``: ``1 / sqrt(mean(x**2) + eps)`` of
        each sample, x's shape without the normalized axes, in the compute
        dtype (float32 or float64).

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm` (weight in place of weight and bias).
    TypeError
        A third positional argument: RMSNorm has no bias, and the message
        names :func:`layer_norm`, which takes one.

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[3., 4.]], np.float32)
    >>> np.round(fastln.rms_norm(x, eps=0.0), 4)
    array([[0.8485, 1.1314]], dtype=float32)
    >>> y, rstd = fastln.rms_norm(x, np.full(2, 2., np.float32), return_stats=True)
    >>> rstd.shape
    (1,)
    """
    if bias:
        _validate.no_bias(rms_norm, bias)
    check_flag(return_stats, "return_stats")
    r = _norm(True, x, weight, None, axis, eps, out, return_stats)
    if r is not None:
        return r
    return _general.norm(True, x, weight, None, axis, eps, out, return_stats)


def rms_norm_backward(dy, x, rstd, weight=None, *, axis=-1, out=None):
    """Gradients of :func:`rms_norm`: ``(dx, dweight)``.

    With ``xhat = x * rstd`` and ``g = dy * weight``, per sample:
    ``dx = rstd * (g - xhat * mean(g * xhat))``, ``dweight`` = the sum over
    samples of ``dy * xhat``.

    Parameters
    ----------
    dy : array_like
        Gradient of the loss with respect to y, of x's shape (any real dtype).
    x : array_like
        The input of the forward call; its dtype sets the compute and result
        dtypes as in :func:`rms_norm`. Torch tensors as in :func:`layer_norm`.
    rstd : array_like
        What ``rms_norm(..., return_stats=True)`` returned: x's shape without
        the normalized axes.
    weight : array_like, optional
        The forward's gain, of the normalized shape; None means 1.
    axis : int or tuple of int, default -1
        The forward's normalized axes.
    out : ndarray or torch.Tensor, optional
        Where to write dx: a plain ndarray of x's shape and dx's dtype,
        writable. May be ``dy`` itself. A CPU torch tensor as in
        :func:`layer_norm`.

    Returns
    -------
    dx : ndarray
        x's shape; x's dtype for float input, float64 for integers and bool.
    dweight : ndarray
        The normalized shape, in the compute dtype (float32 or float64);
        returned also without ``weight``.

    Raises
    ------
    TypeError, ValueError
        As :func:`layer_norm_backward` (rstd in place of mean and rstd).

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.array([[3., 4.]])
    >>> y, rstd = fastln.rms_norm(x, eps=0.0, return_stats=True)
    >>> dx, dweight = fastln.rms_norm_backward(np.ones_like(x), x, rstd)
    >>> dx.shape, dweight.shape
    ((1, 2), (2,))
    >>> np.allclose(dweight, y[0])
    True
    """
    r = _norm_backward(True, dy, x, None, rstd, weight, axis, out)
    if r is not None:
        return r
    return _general.norm_backward(True, dy, x, None, rstd, weight, axis, out)
