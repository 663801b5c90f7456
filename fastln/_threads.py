"""Thread-count control for fastln's OpenMP kernels."""
import contextlib

from fastln import _core


def get_num_threads():
    """The number of threads a large fastln call uses now.

    It is the count given to :func:`set_num_threads`, capped by OpenMP's
    current limit (``OMP_NUM_THREADS``, or threadpoolctl's
    ``threadpool_limits(n, "openmp")``). Small calls run on one thread
    whatever this says.
    """
    return _core.get_num_threads()


def set_num_threads(n):
    """Use ``n`` threads (n >= 1) in later calls; ``n=None`` returns to the OpenMP default."""
    if n is None:
        _core.set_num_threads(0)
        _setting[0] = None
        return
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int or None, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    _core.set_num_threads(n)
    _setting[0] = n


_setting = [None]   # the last value given to set_num_threads, for threads()


@contextlib.contextmanager
def threads(n):
    """Context manager: run fastln on ``n`` threads inside the block, then restore."""
    previous = _setting[0]
    set_num_threads(n)
    try:
        yield
    finally:
        set_num_threads(previous)
