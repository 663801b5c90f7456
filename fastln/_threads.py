"""Thread-count control for fastln's OpenMP kernels."""
import contextlib
import numbers

import numpy as np

from fastln import _core

MAX_THREADS = 4096   # more would only ask OpenMP for an absurd thread pool


def get_num_threads():
    """The number of threads a large fastln call uses now.

    It is the count given to :func:`set_num_threads`, else OpenMP's default
    (``OMP_NUM_THREADS``, or the number of CPUs). A limit set later on the
    calling thread, such as threadpoolctl's ``threadpool_limits(1, "openmp")``
    (or ``torch.set_num_threads`` where torch shares fastln's libgomp), caps
    it. Small calls run on one thread whatever this says.
    """
    return _core.get_num_threads()


def set_num_threads(n):
    """Use ``n`` threads (n >= 1) in later calls; ``n=None`` returns to the OpenMP default."""
    if n is None:
        _core.set_num_threads(0)
        return
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be an int or None, got {type(n).__name__}")
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(f"n must be between 1 and {MAX_THREADS}, got {n}")
    _core.set_num_threads(int(n))


@contextlib.contextmanager
def threads(n):
    """Context manager: run fastln on ``n`` threads inside the block, then restore.

    The setting is process-wide, like :func:`set_num_threads`.
    """
    previous = _core.get_requested_threads()
    set_num_threads(n)
    try:
        yield
    finally:
        _core.set_num_threads(previous)
