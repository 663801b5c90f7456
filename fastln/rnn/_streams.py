"""StreamTable: the states of many streams of one recurrent model in one
preallocated table, stepped together in batches.

A server that runs a model over many independent streams (one per client,
each sending one step at a time) keeps each stream's state between its
steps. The table holds those states in arrays of shape (layers, capacity,
H) that it owns; a stream is a slot (a row) of them. ``step(ids, x)``
gathers the named streams' rows, runs one batched step of the model and
scatters the new states back, in one call into the C engine with the GIL
released. Because the engine's rows do not depend on the other rows of
the batch (float32 and bfloat16 on x86), a stream's outputs are bitwise
those of the stream run alone, whatever batch it lands in.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

from .. import _validate
from .base import RecurrentModel

__all__ = ["StreamTable", "TableFullError", "UnknownStreamError"]

_Array = npt.NDArray[Any]

# a stream's state as export_state returns it: h, or (h, c), each (layers, 1, H)
StreamState = Union[_Array, Tuple[_Array, _Array]]


class TableFullError(RuntimeError):
    """open() or import_state() on a table whose every slot holds a stream
    (a server answers 503, or evicts and retries)."""


class UnknownStreamError(KeyError):
    """A stream id that the table does not hold: never opened, closed, or
    evicted."""

    def __str__(self) -> str:   # KeyError's str() is the repr of its argument
        return str(self.args[0]) if self.args else ""


class StreamTable:
    """The states of up to `capacity` streams of one model, stepped in batches.

    Parameters
    ----------
    model : fastln.rnn model
        Any of the six models, unidirectional and not reverse (as
        :meth:`~fastln.rnn.LNLSTM.step` requires), float32, float64 or
        bfloat16. The table reads the model's parameters at every step, so
        changes to them apply from the next step on.
    capacity : int
        The most streams the table holds at once; the state arrays are
        allocated for all of them up front.
    idle_timeout : float, optional
        Seconds after its last step (or its opening) at which a stream is
        evicted; None (the default) keeps streams until they are closed.
        Eviction runs from :meth:`open`, :meth:`step` and
        :meth:`evict_idle`.
    on_evict : callable, optional
        Called as ``on_evict(stream_id, state)`` for each evicted stream,
        with its state as :meth:`export_state` gives it, so that a server
        can tell the client or keep the state. It runs on the thread that
        evicts, outside the table's lock. When it raises, it is still
        called for the other streams of the same sweep, and then the first
        error propagates (from :meth:`open`, :meth:`step` or
        :meth:`evict_idle`, whichever swept).
    clock : callable, optional
        The time source of the idle timeout, in seconds (default
        ``time.monotonic``).

    Raises
    ------
    TypeError, ValueError
        For a model that is not a fastln.rnn model or cannot step (bidirectional
        or reverse), a capacity that is not a positive int, a negative
        idle_timeout, or an on_evict that is not callable.

    Notes
    -----
    Thread-safe: any number of threads may open, step, close, export and
    import at once. Steps run one at a time (each uses the engine's
    threads); a stream closed or evicted while a step that names it runs
    keeps its slot until that step has written it, so a slot is never
    shared by two streams, nor freed twice. A stream's results are bitwise
    those of ``model.step`` on that stream alone, in any batch, after
    evictions of others, and through :meth:`export_state` and
    :meth:`import_state` (on the float32 and bfloat16 x86 paths, where the
    engine is batch invariant; elsewhere they agree to rounding).

    Examples
    --------
    >>> import numpy as np
    >>> from fastln.rnn import LNLSTM, StreamTable
    >>> m = LNLSTM(input_size=3, hidden_size=4, seed=0)
    >>> table = StreamTable(m, capacity=8)
    >>> a, b = table.open(), table.open("client-7")
    >>> y = table.step([a, b], np.ones((2, 3), np.float32))
    >>> y.shape
    (2, 4)
    >>> table.close(a)
    >>> len(table)
    1
    """

    def __init__(self, model: RecurrentModel[Any], capacity: int, *,
                 idle_timeout: Optional[float] = None,
                 on_evict: Optional[Callable[[Hashable, StreamState], Any]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(model, RecurrentModel):
            raise TypeError(f"model must be a fastln.rnn model, got {type(model).__name__}")
        if model.bidirectional or model.reverse:
            raise ValueError("model must run forward in time (not bidirectional nor reverse): "
                             "a table steps its streams one step at a time")
        self.capacity = _validate.positive_int(capacity, "capacity")
        if idle_timeout is not None:
            idle_timeout = float(idle_timeout)
            if not idle_timeout >= 0:
                raise ValueError(f"idle_timeout must be None or at least 0, got {idle_timeout}")
        if on_evict is not None and not callable(on_evict):
            raise TypeError(f"on_evict must be callable, got {type(on_evict).__name__}")
        self.model = model
        self.idle_timeout = idle_timeout
        self.on_evict = on_evict
        self._clock = clock
        shapes = model._state_shapes(self.capacity, model.num_layers)
        sdt = model._dt   # the state's dtype (float32 for a bfloat16 model)
        self._h = np.zeros(shapes[0], sdt)
        self._c = np.zeros(shapes[1], sdt) if model._has_cell else None
        self._lock = threading.Lock()        # the maps below
        self._step_lock = threading.Lock()   # one step at a time
        self._slot: Dict[Hashable, int] = {}
        self._last = np.zeros(self.capacity)   # per slot: the time of its last step
        self._steps = np.zeros(self.capacity, np.int64)   # per slot: steps since admitted
        self._free = list(range(self.capacity - 1, -1, -1))   # pop() gives slot 0 first
        self._busy: set[int] = set()          # slots of the step that runs
        self._release: List[int] = []         # slots freed during that step
        self._ids = itertools.count()
        self._next_sweep = -np.inf
        self.evicted = 0

    # ---- streams ---------------------------------------------------------

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._slot

    def ids(self) -> List[Hashable]:
        """The ids of the streams the table holds.

        Returns
        -------
        list of hashable
            In the order the streams were opened or imported.
        """
        with self._lock:
            return list(self._slot)

    def open(self, stream_id: Optional[Hashable] = None) -> Hashable:
        """Starts a stream with a zero state; returns its id.

        Parameters
        ----------
        stream_id : hashable, optional
            The stream's id; None (the default) takes a new int that the
            table has not given before.

        Returns
        -------
        hashable
            The id.

        Raises
        ------
        TableFullError
            When every slot holds a stream (after evicting idle ones).
        ValueError
            When a stream with that id is open.
        TypeError
            For an id that is not hashable.
        """
        return self._admit(stream_id, None)

    def close(self, stream_id: Hashable) -> None:
        """Ends a stream and frees its slot.

        Parameters
        ----------
        stream_id : hashable
            The stream.

        Raises
        ------
        UnknownStreamError
            When the table holds no stream with that id.
        """
        with self._lock:
            self._drop(stream_id)

    def export_state(self, stream_id: Hashable) -> StreamState:
        """A copy of a stream's state; the stream stays open.

        Parameters
        ----------
        stream_id : hashable
            The stream.

        Returns
        -------
        ndarray or tuple of ndarray
            The state in the form of the model's ``step`` state for a batch
            of one: h (num_layers, 1, H), or (h, c) for an LSTM, in the
            state's dtype (float32 for a bfloat16 model). :meth:`import_state`,
            here or in another process's table of the same model, continues
            the stream bitwise.

        Raises
        ------
        UnknownStreamError
            When the table holds no stream with that id.
        """
        with self._step_lock, self._lock:
            return self._state_of(self._lookup(stream_id))

    def snapshot(self, ids: Sequence[Hashable]) -> Tuple[_Array, StreamState]:
        """The states of several streams, and how many steps each has taken,
        at one instant between two steps; the streams stay open.

        Parameters
        ----------
        ids : sequence of hashable
            The streams.

        Returns
        -------
        steps : ndarray of int64, shape (len(ids),)
            The steps each stream has taken in this table since it was
            opened or imported: its state is the state after that many steps.
        state : ndarray or tuple of ndarray
            The states, in the form of the model's ``step`` state for a batch
            of len(ids): h (num_layers, len(ids), H), or (h, c) for an LSTM;
            column i is stream ids[i]'s, as :meth:`export_state` gives it.

        Raises
        ------
        UnknownStreamError
            For an id the table does not hold.

        Notes
        -----
        A server checkpoints its streams with it: the steps tell which of
        the steps it has answered each state includes, since a step may
        have run and not yet been answered.
        """
        ids = list(ids)
        with self._step_lock, self._lock:
            slots = np.fromiter(map(self._lookup, ids), np.int64, len(ids))
            steps = self._steps[slots]
            h = self._h[:, slots]
            return steps, (h if self._c is None else (h, self._c[:, slots]))

    def import_state(self, state: StreamState, stream_id: Optional[Hashable] = None) -> Hashable:
        """Opens a stream with the given state.

        Parameters
        ----------
        state : ndarray or tuple of ndarray
            As :meth:`export_state` returns it, or as the model's ``step``
            takes it for B = 1.
        stream_id : hashable, optional
            The stream's id; None (the default) takes a new one, as
            :meth:`open`.

        Returns
        -------
        hashable
            The id.

        Raises
        ------
        TableFullError, ValueError, TypeError
            As :meth:`open`; TypeError and ValueError also for a state of
            the wrong form, shape or dtype.
        """
        parts = self.model._states(state, 1, "state")
        return self._admit(stream_id, parts)

    def evict_idle(self, now: Optional[float] = None) -> List[Hashable]:
        """Evicts the streams idle for at least idle_timeout seconds.

        Parameters
        ----------
        now : float, optional
            The time to measure idleness at; default the table's clock.

        Returns
        -------
        list of hashable
            The evicted streams' ids, after on_evict was called for each.
            Empty without an idle_timeout.
        """
        if self.idle_timeout is None:
            return []
        now = self._clock() if now is None else now
        gone: List[Tuple[Hashable, StreamState]] = []
        with self._step_lock, self._lock:
            self._next_sweep = now + self.idle_timeout / 8
            sids = list(self._slot)
            used = np.fromiter(self._slot.values(), np.int64, len(sids))
            last = self._last[used]
            idle = np.flatnonzero(last <= now - self.idle_timeout)
            for i in idle[np.argsort(last[idle], kind="stable")]:   # oldest first
                gone.append((sids[i], self._state_of(int(used[i]))))
                self._drop(sids[i])
            self.evicted += len(gone)
        if self.on_evict is not None:
            _call_each(self.on_evict, gone)
        return [sid for sid, _ in gone]

    # ---- stepping --------------------------------------------------------

    def step(self, ids: Sequence[Hashable], x: npt.ArrayLike,
             out: Optional[_Array] = None) -> _Array:
        """One step of the streams `ids`, batched.

        Parameters
        ----------
        ids : sequence of hashable
            The streams, each at most once.
        x : array_like, shape (len(ids), input_size)
            Row i is stream ids[i]'s input, in the model's float type (as
            the model's ``step`` takes it).
        out : ndarray, optional
            Where to write y: C-contiguous, (len(ids), hidden_size), the
            model's dtype.

        Returns
        -------
        y : ndarray, shape (len(ids), hidden_size)
            The top layer's outputs, row i stream ids[i]'s.

        Raises
        ------
        UnknownStreamError
            For an id the table does not hold.
        ValueError
            For an id given twice, or x or out of the wrong shape.
        TypeError
            For x or out of the wrong type.
        """
        self._sweep_if_due()
        ids = list(ids)
        B = len(ids)
        with self._step_lock:
            with self._lock:
                slot = self._slot
                try:
                    rows = [slot[sid] for sid in ids]
                except (KeyError, TypeError):
                    rows = list(map(self._lookup, ids))   # raises the error for the bad id
                busy = set(rows)
                if len(busy) != B:
                    raise ValueError(f"ids names a stream more than once: {repeated(ids)!r}")
                slots = np.array(rows, np.int64)
                self._busy = busy
                self._last[slots] = self._clock()
            try:
                y = self.model._table_step(self._h, self._c, slots, x, out)
                self._steps[slots] += 1
                return y
            finally:
                with self._lock:
                    self._busy = set()
                    self._free.extend(self._release)
                    self._release.clear()

    # ---- internals -------------------------------------------------------

    def _sweep_if_due(self) -> None:
        """evict_idle() when the last sweep is an eighth of idle_timeout old."""
        if self.idle_timeout is not None and self._clock() >= self._next_sweep:
            self.evict_idle()

    def _state_of(self, slot: int) -> StreamState:
        """A copy of slot's state, in export_state's form (the lock held)."""
        h = self._h[:, slot:slot + 1].copy()
        return h if self._c is None else (h, self._c[:, slot:slot + 1].copy())

    def _lookup(self, stream_id: Hashable) -> int:
        try:
            return self._slot[stream_id]
        except KeyError:
            raise unknown_stream(stream_id) from None
        except TypeError:
            raise TypeError(f"stream ids must be hashable, got "
                            f"{type(stream_id).__name__}") from None

    def _drop(self, stream_id: Hashable) -> None:
        """Removes a stream (the lock held); its slot returns to the free
        list now, or after the running step when that step names it."""
        slot = self._lookup(stream_id)
        del self._slot[stream_id]
        (self._release if slot in self._busy else self._free).append(slot)

    def _admit(self, stream_id: Optional[Hashable], parts: Optional[List[_Array]]) -> Hashable:
        self._sweep_if_due()
        if self.idle_timeout is not None and not self._free:
            self.evict_idle()   # a full table evicts its idle streams before it refuses
        with self._lock:
            if stream_id is None:
                stream_id = next(self._ids)
                while stream_id in self._slot:
                    stream_id = next(self._ids)
            else:
                try:
                    if stream_id in self._slot:
                        raise ValueError(f"a stream with id {stream_id!r} is open")
                except TypeError:
                    raise TypeError(f"stream_id must be hashable, got "
                                    f"{type(stream_id).__name__}") from None
            if not self._free:
                raise TableFullError(f"the table holds {self.capacity} streams, its capacity: "
                                     f"close or evict one first")
            slot = self._free.pop()
            if parts is None:
                self._h[:, slot] = 0
                if self._c is not None:
                    self._c[:, slot] = 0
            else:
                self._h[:, slot] = parts[0][:, 0]
                if self._c is not None:
                    self._c[:, slot] = parts[1][:, 0]
            self._slot[stream_id] = slot
            self._last[slot] = self._clock()
            self._steps[slot] = 0
        return stream_id


def _call_each(on_evict: Callable[[Hashable, StreamState], Any],
               gone: List[Tuple[Hashable, StreamState]]) -> None:
    """on_evict(stream_id, state) for every evicted stream, even when some
    calls raise (each state is handed over once, and only there); then the
    first error propagates, the later ones noted on it."""
    first: Optional[BaseException] = None
    for sid, st in gone:
        try:
            on_evict(sid, st)
        except Exception as e:
            if first is None:
                first = e
            elif hasattr(first, "add_note"):   # Python 3.11+
                first.add_note(f"on_evict also raised for stream {sid!r}: {e!r}")
    if first is not None:
        raise first


def unknown_stream(stream_id: Hashable) -> UnknownStreamError:
    """The UnknownStreamError of stream_id."""
    return UnknownStreamError(f"no open stream has id {stream_id!r} (never opened, closed, "
                              f"or evicted)")


def repeated(ids: Iterable[Hashable]) -> Hashable:
    """The first id that ids names a second time (None if none does)."""
    seen = set()
    for sid in ids:
        if sid in seen:
            return sid
        seen.add(sid)
    return None
