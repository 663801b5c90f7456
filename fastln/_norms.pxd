# The C-level interface of fastln._norms, for fastln._add_norms: the check of
# a flag argument (fastln/_norms.pyx).
cdef int check_flag(object v, str name) except -1
