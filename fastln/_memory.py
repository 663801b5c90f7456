"""The cache of large outputs: :func:`cache_info`, :func:`set_cache_limit` and
:func:`empty_cache` (re-exported by :mod:`fastln`).

An output array that fastln allocates (``y``, ``dx``, ``s``: not ``out=``,
not the statistics) of 4 MiB or more takes its memory from a cache of blocks
that earlier such outputs gave back when they were freed. Fresh memory takes
a page fault a page the first time it is written, which for large arrays
costs about as much as the kernel itself (docs/performance.md has the
numbers); a loop that drops each output before the next call then pays that
only once. The arrays
are ordinary NumPy arrays that own their memory (NumPy's allocator
interface, NEP 49); the cache keeps only blocks no array uses any more.

The cache keeps at most 1 GiB by default (oldest blocks released first, 8
blocks at most); ``FASTLN_CACHE_LIMIT`` (a size in bytes such as
``536870912``, ``512M`` or ``2GiB``, read at import) or
:func:`set_cache_limit` changes that, and 0 turns it off. Where another
NumPy allocator is in use (one set through ``PyDataMem_SetHandler`` by a
memory profiler, say), fastln allocates through it and keeps no cache.
"""
import numbers
import os
import warnings
from typing import NamedTuple

from fastln import _lib


class CacheInfo(NamedTuple):
    """The state of fastln's cache of large outputs (:func:`cache_info`).

    hits, misses: allocations of 4 MiB or more served from the cache, and fresh;
    limit: the most bytes it keeps; bytes, blocks: what it keeps now."""

    hits: int
    misses: int
    limit: int
    bytes: int
    blocks: int


def cache_info() -> CacheInfo:
    """The state of the cache of large outputs.

    Returns
    -------
    CacheInfo
        A named tuple ``(hits, misses, limit, bytes, blocks)``: outputs of 4
        MiB or more allocated from the cache and fresh, since the process
        started; the most bytes the cache keeps; the bytes and number of
        blocks it keeps now (blocks no array uses).

    Examples
    --------
    >>> import numpy as np, fastln
    >>> x = np.ones((4096, 512), np.float32)          # 8 MiB
    >>> y = fastln.layer_norm(x); del y               # y's block goes to the cache
    >>> hits = fastln.cache_info().hits
    >>> y = fastln.layer_norm(x)                      # and comes back
    >>> fastln.cache_info().hits - hits
    1
    """
    limit, nbytes, blocks, hits, misses = (int(v) for v in _lib._cache_stats())
    return CacheInfo(hits, misses, limit, nbytes, blocks)


def set_cache_limit(nbytes: int) -> None:
    """Keep at most ``nbytes`` bytes of freed outputs for reuse; 0 keeps none.

    Blocks over the new limit are released at once, oldest first.

    Parameters
    ----------
    nbytes : int
        The limit in bytes, 0 or more (the default is 1 GiB, or
        ``FASTLN_CACHE_LIMIT`` where set at import). The setting is process-wide.

    Raises
    ------
    TypeError
        nbytes is not an int (a bool is refused too).
    ValueError
        nbytes is negative.

    See Also
    --------
    cache_info, empty_cache

    Examples
    --------
    >>> import fastln
    >>> old = fastln.cache_info().limit
    >>> fastln.set_cache_limit(0)            # no cache: every output is fresh memory
    >>> fastln.cache_info().bytes
    0
    >>> fastln.set_cache_limit(old)
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral):
        raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be 0 or more, got {nbytes}")
    _lib._cache_set_limit(min(int(nbytes), 2**63 - 1))


def empty_cache() -> None:
    """Release the memory of every block the cache keeps.

    Arrays in use are not affected; the cache fills again as later outputs
    are freed (:func:`set_cache_limit` ``(0)`` stops that).

    Examples
    --------
    >>> import fastln
    >>> fastln.empty_cache()
    >>> fastln.cache_info().bytes
    0
    """
    _lib._cache_release()


def _limit_from_env() -> None:
    """Applies FASTLN_CACHE_LIMIT, where set: a size in bytes, read by the
    parser of the FASTLN_L*_BYTES variables (an int, optionally with a K, M
    or G suffix, 0 or more; else a warning, and the limit stays)."""
    text = os.environ.get("FASTLN_CACHE_LIMIT")
    if text is None:
        return
    nbytes = _lib._parse_bytes(text)
    if nbytes is None:
        warnings.warn(f"FASTLN_CACHE_LIMIT={text!r} is not a size in bytes (such as 0, "
                      f"536870912, 512M or 2GiB); the limit stays {cache_info().limit}",
                      RuntimeWarning, stacklevel=3)
        return
    set_cache_limit(nbytes)


_limit_from_env()
