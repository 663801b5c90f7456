"""StreamBatcher: an asyncio front of a StreamTable that gathers the single
steps of many streams, arriving one request at a time, into batched table
steps.

A server (Starlette, aiohttp, grpc.aio, a raw TCP loop) awaits
``batcher.step(stream_id, x)`` in each request handler, or, from a
transport's callbacks, calls ``batcher.submit(stream_id, x, callback)``. A
transport whose messages each carry the steps of several streams hands
each message over whole with ``batcher.submit_block(ids, x, callback)``.
The batcher queues the steps (queues.py) and a worker task forms batches
of at most one step per stream, oldest first, and runs each (batch.py) in a
worker thread, so that the event loop keeps taking requests while the model
runs. The per-request work on the event loop is kept small (a future or a
callback, a deque append, one row view of the batch's output): with many
streams and a small model it is a large part of the cost of each step.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import math
import time
from typing import Any, Callable, Dict, Hashable, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from ... import _torch, _validate
from .._bf16 import _is_bf16
from .._streams import StreamTable, repeated, unknown_stream
from .batch import Batch
from .queues import StepQueues
from .stats import Stats

_Array = npt.NDArray[Any]

# the clock of arrival times and deadlines (the loop's own clock may be
# another one, as uvloop's, so timers are set with call_later)
_now = time.monotonic


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
        self.max_batch = table.capacity if max_batch is None else _validate.positive_int(
            max_batch, "max_batch")
        try:
            delay = float(max_delay)
        except (TypeError, ValueError):
            raise TypeError(f"max_delay must be a number of seconds, got "
                            f"{type(max_delay).__name__}") from None
        if not (delay >= 0 and math.isfinite(delay)):
            raise ValueError(f"max_delay must be finite and at least 0, got {max_delay}")
        self.max_delay = delay
        self.run_when_all_waiting = _validate.flag(run_when_all_waiting, "run_when_all_waiting")
        self.max_queue_per_stream = _validate.positive_int(max_queue_per_stream,
                                                           "max_queue_per_stream")
        self.max_pending = 4 * table.capacity if max_pending is None else _validate.positive_int(
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
        self._closed = False
        self._stats = Stats(self.max_batch)
        self._queues = StepQueues(table, self._stats, max_batch=self.max_batch,
                                  max_delay=self.max_delay,
                                  run_when_all_waiting=self.run_when_all_waiting,
                                  max_queue_per_stream=self.max_queue_per_stream,
                                  max_pending=self.max_pending)

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
            self._queues.withdraw(stream_id, fut)
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
            raise unknown_stream(next(s for s in ids if not self._has(s)))
        if len(set(ids)) != n:
            raise ValueError(f"ids names a stream more than once: {repeated(ids)!r}")
        if x.__class__ is not np.ndarray or x.shape != (n, self._xshape[0]) or (  # type: ignore
                x.dtype not in self._xdtypes):  # type: ignore[union-attr]
            x = self._convert_block(x, n)
        loop = self._loop or self._start()
        sink = loop.create_future() if callback is None else _Callback(callback, "submit_block")
        self._queues.add_block(sink, ids, x, _now())  # type: ignore[arg-type]
        self._rouse()
        return sink if callback is None else None  # type: ignore[return-value]

    def _queue(self, stream_id: Hashable, x: npt.ArrayLike, sink: Any) -> Any:
        """Queues one step; sink is a _Callback, or None for a new future. Returns the sink."""
        if self._closed:
            raise RuntimeError("batcher closed")
        if not self._has(stream_id):
            raise unknown_stream(stream_id)
        if x.__class__ is not np.ndarray or x.shape != self._xshape or (  # type: ignore
                x.dtype not in self._xdtypes):  # type: ignore[union-attr]
            x = self._convert(x)
        loop = self._loop or self._start()
        if sink is None:
            sink = loop.create_future()
        if self._queues.add(stream_id, sink, x, _now()) and self._wake is not None:  # type: ignore
            self._rouse()
        return sink

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
        self._queues.purge()
        return {**self._stats.as_dict(self._queues.pending), "active_streams": len(self.table),
                "evicted_streams": self.table.evicted}

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
        self._queues.fail(RuntimeError("batcher closed"))
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

    def _as_input(self, x: npt.ArrayLike) -> _Array:
        """x as an array of a dtype the model takes, or a TypeError: an
        ndarray or a torch tensor of another dtype is refused (the model's
        rule), a list is converted."""
        tensor = _torch.is_tensor(x)
        if tensor:
            x = _validate.tensor(x, "x")
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

    async def _work(self) -> None:
        try:
            await self._serve()
        except BaseException as e:
            # a worker that stops for any other reason than aclose leaves no
            # step waiting forever: they, and later steps, get the error
            self._closed = True
            self._queues.fail(e if isinstance(e, Exception) else RuntimeError("batcher stopped"))
            raise

    async def _serve(self) -> None:
        loop = self._loop
        assert loop is not None
        queues, stats = self._queues, self._stats
        done: Optional[Tuple[Batch, _Array, Optional[list]]] = None
        while not self._closed:
            # the next batch starts before the last one's steps are answered,
            # so that the event loop serves them while the model runs
            running = None
            if queues and queues.ready(_now()) is None:
                batch = queues.take()
                if batch.ids:
                    start = _now()
                    x, self._xbuf = batch.gather(self._xbuf)
                    running = loop.run_in_executor(self._executor, batch.run, self.table, x)
            if done is not None:
                done[0].answer(done[1], done[2], stats)
                done = None
                if running is None:
                    # the streams just answered step again before the next batch forms
                    await asyncio.sleep(0)
                    continue
            if running is None:
                deadline = queues.ready(_now()) if queues else None
                if queues and deadline is None:
                    continue           # ready now (the last take ran nothing)
                await self._sleep(deadline)
                continue
            try:
                y, keep = await running
            except Exception as e:   # the whole batch failed: each step gets the error
                batch.fail(e, stats)
                continue
            batch.record(stats, start, _now(), len(y))
            done = (batch, y, keep)
        if done is not None:
            done[0].answer(done[1], done[2], stats)


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
