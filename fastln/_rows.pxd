# The C-level interface of fastln._rows, for the fast paths of fastln._norms
# and fastln._add_norms: the kernels on canonical arrays, which the caller has
# checked (fastln/_rows.pyx says what each takes), and the arrays they write.
cimport numpy as cnp
from libc.stdint cimport int64_t

# A kernel's code for its storage type: the NumPy type number of float32 or
# float64, or HALF_BASE + the kind (FASTLN_F16, FASTLN_BF16) of 16-bit storage
# (type numbers are far below)
cdef enum:
    HALF_BASE = 1 << 20

cdef int kernel_code(object x, int *tn, int *vt) noexcept
cdef cnp.ndarray empty_like(cnp.ndarray x, int nd, int tn)

cdef int ln_fwd(int code, y, mean, rstd, x, w, b, int64_t N, int64_t H, double eps) except -1
cdef int ln_bwd(int code, dx, dw, db, dy, x, mean, rstd, w, int64_t N, int64_t H) except -1
cdef int rms_fwd(int code, y, rstd, x, w, int64_t N, int64_t H, double eps) except -1
cdef int rms_bwd(int code, dx, dw, dy, x, rstd, w, int64_t N, int64_t H) except -1
cdef int add_fwd(int code, int rms, y, s, mean, rstd, x, res, int64_t R, bi, w, b,
                 int64_t N, int64_t H, double eps) except -1
