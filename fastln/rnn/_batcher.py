"""StreamBatcher: an asyncio front of a StreamTable that gathers the single
steps of many streams, arriving one request at a time, into batched table
steps.

A server (Starlette, aiohttp, grpc.aio, a raw TCP loop) awaits
``batcher.step(stream_id, x)`` in each request handler, or, from a
transport's callbacks, calls ``batcher.submit(stream_id, x, callback)``. A
transport whose messages each carry the steps of several streams hands
each message over whole with ``batcher.submit_block(ids, x, callback)``.
The batcher queues the steps and a worker task forms batches of at most
one step per stream, oldest first, and runs each in a worker thread, so
that the event loop keeps taking requests while the model runs. The
per-request work on the event loop is kept small (a future or a callback,
a deque append, one row view of the batch's output): with many streams
and a small model it is a large part of the cost of each step.
"""
from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import itertools
import math
import operator
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from .. import _api, _torch
from ._bf16 import _is_bf16
from ._inputs import positive_int
from ._streams import StreamTable, UnknownStreamError, _repeated, _unknown

__all__ = ["StreamBatcher", "OverloadedError"]

_Array = npt.NDArray[Any]

# a waiting step: (its future, its x row, its arrival time on the loop's clock)
_Item = Tuple["asyncio.Future[_Array]", _Array, float]
# a waiting block of submit_block: (its future, its streams, its x rows, its arrival time)
_Block = Tuple["asyncio.Future[_Array]", List[Hashable], _Array, float]

# the clock of arrival times and deadlines (the loop's own clock may be
# another one, as uvloop's, so timers are set with call_later)
_now = time.monotonic

# how many recent queue delays the metrics' percentiles are taken over
_RING = 4096
# the upper bounds (seconds) of the metrics' delay and latency histograms;
# a last bucket holds what is above them
TIME_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                0.5, 1.0, 2.5)
_BOUNDS = np.array(TIME_BUCKETS)


class _Histogram:
    """Counts of values by the buckets of TIME_BUCKETS (a value v counts in
    the first bucket whose bound is >= v), with their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = np.zeros(len(_BOUNDS) + 1, np.int64)
        self.sum = 0.0

    def add(self, values: _Array) -> None:
        self.counts += np.bincount(np.searchsorted(_BOUNDS, values), minlength=len(self.counts))
        self.sum += float(values.sum())

    def add_many(self, value: float, count: int) -> None:
        """Adds value count times (the steps of one block)."""
        self.counts[bisect.bisect_left(TIME_BUCKETS, value)] += count
        self.sum += value * count

    def as_dict(self) -> Dict[str, Any]:
        return {"le": list(TIME_BUCKETS), "counts": self.counts.tolist(), "sum": self.sum}


class OverloadedError(RuntimeError):
    """A step refused because its stream's queue, or the batcher's queue of
    waiting steps over all streams, is full (a server answers 429 or 503)."""


class StreamBatcher:
    """Batches the steps of a :class:`StreamTable`'s streams, one request at
    a time, for asyncio servers.

    ``await batcher.step(stream_id, x)`` queues one step of one stream and
    returns that stream's output row. A worker task forms batches oldest
    first, each holding at most one step per stream (a stream's steps run
    in arrival order), and runs each batch as one ``table.step`` in a
    worker thread; one batch runs at a time.

    Parameters
    ----------
    table : StreamTable
        The streams. Open, close and import streams on the table itself;
        the batcher only steps them.
    max_batch : int, optional
        The most steps in one batch; default ``table.capacity``.
    max_delay : float, optional
        Seconds that the oldest waiting step may wait for more steps to
        join its batch (default 0: a batch of whatever is waiting runs as
        soon as the worker is free, and the next batch fills while one
        runs).
    run_when_all_waiting : bool, optional
        Run a batch at once, without waiting out max_delay, when every open
        stream of the table has a step waiting (default True).
    max_queue_per_stream : int, optional
        The most waiting steps of one stream (not counting the one that
        runs); one more raises OverloadedError (default 4).
    max_pending : int, optional
        The most waiting steps over all streams; one more raises
        OverloadedError (default ``4 * table.capacity``).
    executor : concurrent.futures.Executor, optional
        Where the batches run; default a thread of the batcher's own, which
        :meth:`aclose` shuts down (a given executor is left running).

    Raises
    ------
    TypeError, ValueError
        For a table that is not a StreamTable, a max_batch,
        max_queue_per_stream or max_pending that is not a positive int, or
        a max_delay that is negative or not finite.

    Notes
    -----
    A batcher belongs to the event loop of its first :meth:`step`; call
    it from that loop only. Results are bitwise those of each stream run
    alone (as the table's are). A step cancelled while it waits is removed;
    one cancelled while its batch runs has advanced its stream's state, and
    only its result is dropped. Use ``async with`` or :meth:`aclose`, so
    that the worker and its thread end.

    The next batch starts before the steps of the last one are answered, so
    with a max_batch below the number of busy streams the event loop serves
    one group of streams while the model runs another's batch.

    :meth:`submit_block` queues the steps of several streams as one block,
    which runs whole in one batch: its rows are copied into the batch in
    one piece (or, for a batch of that block alone, handed to the table as
    they are), and it is answered with one array. Blocks and single steps
    share the per-stream order: a stream's steps run in the order they were
    submitted, whichever way, one per batch.

    Examples
    --------
    >>> import asyncio
    >>> import numpy as np
    >>> from fastln.rnn import LNLSTM, StreamBatcher, StreamTable
    >>> table = StreamTable(LNLSTM(input_size=3, hidden_size=4, seed=0), capacity=8)
    >>> a, b = table.open(), table.open()
    >>> async def main():
    ...     async with StreamBatcher(table) as batcher:
    ...         x = np.ones(3, np.float32)
    ...         ya, yb = await asyncio.gather(batcher.step(a, x), batcher.step(b, x))
    ...         return ya.shape, batcher.metrics()["steps"]
    >>> asyncio.run(main())
    ((4,), 2)
    """

    def __init__(self, table: StreamTable, *, max_batch: Optional[int] = None,
                 max_delay: float = 0.0, run_when_all_waiting: bool = True,
                 max_queue_per_stream: int = 4, max_pending: Optional[int] = None,
                 executor: Optional[concurrent.futures.Executor] = None) -> None:
        if not isinstance(table, StreamTable):
            raise TypeError(f"table must be a fastln.rnn.StreamTable, got {type(table).__name__}")
        self.table = table
        self.max_batch = table.capacity if max_batch is None else positive_int(
            max_batch, "max_batch")
        try:
            delay = float(max_delay)
        except (TypeError, ValueError):
            raise TypeError(f"max_delay must be a number of seconds, got "
                            f"{type(max_delay).__name__}") from None
        if not (delay >= 0 and math.isfinite(delay)):
            raise ValueError(f"max_delay must be finite and at least 0, got {max_delay}")
        self.max_delay = delay
        self.run_when_all_waiting = _api._flag(run_when_all_waiting, "run_when_all_waiting")
        self.max_queue_per_stream = positive_int(max_queue_per_stream, "max_queue_per_stream")
        self.max_pending = 4 * table.capacity if max_pending is None else positive_int(
            max_pending, "max_pending")
        self._own_executor = executor is None
        self._executor = executor
        model = table.model
        self._xshape = (model.input_size,)
        # x rows the model takes as they are; a bfloat16 model's batches are
        # stacked in float32 (bfloat16 rows widen exactly)
        self._xdtype = np.dtype(np.float32) if _is_bf16(model.dtype) else np.dtype(model.dtype)
        self._xdtypes = (np.dtype(model.dtype), self._xdtype)
        self._has = table.__contains__
        self._xbuf = np.empty((self.max_batch, model.input_size), self._xdtype)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._worker: Optional[asyncio.Task[None]] = None
        self._wake: Optional[asyncio.Future[None]] = None
        # each stream's queue of waiting steps (kept while it is empty), and
        # the streams with waiting steps, in the arrival order of their head step
        self._queues: Dict[Hashable, Deque[_Item]] = {}
        self._waiting: Dict[Hashable, Deque[_Item]] = {}
        self._unsorted = False     # a head step was removed: re-sort before the next batch
        # the blocks of submit_block, in arrival order, and the steps they hold
        self._blocks: Deque[_Block] = deque()
        self._block_steps = 0
        self._pending = 0          # waiting steps over all streams
        self._closed = False
        self._batches = 0
        self._steps = 0
        self._rejected = 0
        self._failed = 0
        self._cancelled = 0
        self._sizes = [0] * (self.max_batch + 1)
        self._delays: Deque[float] = deque(maxlen=_RING)
        self._delay_hist, self._latency_hist = _Histogram(), _Histogram()

    # ---- the public interface ---------------------------------------------

    async def step(self, stream_id: Hashable, x: npt.ArrayLike) -> _Array:
        """One step of one stream, batched with the steps of other streams.

        Parameters
        ----------
        stream_id : hashable
            An open stream of the table.
        x : array_like, shape (input_size,)
            The stream's input, in the model's dtype (float32 too for a
            bfloat16 model).

        Returns
        -------
        y : ndarray, shape (hidden_size,)
            The stream's output: a row (a view) of its batch's output.

        Raises
        ------
        OverloadedError
            When the stream has max_queue_per_stream steps waiting, or the
            batcher max_pending over all streams.
        UnknownStreamError
            For a stream the table does not hold, now or when its batch
            runs (closed or evicted while the step waited).
        RuntimeError
            When the batcher is closed, or closes while the step waits.
        TypeError, ValueError
            For x of the wrong dtype or shape.

        Examples
        --------
        >>> import asyncio
        >>> import numpy as np
        >>> from fastln.rnn import GRU, StreamBatcher, StreamTable
        >>> table = StreamTable(GRU(input_size=2, hidden_size=3, seed=0), capacity=4)
        >>> s = table.open()
        >>> async def main():
        ...     async with StreamBatcher(table) as batcher:
        ...         return [await batcher.step(s, np.ones(2, np.float32)) for _ in range(3)]
        >>> [y.shape for y in asyncio.run(main())]
        [(3,), (3,), (3,)]
        """
        fut = self._queue(stream_id, x, None)
        try:
            return await fut
        except asyncio.CancelledError:
            self._withdraw(stream_id, fut)
            raise

    def submit(self, stream_id: Hashable, x: npt.ArrayLike,
               callback: Optional[Callable[[Optional[_Array], Optional[BaseException]], Any]]
               = None) -> Optional[asyncio.Future[_Array]]:
        """Queues one step of one stream without awaiting it: for transports
        that answer in callbacks.

        Without ``callback`` it returns the step's future, whose result is
        what :meth:`step` returns and whose error what :meth:`step` raises
        once queued. With ``callback`` it returns None, and the batcher
        calls ``callback(y, None)`` when the step's batch has run, or
        ``callback(None, error)`` when it fails, on the event loop and in
        batch order: the callbacks of one stream's steps run in the order
        the steps were submitted. A callback costs less than a future
        (nothing is scheduled on the loop to call it), which counts in a
        server that reads many frames in one pass of the event loop. Call it from the batcher's
        event loop. A callback that raises is reported to the event loop's
        exception handler, and the batcher goes on.

        Parameters
        ----------
        stream_id : hashable
            An open stream of the table.
        x : array_like, shape (input_size,)
            The stream's input, in the model's dtype (float32 too for a
            bfloat16 model). An array is kept, not copied, until its batch
            forms: do not change it meanwhile.
        callback : callable, optional
            ``callback(y, error)``: y, shape (hidden_size,), a row (a view)
            of the batch's output, and None; or None and the exception
            (UnknownStreamError for a stream closed or evicted while the
            step waited, RuntimeError when the batcher closes, or the
            batch's own error).

        Returns
        -------
        asyncio.Future or None
            Without callback, the step's future: it resolves to y.
            Cancelling it before its batch forms removes the step;
            cancelling it later drops only the result (the stream's state
            has advanced). With callback, None.

        Raises
        ------
        OverloadedError
            When the stream has max_queue_per_stream steps waiting, or the
            batcher max_pending over all streams.
        UnknownStreamError
            For a stream the table does not hold now.
        RuntimeError
            When the batcher is closed, or there is no running event loop.
        TypeError, ValueError
            For x of the wrong dtype or shape.

        Examples
        --------
        >>> import asyncio
        >>> import numpy as np
        >>> from fastln.rnn import LSTM, StreamBatcher, StreamTable
        >>> table = StreamTable(LSTM(input_size=2, hidden_size=3, seed=0), capacity=4)
        >>> a, b = table.open(), table.open()
        >>> async def main():
        ...     async with StreamBatcher(table) as batcher:
        ...         answered = []
        ...         for sid in (a, b, a):
        ...             batcher.submit(sid, np.ones(2, np.float32),
        ...                            lambda y, error, sid=sid: answered.append((sid, y.shape)))
        ...         fut = batcher.submit(b, np.ones(2, np.float32))
        ...         await fut
        ...         return answered, batcher.metrics()["batches"]
        >>> asyncio.run(main())
        ([(0, (3,)), (1, (3,)), (0, (3,))], 2)
        """
        if callback is None:
            return self._queue(stream_id, x, None)
        self._queue(stream_id, x, _Callback(callback))
        return None

    def submit_block(self, ids: Sequence[Hashable], x: npt.ArrayLike,
                     callback: Optional[Callable[[Optional[_Array], Optional[BaseException]],
                                                 Any]] = None
                     ) -> Optional[asyncio.Future[_Array]]:
        """Queues one step of each of several streams as one block: for
        transports whose messages carry many streams' steps.

        The block runs whole, in one batch, with no object made per step:
        its x rows go into the batch in one copy (none when the block is
        the whole batch) and its answer is one array of its rows of y. Its
        streams' steps keep their order with every other step of theirs,
        single or in other blocks: a block waits for a batch in which none
        of its streams has an older step waiting. A block of more than
        max_batch steps runs as a batch of its own.

        Parameters
        ----------
        ids : sequence of hashable
            Open streams of the table, each at most once.
        x : array_like, shape (len(ids), input_size)
            Row i is stream ids[i]'s input, in the model's dtype (float32
            too for a bfloat16 model). An array is kept, not copied, until
            its batch forms: do not change it meanwhile.
        callback : callable, optional
            ``callback(y, error)``, called on the event loop once the
            block's batch has run: y, shape (len(ids), hidden_size), the
            block's rows (a view) of the batch's output, and None; or None
            and the exception (UnknownStreamError for a stream closed or
            evicted while the block waited, in which case none of its steps
            ran, or while its batch ran, in which case the others' states
            have advanced; RuntimeError when the batcher closes; or the
            batch's own error).

        Returns
        -------
        asyncio.Future or None
            Without callback, the block's future: it resolves to y.
            Cancelling it before its batch forms removes the block. With
            callback, None.

        Raises
        ------
        OverloadedError
            When the block would take the waiting steps past max_pending
            (max_queue_per_stream bounds single steps only: a caller of
            submit_block bounds its own blocks in flight).
        UnknownStreamError
            For a stream the table does not hold now.
        ValueError
            For no ids, an id given twice, or x of the wrong shape.
        TypeError
            For x of the wrong dtype.
        RuntimeError
            When the batcher is closed, or there is no running event loop.

        Examples
        --------
        >>> import asyncio
        >>> import numpy as np
        >>> from fastln.rnn import LNGRU, StreamBatcher, StreamTable
        >>> table = StreamTable(LNGRU(input_size=2, hidden_size=3, seed=0), capacity=4)
        >>> a, b, c = table.open(), table.open(), table.open()
        >>> async def main():
        ...     async with StreamBatcher(table) as batcher:
        ...         first = batcher.submit_block([a, b], np.ones((2, 2), np.float32))
        ...         second = batcher.submit_block([b, c], np.ones((2, 2), np.float32))
        ...         y1, y2 = await first, await second
        ...         return y1.shape, y2.shape, batcher.metrics()["batches"]
        >>> asyncio.run(main())
        ((2, 3), (2, 3), 2)
        """
        if self._closed:
            raise RuntimeError("batcher closed")
        ids = list(ids)
        n = len(ids)
        if not n:
            raise ValueError("ids must name at least one stream")
        if not all(map(self._has, ids)):
            raise UnknownStreamError(_unknown(next(s for s in ids if not self._has(s))))
        if len(set(ids)) != n:
            raise ValueError(f"ids names a stream more than once: {_repeated(ids)!r}")
        if x.__class__ is not np.ndarray or x.shape != (n, self._xshape[0]) or (  # type: ignore
                x.dtype not in self._xdtypes):  # type: ignore[union-attr]
            x = self._convert_block(x, n)
        loop = self._loop or self._start()
        if self._pending + n > self.max_pending:
            self._purge()
            if self._pending + n > self.max_pending:
                self._rejected += 1
                raise OverloadedError(f"{self._pending} steps are waiting and the block holds "
                                      f"{n}: past the batcher's limit (max_pending)")
        sink = loop.create_future() if callback is None else _Callback(callback, "submit_block")
        self._blocks.append((sink, ids, x, _now()))  # type: ignore[arg-type]
        self._pending += n
        self._block_steps += n
        self._rouse()
        return sink if callback is None else None  # type: ignore[return-value]

    def _queue(self, stream_id: Hashable, x: npt.ArrayLike, sink: Any) -> Any:
        """Queues one step; sink is a _Callback, or None for a new future. Returns the sink."""
        if self._closed:
            raise RuntimeError("batcher closed")
        if not self._has(stream_id):
            raise UnknownStreamError(_unknown(stream_id))
        if x.__class__ is not np.ndarray or x.shape != self._xshape or (  # type: ignore
                x.dtype not in self._xdtypes):  # type: ignore[union-attr]
            x = self._convert(x)
        loop = self._loop or self._start()
        q = self._queues.get(stream_id)
        if q is None:
            q = self._new_queue(stream_id)
        waiting = self._waiting
        if self._pending >= self.max_pending or len(q) >= self.max_queue_per_stream:
            self._purge()              # steps cancelled while they waited make room
            if self._pending >= self.max_pending or len(q) >= self.max_queue_per_stream:
                raise self._overloaded(q, stream_id)
        if not q:
            waiting[stream_id] = q     # its first waiting step: it queues last
        fut = loop.create_future() if sink is None else sink
        q.append((fut, x, _now()))
        self._pending += 1
        if self._wake is not None and (
                self.max_delay == 0 or len(waiting) == 1 or len(waiting) >= self.max_batch
                or (self.run_when_all_waiting and len(waiting) >= len(self.table))):
            self._rouse()
        return fut

    def metrics(self) -> Dict[str, Any]:
        """The batcher's counters, as a plain dict.

        Returns
        -------
        dict
            ``batches``: batches run; ``steps``: steps that ran (results
            delivered or dropped by cancellation); ``batch_mean`` and
            ``batch_max``: their sizes; ``batch_sizes``: {size: count};
            ``queue_delay_p50`` and ``queue_delay_p99``: seconds from a
            step's arrival to the start of its batch, over the last 4096
            steps (None before any); ``queue_delay_histogram`` and
            ``latency_histogram``: every step's queue delay, and its
            latency (from its arrival to the end of its batch's step), as
            ``{"le": bucket bounds in seconds, "counts": steps per bucket
            (one more, for those above the last bound), "sum": seconds}``;
            ``pending``: steps waiting now;
            ``rejected``: OverloadedError raised; ``failed``: steps that
            got an error (unknown stream, a failed batch, the batcher
            closed); ``cancelled``: steps cancelled while waiting;
            ``active_streams``: ``len(table)``; ``evicted_streams``:
            ``table.evicted``.

        Examples
        --------
        >>> from fastln.rnn import RNN, StreamBatcher, StreamTable
        >>> m = StreamBatcher(StreamTable(RNN(2, 3), capacity=2)).metrics()
        >>> m["batches"], m["queue_delay_p50"], m["active_streams"]
        (0, None, 0)
        """
        self._purge()
        p50 = p99 = None
        if self._delays:
            p50, p99 = (float(v) for v in np.percentile(self._delays, [50, 99]))
        return {
            "batches": self._batches,
            "steps": self._steps,
            "batch_mean": self._steps / self._batches if self._batches else 0.0,
            "batch_max": max((s for s, c in enumerate(self._sizes) if c), default=0),
            "batch_sizes": {s: c for s, c in enumerate(self._sizes) if c},
            "queue_delay_p50": p50,
            "queue_delay_p99": p99,
            "queue_delay_histogram": self._delay_hist.as_dict(),
            "latency_histogram": self._latency_hist.as_dict(),
            "pending": self._pending,
            "rejected": self._rejected,
            "failed": self._failed,
            "cancelled": self._cancelled,
            "active_streams": len(self.table),
            "evicted_streams": self.table.evicted,
        }

    async def aclose(self) -> None:
        """Stops the batcher: the running batch finishes, waiting steps get
        RuntimeError("batcher closed"), later steps raise it, and the
        batcher's own thread ends. Closing twice is harmless.

        Examples
        --------
        >>> import asyncio
        >>> from fastln.rnn import LNGRU, StreamBatcher, StreamTable
        >>> batcher = StreamBatcher(StreamTable(LNGRU(2, 3), capacity=2))
        >>> asyncio.run(batcher.aclose())
        """
        self._closed = True
        self._rouse()
        if self._worker is not None and not self._worker.done():
            await asyncio.wait({self._worker})    # its own error, if any, stays with it
        self._fail_waiting(RuntimeError("batcher closed"))
        if self._own_executor and self._executor is not None:
            self._executor.shutdown(wait=False)

    async def __aenter__(self) -> StreamBatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- the worker --------------------------------------------------------

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = self._loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="fastln-batcher")
        self._worker = loop.create_task(self._work())
        return loop

    def _new_queue(self, stream_id: Hashable) -> Deque[_Item]:
        """A stream's queue, kept while the stream lives; the queues of
        streams the table no longer holds go when they outnumber its
        capacity."""
        queues = self._queues
        if len(queues) >= 2 * self.table.capacity:
            for sid in [sid for sid, q in queues.items() if not q and sid not in self.table]:
                del queues[sid]
        q = queues[stream_id] = deque()
        return q

    def _overloaded(self, q: Deque[_Item], stream_id: Hashable) -> OverloadedError:
        self._rejected += 1
        if len(q) >= self.max_queue_per_stream:
            return OverloadedError(f"stream {stream_id!r} has {len(q)} steps waiting, its limit "
                                   f"(max_queue_per_stream)")
        return OverloadedError(f"{self._pending} steps are waiting, the batcher's limit "
                               f"(max_pending)")

    def _as_input(self, x: npt.ArrayLike) -> _Array:
        """x as an array of a dtype the model takes, or a TypeError: an
        ndarray or a torch tensor of another dtype is refused (the model's
        rule), a list is converted."""
        tensor = _torch.is_tensor(x)
        if tensor:
            x = _api._tensor(x, "x")
        if isinstance(x, np.ndarray):
            if x.dtype not in self._xdtypes:
                how = f"x.to(torch.{self._xdtype})" if tensor else f"x.astype(np.{self._xdtype})"
                raise TypeError(f"x has dtype {x.dtype}, but the model takes "
                                f"{' or '.join(sorted(set(map(str, self._xdtypes))))}; "
                                f"convert it with {how}")
            return x
        return np.asarray(x, self._xdtype)

    def _convert(self, x: npt.ArrayLike) -> _Array:
        """x as a row the batch can take, or the model's error."""
        x = self._as_input(x)
        if x.shape != self._xshape:
            raise ValueError(f"x must have shape {self._xshape} (input_size,), got {x.shape}")
        return x

    def _convert_block(self, x: npt.ArrayLike, n: int) -> _Array:
        """x as a block's rows, (n, input_size), or the model's error."""
        x = self._as_input(x)
        if x.shape != (n, self._xshape[0]):
            raise ValueError(f"x must have shape (len(ids), input_size) = "
                             f"{(n, self._xshape[0])}, got {x.shape}")
        return x

    def _purge(self) -> None:
        """Removes the waiting steps whose futures were cancelled (submit()'s
        callers cancel them without telling the batcher)."""
        if any(map(_done, (b[0] for b in self._blocks))):
            blocks = [b for b in self._blocks if not b[0].done()]
            gone = sum(len(b[1]) for b in self._blocks) - sum(len(b[1]) for b in blocks)
            self._cancelled += gone
            self._pending -= gone
            self._block_steps -= gone
            self._blocks = deque(blocks)
        for sid, q in list(self._waiting.items()):
            if not any(map(_done, (item[0] for item in q))):
                continue
            head = q[0]
            kept = [item for item in q if not item[0].done()]
            self._cancelled += len(q) - len(kept)
            self._pending -= len(q) - len(kept)
            q.clear()
            q.extend(kept)
            if not q:
                del self._waiting[sid]
            elif q[0] is not head:
                self._unsorted = True

    def _rouse(self) -> None:
        """Wakes the worker from _sleep: called by a step that lets a batch
        run, by the sleep's timer, and by aclose, whichever comes first (the
        wake future is cleared, so it is set once; it is done already when
        the worker was cancelled)."""
        w = self._wake
        if w is not None:
            self._wake = None
            if not w.done():
                w.set_result(None)

    def _withdraw(self, stream_id: Hashable, fut: asyncio.Future[_Array]) -> None:
        """Removes a cancelled step that has not been taken into a batch."""
        q = self._queues.get(stream_id)
        if q is None:
            return
        k = next((k for k, item in enumerate(q) if item[0] is fut), None)
        if k is None:
            return                 # in a batch already: its result is dropped
        del q[k]
        self._pending -= 1
        self._cancelled += 1
        if not q:
            if self._waiting.get(stream_id) is q:
                del self._waiting[stream_id]
        elif k == 0:
            self._unsorted = True

    async def _sleep(self, deadline: Optional[float]) -> None:
        """Waits for a step() that lets a batch run, or for the deadline."""
        loop = self._loop
        assert loop is not None
        w = self._wake = loop.create_future()
        timer = None if deadline is None else loop.call_later(deadline - _now(), self._rouse)
        try:
            await w
        finally:
            if timer is not None:
                timer.cancel()
            if self._wake is w:
                self._wake = None

    def _ready(self) -> Optional[float]:
        """None when a batch may run now, else the time at which it may.
        A block's steps count as that many waiting streams (they may share
        streams with other waiting steps: a batch may then run before the
        delay ends, never later)."""
        waiting = self._waiting
        count = len(waiting) + self._block_steps
        if (self.max_delay == 0 or count >= self.max_batch
                or (self.run_when_all_waiting and count >= len(self.table))):
            return None
        if not waiting:
            oldest = self._blocks[0][3]
        else:
            oldest = min(q[0][2] for q in waiting.values()) if self._unsorted else \
                next(iter(waiting.values()))[0][2]
            if self._blocks:
                oldest = min(oldest, self._blocks[0][3])
        deadline = oldest + self.max_delay
        return None if _now() >= deadline else deadline

    def _take(self) -> Tuple[List[Hashable], List[asyncio.Future[_Array]], List[_Array],
                             List[float], List[_Block]]:
        """Takes the next batch off the queues: the head step of each of the
        (up to max_batch) streams whose head steps are the oldest, or, with
        blocks waiting, what _take_with_blocks takes. Returns the single
        steps' ids, futures, x rows and arrival times, and the blocks."""
        waiting = self._waiting
        if self._unsorted:
            self._unsorted = False
            waiting = self._waiting = dict(sorted(waiting.items(), key=_head_time))
        if self._blocks:
            return self._take_with_blocks()
        if len(waiting) <= self.max_batch:
            taken = list(waiting.items())
            waiting = self._waiting = {}
        else:
            taken = list(itertools.islice(waiting.items(), self.max_batch))
            for sid, _ in taken:
                del waiting[sid]
        return (*self._heads(taken), [])

    def _take_with_blocks(self) -> Tuple[List[Hashable], List[asyncio.Future[_Array]],
                                         List[_Array], List[float], List[_Block]]:
        """The next batch when blocks wait: the waiting units (a stream's
        head step, or a block) oldest first, each taken when none of its
        streams is in the batch already or has an older step left waiting,
        until max_batch steps; a block that does not fit is left (its
        streams with it), and one alone may pass max_batch."""
        items = list(self._waiting.items())
        blocks, kept = self._blocks, deque()   # type: Deque[_Block], Deque[_Block]
        claimed: set = set()       # streams in the batch
        held: set = set()          # streams with a step left waiting before the next unit
        taken, chosen = [], []     # type: List[Tuple[Hashable, Deque[_Item]]], List[_Block]
        size, i, limit = 0, 0, self.max_batch
        while blocks and size < limit:
            head = items[i][1][0][2] if i < len(items) else math.inf
            if head < blocks[0][3]:
                sid, q = items[i]
                i += 1
                if sid not in claimed and sid not in held:
                    claimed.add(sid)
                    taken.append((sid, q))
                    size += 1
                continue
            block = blocks.popleft()
            sink, ids, _, _ = block
            n = len(ids)
            if sink.done():        # cancelled while it waited
                self._cancelled += n
            elif not all(map(self._has, ids)):   # a stream closed or evicted while it waited
                self._failed += n
                sink.set_exception(UnknownStreamError(_unknown(
                    next(s for s in ids if not self._has(s)))))
            elif (size and size + n > limit) or not claimed.isdisjoint(ids) or (
                    held and not held.isdisjoint(ids)):
                held.update(ids)
                kept.append(block)
                continue
            else:
                claimed.update(ids)
                chosen.append(block)
                size += n
            self._pending -= n
            self._block_steps -= n
        kept.extend(blocks)
        self._blocks = kept
        for sid, q in items[i:]:
            if size >= limit:
                break
            if sid not in claimed and sid not in held:
                claimed.add(sid)
                taken.append((sid, q))
                size += 1
        for sid, _ in taken:
            del self._waiting[sid]
        return (*self._heads(taken), chosen)

    def _heads(self, taken: List[Tuple[Hashable, Deque[_Item]]]
               ) -> Tuple[List[Hashable], List[asyncio.Future[_Array]], List[_Array],
                          List[float]]:
        """Pops the head step of each taken stream (whose queues are out of
        _waiting), puts the streams with more steps back in arrival order,
        and drops cancelled steps and those of streams the table no longer holds."""
        waiting = self._waiting
        self._pending -= len(taken)
        if not taken:
            return [], [], [], []
        heads = [q.popleft() for _, q in taken]
        rest = [(sid, q) for sid, q in taken if q]
        if rest:
            # the streams' next steps queue by their arrival among the others
            waiting.update(rest)
            if len(waiting) > 1:
                self._waiting = dict(sorted(waiting.items(), key=_head_time))
        ids = [sid for sid, _ in taken]
        futs, xs, ts = (list(c) for c in zip(*heads))
        table = self.table
        if not all(map(self._has, ids)) or any(map(_done, futs)):
            keep = []
            for i, (sid, f) in enumerate(zip(ids, futs)):
                if f.done():       # cancelled by a submit() caller while it waited
                    self._cancelled += 1
                    continue
                if sid not in table:
                    self._failed += 1
                    f.set_exception(UnknownStreamError(_unknown(sid)))
                    continue
                keep.append(i)
            ids = [ids[i] for i in keep]
            futs = [futs[i] for i in keep]
            xs = [xs[i] for i in keep]
            ts = [ts[i] for i in keep]
        return ids, futs, xs, ts

    def _compute(self, ids: List[Hashable], x: _Array) -> Tuple[_Array, Optional[List[int]]]:
        """One table step of the batch, in the worker thread. Streams that
        the table no longer holds (closed or evicted since the batch
        formed) are dropped and the rest rerun; returns y and the batch
        rows it holds (None: all)."""
        table = self.table
        keep: Optional[List[int]] = None
        while True:
            try:
                return table.step(ids, x), keep
            except UnknownStreamError:
                rows = [i for i, sid in enumerate(ids) if sid in table]
                if len(rows) == len(ids):
                    raise              # not for want of a stream: report it
                keep = rows if keep is None else [keep[i] for i in rows]
                ids = [ids[i] for i in rows]
                x = x[rows]
                if not ids:
                    return x[:0], keep

    async def _work(self) -> None:
        try:
            await self._serve()
        except BaseException as e:
            # a worker that stops for any other reason than aclose leaves no
            # step waiting forever: they, and later steps, get the error
            self._closed = True
            self._fail_waiting(e if isinstance(e, Exception) else RuntimeError("batcher stopped"))
            raise

    def _fail_waiting(self, err: Exception) -> None:
        """Gives every waiting step and block the error, and empties the queues."""
        for q in self._waiting.values():
            for fut, _, _ in q:
                if not fut.done():
                    self._failed += 1
                    fut.set_exception(err)
            q.clear()
        self._waiting.clear()
        blocks, self._blocks = self._blocks, deque()
        for sink, ids, _, _ in blocks:
            if not sink.done():
                self._failed += len(ids)
                sink.set_exception(err)
        self._pending = self._block_steps = 0

    async def _serve(self) -> None:
        loop = self._loop
        assert loop is not None
        done: Optional[Tuple[List[Hashable], List[asyncio.Future[_Array]], _Array,
                             Optional[List[int]], List[_Block]]] = None
        while not self._closed:
            # the next batch starts before the last one's steps are answered,
            # so that the event loop serves them while the model runs
            running = None
            if (self._waiting or self._blocks) and self._ready() is None:
                ids, futs, xs, ts, blocks = self._take()
                if blocks:
                    ids = self._block_ids(blocks, ids)
                if ids:
                    start = _now()
                    x = self._gather(xs, blocks, len(ids))
                    running = loop.run_in_executor(self._executor, self._compute, ids, x)
            if done is not None:
                self._answer(*done)
                done = None
                if running is None:
                    # the streams just answered step again before the next batch forms
                    await asyncio.sleep(0)
                    continue
            if running is None:
                deadline = self._ready() if self._waiting or self._blocks else None
                if (self._waiting or self._blocks) and deadline is None:
                    continue           # ready now (the last take ran nothing)
                await self._sleep(deadline)
                continue
            try:
                y, keep = await running
            except Exception as e:   # the whole batch failed: each step gets the error
                for f in futs:
                    if not f.done():
                        self._failed += 1
                        f.set_exception(e)
                for b in blocks:
                    if not b[0].done():
                        self._failed += len(b[1])
                        b[0].set_exception(e)
                continue
            self._record(start, _now(), ts, len(y), blocks)
            done = (ids, futs, y, keep, blocks)
        if done is not None:
            self._answer(*done)

    @staticmethod
    def _block_ids(blocks: List[_Block], ids: List[Hashable]) -> List[Hashable]:
        """The batch's stream ids: the blocks' in order, then the single steps'."""
        if len(blocks) == 1 and not ids:
            return blocks[0][1]
        out: List[Hashable] = []
        for b in blocks:
            out += b[1]
        return out + ids

    def _gather(self, xs: List[_Array], blocks: List[_Block], n: int) -> _Array:
        """The batch's x, n rows: the blocks' rows in order, then the single
        steps'; a lone block's own array when the table takes it as it is."""
        if not blocks:
            return np.stack(xs, out=self._xbuf[:n])
        if len(blocks) == 1 and not xs:
            x = blocks[0][2]
            if x.dtype == self._xdtype and x.flags.c_contiguous:
                return x
        if n > len(self._xbuf):    # a block past max_batch
            self._xbuf = np.empty((n, self._xshape[0]), self._xdtype)
        buf = self._xbuf[:n]
        k = 0
        for b in blocks:
            m = len(b[1])
            buf[k:k + m] = b[2]
            k += m
        if xs:
            np.stack(xs, out=buf[k:])
        return buf

    def _answer(self, ids: List[Hashable], futs: List[asyncio.Future[_Array]], y: _Array,
                keep: Optional[List[int]], blocks: List[_Block]) -> None:
        """Gives each step of a finished batch its row of y (or, for streams
        dropped from it, UnknownStreamError), and each block its rows."""
        if blocks:
            y, keep, ids = self._answer_blocks(ids, y, keep, blocks)
        if keep is not None:
            for i in set(range(len(ids))).difference(keep):
                if not futs[i].done():
                    self._failed += 1
                    futs[i].set_exception(UnknownStreamError(_unknown(ids[i])))
            futs = [futs[i] for i in keep]
        for f, row in zip(futs, y):
            try:
                f.set_result(row)
            except asyncio.InvalidStateError:
                pass               # cancelled while its batch ran: the result is dropped

    def _answer_blocks(self, ids: List[Hashable], y: _Array, keep: Optional[List[int]],
                       blocks: List[_Block]
                       ) -> Tuple[_Array, Optional[List[int]], List[Hashable]]:
        """Answers the blocks of a finished batch (the first rows of y): each
        gets its rows, or UnknownStreamError when one of its streams was
        dropped from the batch. Returns y, keep and ids of the single steps
        that follow, as _answer takes them."""
        lost: set = set()
        if keep is not None:
            full = np.zeros((len(ids),) + y.shape[1:], y.dtype)
            if keep:
                full[keep] = y
            lost = set(range(len(ids))).difference(keep)
            y = full
        k = 0
        for sink, bids, _, _ in blocks:
            m = len(bids)
            gone = [r for r in range(k, k + m) if r in lost] if lost else None
            if gone:
                if not sink.done():
                    self._failed += m
                    sink.set_exception(UnknownStreamError(_unknown(ids[gone[0]])))
            else:
                try:
                    sink.set_result(y[k:k + m])
                except asyncio.InvalidStateError:
                    pass           # cancelled while its batch ran: the result is dropped
            k += m
        if keep is None:
            return y[k:], None, ids[k:]
        rest = [r - k for r in range(k, len(ids)) if r not in lost]
        return y[k:][rest], rest, ids[k:]

    def _record(self, start: float, end: float, ts: List[float], n: int,
                blocks: List[_Block]) -> None:
        self._batches += 1
        self._steps += n
        if n >= len(self._sizes):  # a block past max_batch
            self._sizes += [0] * (n + 1 - len(self._sizes))
        self._sizes[n] += 1
        if blocks:
            # a block's steps share one arrival time: recorded once, counted for each
            for t, count in itertools.chain(((b[3], len(b[1])) for b in blocks),
                                            zip(ts, itertools.repeat(1))):
                self._delays.extend(itertools.repeat(start - t, count))
                self._delay_hist.add_many(start - t, count)
                self._latency_hist.add_many(end - t, count)
            return
        arrived = np.fromiter(ts, np.float64, len(ts))
        delays = start - arrived
        self._delays.extend(delays.tolist())
        self._delay_hist.add(delays)
        self._latency_hist.add(end - arrived)


_done = operator.methodcaller("done")


class _Callback:
    """A waiting step's callback, in the place of its future: the batcher
    answers both through done, set_result and set_exception."""

    __slots__ = ("fn", "fired", "what")

    def __init__(self, fn: Callable[[Optional[_Array], Optional[BaseException]], Any],
                 what: str = "submit") -> None:
        self.fn = fn
        self.fired = False
        self.what = what      # the method that took it, for the loop's report

    def done(self) -> bool:
        return self.fired

    def set_result(self, y: _Array) -> None:
        self._call(y, None)

    def set_exception(self, error: BaseException) -> None:
        self._call(None, error)

    def _call(self, y: Optional[_Array], error: Optional[BaseException]) -> None:
        self.fired = True
        try:
            self.fn(y, error)
        except Exception as e:     # the batcher goes on; the loop's handler reports it
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"a StreamBatcher.{self.what} callback raised", "exception": e})


def _head_time(kv: Tuple[Hashable, Deque[_Item]]) -> float:
    return kv[1][0][2]
