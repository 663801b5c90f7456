"""The waiting steps of a StreamBatcher and the discipline of its batches:
a queue per stream, the streams with waiting steps in the arrival order of
their head step, and the blocks of submit_block; when a batch may run, and
which steps it takes (at most one per stream, oldest first, a stream's
steps in order). Free of the event loop: a step's sink is anything with
done(), set_result() and set_exception(), and times are given."""
from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from typing import Any, Deque, Dict, Hashable, List, Optional, Tuple

import numpy.typing as npt

from .._streams import StreamTable, unknown_stream
from .batch import Batch, Block
from .stats import Stats

_Array = npt.NDArray[Any]
# a waiting step: (its sink, its x row, its arrival time)
_Item = Tuple[Any, _Array, float]

_done = operator.methodcaller("done")


class OverloadedError(RuntimeError):
    """A step refused because its stream's queue, or the batcher's queue of
    waiting steps over all streams, is full (a server answers 429 or 503)."""


class StepQueues:
    """The waiting steps of a batcher of table's streams, under its limits
    (see StreamBatcher's parameters); stats counts the steps refused,
    cancelled and failed."""

    def __init__(self, table: StreamTable, stats: Stats, *, max_batch: int, max_delay: float,
                 run_when_all_waiting: bool, max_queue_per_stream: int,
                 max_pending: int) -> None:
        self.table = table
        self.stats = stats
        self.max_batch = max_batch
        self.max_delay = max_delay
        self.run_when_all_waiting = run_when_all_waiting
        self.max_queue_per_stream = max_queue_per_stream
        self.max_pending = max_pending
        # each stream's queue of waiting steps (kept while it is empty), and
        # the streams with waiting steps, in the arrival order of their head step
        self.queues: Dict[Hashable, Deque[_Item]] = {}
        self.waiting: Dict[Hashable, Deque[_Item]] = {}
        self.unsorted = False     # a head step was removed: re-sort before the next batch
        # the blocks of submit_block, in arrival order, and the steps they hold
        self.blocks: Deque[Block] = deque()
        self.block_steps = 0
        self.pending = 0          # waiting steps over all streams

    def __bool__(self) -> bool:
        """Whether a step or a block waits."""
        return bool(self.waiting or self.blocks)

    def add(self, stream_id: Hashable, sink: Any, x: _Array, t: float) -> bool:
        """Queues one step of a stream (x its row, t its arrival time, sink
        what answers it), or raises OverloadedError past a limit. Returns
        whether the step lets a batch run at once."""
        q = self.queues.get(stream_id)
        if q is None:
            q = self._new_queue(stream_id)
        waiting = self.waiting
        if self.pending >= self.max_pending or len(q) >= self.max_queue_per_stream:
            self.purge()              # steps cancelled while they waited make room
            if self.pending >= self.max_pending or len(q) >= self.max_queue_per_stream:
                raise self._overloaded(q, stream_id)
        if not q:
            waiting[stream_id] = q    # its first waiting step: it queues last
        q.append((sink, x, t))
        self.pending += 1
        return (self.max_delay == 0 or len(waiting) == 1 or len(waiting) >= self.max_batch
                or (self.run_when_all_waiting and len(waiting) >= len(self.table)))

    def add_block(self, sink: Any, ids: List[Hashable], x: _Array, t: float) -> None:
        """Queues a block of steps of the streams ids (x its rows, t its
        arrival time, sink what answers it), or raises OverloadedError past
        max_pending."""
        n = len(ids)
        if self.pending + n > self.max_pending:
            self.purge()
            if self.pending + n > self.max_pending:
                self.stats.rejected += 1
                raise OverloadedError(f"{self.pending} steps are waiting and the block holds "
                                      f"{n}: past the batcher's limit (max_pending)")
        self.blocks.append((sink, ids, x, t))
        self.pending += n
        self.block_steps += n

    def _new_queue(self, stream_id: Hashable) -> Deque[_Item]:
        """A stream's queue, kept while the stream lives; the queues of
        streams the table no longer holds go when they outnumber its
        capacity."""
        queues = self.queues
        if len(queues) >= 2 * self.table.capacity:
            for sid in [sid for sid, q in queues.items() if not q and sid not in self.table]:
                del queues[sid]
        q = queues[stream_id] = deque()
        return q

    def _overloaded(self, q: Deque[_Item], stream_id: Hashable) -> OverloadedError:
        self.stats.rejected += 1
        if len(q) >= self.max_queue_per_stream:
            return OverloadedError(f"stream {stream_id!r} has {len(q)} steps waiting, its limit "
                                   f"(max_queue_per_stream)")
        return OverloadedError(f"{self.pending} steps are waiting, the batcher's limit "
                               f"(max_pending)")

    def purge(self) -> None:
        """Removes the waiting steps whose sinks are done: futures that
        submit()'s callers cancelled without telling the batcher."""
        stats = self.stats
        if any(map(_done, (b[0] for b in self.blocks))):
            blocks = [b for b in self.blocks if not b[0].done()]
            gone = sum(len(b[1]) for b in self.blocks) - sum(len(b[1]) for b in blocks)
            stats.cancelled += gone
            self.pending -= gone
            self.block_steps -= gone
            self.blocks = deque(blocks)
        for sid, q in list(self.waiting.items()):
            if not any(map(_done, (item[0] for item in q))):
                continue
            head = q[0]
            kept = [item for item in q if not item[0].done()]
            stats.cancelled += len(q) - len(kept)
            self.pending -= len(q) - len(kept)
            q.clear()
            q.extend(kept)
            if not q:
                del self.waiting[sid]
            elif q[0] is not head:
                self.unsorted = True

    def withdraw(self, stream_id: Hashable, sink: Any) -> None:
        """Removes a cancelled step that no batch has taken yet."""
        q = self.queues.get(stream_id)
        if q is None:
            return
        k = next((k for k, item in enumerate(q) if item[0] is sink), None)
        if k is None:
            return                 # in a batch already: its result is dropped
        del q[k]
        self.pending -= 1
        self.stats.cancelled += 1
        if not q:
            if self.waiting.get(stream_id) is q:
                del self.waiting[stream_id]
        elif k == 0:
            self.unsorted = True

    def ready(self, now: float) -> Optional[float]:
        """None when a batch may run now, else the time at which it may.
        A block's steps count as that many waiting streams (they may share
        streams with other waiting steps: a batch may then run before the
        delay ends, never later)."""
        waiting = self.waiting
        count = len(waiting) + self.block_steps
        if (self.max_delay == 0 or count >= self.max_batch
                or (self.run_when_all_waiting and count >= len(self.table))):
            return None
        if not waiting:
            oldest = self.blocks[0][3]
        else:
            oldest = min(q[0][2] for q in waiting.values()) if self.unsorted else \
                next(iter(waiting.values()))[0][2]
            if self.blocks:
                oldest = min(oldest, self.blocks[0][3])
        deadline = oldest + self.max_delay
        return None if now >= deadline else deadline

    def take(self) -> Batch:
        """Takes the next batch off the queues: the head step of each of the
        (up to max_batch) streams whose head steps are the oldest, or, with
        blocks waiting, what _take_with_blocks takes."""
        waiting = self.waiting
        if self.unsorted:
            self.unsorted = False
            waiting = self.waiting = dict(sorted(waiting.items(), key=_head_time))
        if self.blocks:
            return self._take_with_blocks()
        if len(waiting) <= self.max_batch:
            taken = list(waiting.items())
            waiting = self.waiting = {}
        else:
            taken = list(itertools.islice(waiting.items(), self.max_batch))
            for sid, _ in taken:
                del waiting[sid]
        return Batch(*self._heads(taken), [])

    def _take_with_blocks(self) -> Batch:
        """The next batch when blocks wait: the waiting units (a stream's
        head step, or a block) oldest first, each taken when none of its
        streams is in the batch already or has an older step left waiting,
        until max_batch steps; a block that does not fit is left (its
        streams with it), and one alone may pass max_batch."""
        items = list(self.waiting.items())
        blocks, kept = self.blocks, deque()   # type: Deque[Block], Deque[Block]
        claimed: set = set()       # streams in the batch
        held: set = set()          # streams with a step left waiting before the next unit
        taken, chosen = [], []     # type: List[Tuple[Hashable, Deque[_Item]]], List[Block]
        size, i, limit = 0, 0, self.max_batch
        has = self.table.__contains__
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
                self.stats.cancelled += n
            elif not all(map(has, ids)):   # a stream closed or evicted while it waited
                self.stats.failed += n
                sink.set_exception(unknown_stream(next(s for s in ids if not has(s))))
            elif (size and size + n > limit) or not claimed.isdisjoint(ids) or (
                    held and not held.isdisjoint(ids)):
                held.update(ids)
                kept.append(block)
                continue
            else:
                claimed.update(ids)
                chosen.append(block)
                size += n
            self.pending -= n
            self.block_steps -= n
        kept.extend(blocks)
        self.blocks = kept
        for sid, q in items[i:]:
            if size >= limit:
                break
            if sid not in claimed and sid not in held:
                claimed.add(sid)
                taken.append((sid, q))
                size += 1
        for sid, _ in taken:
            del self.waiting[sid]
        return Batch(*self._heads(taken), chosen)

    def _heads(self, taken: List[Tuple[Hashable, Deque[_Item]]]
               ) -> Tuple[List[Hashable], List[Any], List[_Array], List[float]]:
        """Pops the head step of each taken stream (whose queues are out of
        waiting), puts the streams with more steps back in arrival order,
        and drops cancelled steps and those of streams the table no longer
        holds. Returns the steps' ids, sinks, x rows and arrival times."""
        waiting = self.waiting
        self.pending -= len(taken)
        if not taken:
            return [], [], [], []
        heads = [q.popleft() for _, q in taken]
        rest = [(sid, q) for sid, q in taken if q]
        if rest:
            # the streams' next steps queue by their arrival among the others
            waiting.update(rest)
            if len(waiting) > 1:
                self.waiting = dict(sorted(waiting.items(), key=_head_time))
        ids = [sid for sid, _ in taken]
        sinks, xs, ts = (list(c) for c in zip(*heads))
        table = self.table
        if not all(map(table.__contains__, ids)) or any(map(_done, sinks)):
            keep = []
            for i, (sid, f) in enumerate(zip(ids, sinks)):
                if f.done():       # cancelled by a submit() caller while it waited
                    self.stats.cancelled += 1
                    continue
                if sid not in table:
                    self.stats.failed += 1
                    f.set_exception(unknown_stream(sid))
                    continue
                keep.append(i)
            ids = [ids[i] for i in keep]
            sinks = [sinks[i] for i in keep]
            xs = [xs[i] for i in keep]
            ts = [ts[i] for i in keep]
        return ids, sinks, xs, ts

    def fail(self, error: Exception) -> None:
        """Gives every waiting step and block the error, and empties the queues."""
        stats = self.stats
        for q in self.waiting.values():
            for sink, _, _ in q:
                if not sink.done():
                    stats.failed += 1
                    sink.set_exception(error)
            q.clear()
        self.waiting.clear()
        blocks, self.blocks = self.blocks, deque()
        for sink, ids, _, _ in blocks:
            if not sink.done():
                stats.failed += len(ids)
                sink.set_exception(error)
        self.pending = self.block_steps = 0


def _head_time(kv: Tuple[Hashable, Deque[_Item]]) -> float:
    return kv[1][0][2]
