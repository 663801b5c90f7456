"""One batch of a StreamBatcher: the single steps and blocks it took off
the queues, its x gathered in one array, its run as one table step (in a
worker thread), and the answers to its steps. Free of the event loop: a
step's sink is an asyncio future or the batcher's callback holder, answered
through done(), set_result() and set_exception()."""
from __future__ import annotations

import asyncio
from typing import Any, Hashable, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

from .._streams import StreamTable, UnknownStreamError, unknown_stream
from .stats import Stats

_Array = npt.NDArray[Any]
# a waiting block of submit_block: (its sink, its streams, its x rows, its arrival time)
Block = Tuple[Any, List[Hashable], _Array, float]


class Batch:
    """The steps of one batch: the blocks' (in order), then the single
    steps', whose streams, sinks, x rows and arrival times are ids, sinks,
    xs and ts."""

    __slots__ = ("ids", "sinks", "xs", "ts", "blocks")

    def __init__(self, ids: List[Hashable], sinks: List[Any], xs: List[_Array],
                 ts: List[float], blocks: List[Block]) -> None:
        self.sinks, self.xs, self.ts, self.blocks = sinks, xs, ts, blocks
        if not blocks:
            self.ids = ids
        elif len(blocks) == 1 and not ids:
            self.ids = blocks[0][1]
        else:
            self.ids = [sid for b in blocks for sid in b[1]] + ids

    def gather(self, buf: _Array) -> Tuple[_Array, _Array]:
        """The batch's x, and buf (rows of x as the table takes them: its
        dtype and width), replaced by a larger one for a block past it. x is
        a lone block's own array where the table takes it as it is, else
        rows of buf."""
        n, xs, blocks = len(self.ids), self.xs, self.blocks
        if not blocks:
            return np.stack(xs, out=buf[:n]), buf
        if len(blocks) == 1 and not xs:
            x = blocks[0][2]
            if x.dtype == buf.dtype and x.flags.c_contiguous:
                return x, buf
        if n > len(buf):    # a block past max_batch
            buf = np.empty((n, buf.shape[1]), buf.dtype)
        out = buf[:n]
        k = 0
        for b in blocks:
            m = len(b[1])
            out[k:k + m] = b[2]
            k += m
        if xs:
            np.stack(xs, out=out[k:])
        return out, buf

    def run(self, table: StreamTable, x: _Array) -> Tuple[_Array, Optional[List[int]]]:
        """One table step of the batch (in the worker thread). Streams that
        the table no longer holds (closed or evicted since the batch formed)
        are dropped and the rest rerun; returns y and the batch rows it
        holds (None: all)."""
        ids = self.ids
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

    def record(self, stats: Stats, start: float, end: float, n: int) -> None:
        """Counts the batch, of n steps run from start to end."""
        stats.record(start, end, self.ts, n, [(b[3], len(b[1])) for b in self.blocks])

    def fail(self, error: Exception, stats: Stats) -> None:
        """Gives every step of the batch the error (the whole batch failed)."""
        for f in self.sinks:
            if not f.done():
                stats.failed += 1
                f.set_exception(error)
        for b in self.blocks:
            if not b[0].done():
                stats.failed += len(b[1])
                b[0].set_exception(error)

    def answer(self, y: _Array, keep: Optional[List[int]], stats: Stats) -> None:
        """Gives each step its row of y (or, for streams dropped from the
        batch, UnknownStreamError), and each block its rows."""
        ids, sinks = self.ids, self.sinks
        if self.blocks:
            y, keep, ids = self._answer_blocks(y, keep, stats)
        if keep is not None:
            for i in set(range(len(ids))).difference(keep):
                if not sinks[i].done():
                    stats.failed += 1
                    sinks[i].set_exception(unknown_stream(ids[i]))
            sinks = [sinks[i] for i in keep]
        for f, row in zip(sinks, y):
            try:
                f.set_result(row)
            except asyncio.InvalidStateError:
                pass               # cancelled while its batch ran: the result is dropped

    def _answer_blocks(self, y: _Array, keep: Optional[List[int]], stats: Stats
                       ) -> Tuple[_Array, Optional[List[int]], List[Hashable]]:
        """Answers the blocks (the first rows of y): each gets its rows, or
        UnknownStreamError when one of its streams was dropped from the
        batch. Returns y, keep and ids of the single steps that follow, as
        answer takes them."""
        ids = self.ids
        lost: set = set()
        if keep is not None:
            full = np.zeros((len(ids),) + y.shape[1:], y.dtype)
            if keep:
                full[keep] = y
            lost = set(range(len(ids))).difference(keep)
            y = full
        k = 0
        for sink, bids, _, _ in self.blocks:
            m = len(bids)
            gone = [r for r in range(k, k + m) if r in lost] if lost else None
            if gone:
                if not sink.done():
                    stats.failed += m
                    sink.set_exception(unknown_stream(ids[gone[0]]))
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
