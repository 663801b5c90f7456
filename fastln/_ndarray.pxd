# Checks and pointers of NumPy arrays for fastln's extension modules (fastln._lib,
# fastln._rows, fastln._norms, fastln._add_norms, fastln.rnn._engine): inline
# functions only, so no module of this name is imported. They live apart from
# fastln/_lib.pxd so that code cimporting the kernels (fastln/kernels.pxd)
# needs no NumPy headers. The fast paths' predicates are at the end.
cimport numpy as cnp
from libc.math cimport isfinite
from libc.stdint cimport int64_t


cdef inline bint _fast(object a, int tn) noexcept:
    """a is an aligned, C-contiguous, native-order ndarray of type number tn."""
    return (type(a) is cnp.ndarray and cnp.PyArray_TYPE(<cnp.ndarray>a) == tn
            and cnp.PyArray_ISCARRAY_RO(<cnp.ndarray>a)
            and cnp.PyArray_ISNOTSWAPPED(<cnp.ndarray>a))

cdef inline int _float_type(object x) noexcept:
    """NPY_FLOAT or NPY_DOUBLE when x takes the fast path (any rank >= 1), else -1."""
    if type(x) is not cnp.ndarray or cnp.PyArray_NDIM(<cnp.ndarray>x) < 1:
        return -1
    cdef int tn = cnp.PyArray_TYPE(<cnp.ndarray>x)
    if (tn == cnp.NPY_FLOAT or tn == cnp.NPY_DOUBLE) and _fast(x, tn):
        return tn
    return -1

cdef inline void *_ptr(object a) noexcept:
    return NULL if a is None else cnp.PyArray_DATA(<cnp.ndarray>a)

cdef inline int _check(int rc) except -1:
    if rc == 1:
        raise MemoryError("fastln: could not allocate scratch memory")
    if rc != 0:
        raise ValueError("fastln: invalid sizes")
    return 0

cdef inline int _arr(object a, int tn, int64_t n, bint writable, str what) except -1:
    if not (_fast(a, tn) and cnp.PyArray_SIZE(<cnp.ndarray>a) == n
            and (not writable or cnp.PyArray_ISWRITEABLE(<cnp.ndarray>a))):
        raise ValueError("internal: bad array for " + what)
    return 0


# ---- the fast paths' predicates ----------------------------------------------

cdef inline bint _overlap_any(cnp.ndarray a, cnp.ndarray b) noexcept:
    """Contiguous a and b share any byte."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    return pa < pb + cnp.PyArray_NBYTES(b) and pb < pa + cnp.PyArray_NBYTES(a)

cdef inline bint _overlap_partly(cnp.ndarray a, cnp.ndarray b) noexcept:
    """Contiguous a and b share memory without being the same buffer."""
    cdef char *pa = <char *>cnp.PyArray_DATA(a)
    cdef char *pb = <char *>cnp.PyArray_DATA(b)
    if pa == pb and cnp.PyArray_NBYTES(a) == cnp.PyArray_NBYTES(b):
        return False
    return pa < pb + cnp.PyArray_NBYTES(b) and pb < pa + cnp.PyArray_NBYTES(a)

cdef inline bint _same_shape(cnp.ndarray a, cnp.ndarray b, int nd) noexcept:
    """The first nd dimensions of a and b agree, and b has exactly nd."""
    if cnp.PyArray_NDIM(b) != nd:
        return False
    for i in range(nd):
        if cnp.PyArray_DIM(a, i) != cnp.PyArray_DIM(b, i):
            return False
    return True

cdef inline bint _fast_vec(object p, int tn, cnp.npy_intp H) noexcept:
    """p is None, or a fast 1-D array of H elements."""
    return p is None or (_fast(p, tn) and cnp.PyArray_NDIM(<cnp.ndarray>p) == 1
                         and cnp.PyArray_DIM(<cnp.ndarray>p, 0) == H)

cdef inline bint _fast_out(object out, cnp.ndarray x, int tn, object others=()) noexcept:
    """out is None, or a writable fast array of x's shape that is x itself or
    does not overlap it, and overlaps none of the (fast or None) others."""
    if out is None:
        return True
    if not (_fast(out, tn) and cnp.PyArray_ISWRITEABLE(<cnp.ndarray>out)
            and _same_shape(x, <cnp.ndarray>out, cnp.PyArray_NDIM(x))):
        return False
    if _overlap_partly(<cnp.ndarray>out, x):
        return False
    for a in others:
        if a is not None and _overlap_any(<cnp.ndarray>out, <cnp.ndarray>a):
            return False
    return True

cdef inline bint _fast_eps(object eps) noexcept:
    """eps is a Python float, finite and >= 0."""
    return type(eps) is float and isfinite(<double>eps) and <double>eps >= 0.0

cdef inline bint _last_axis(object axis, int nd):
    """axis is the Python int -1 or nd - 1."""
    return type(axis) is int and (axis == -1 or axis == nd - 1)
