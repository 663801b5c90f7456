"""The counters of a StreamBatcher: batches and steps run, their sizes, each
step's queue delay and latency (recent percentiles, and histograms), and the
steps refused, failed and cancelled."""
from __future__ import annotations

import bisect
import itertools
from collections import deque
from typing import Any, Deque, Dict, List, Tuple

import numpy as np
import numpy.typing as npt

_Array = npt.NDArray[Any]

# how many recent queue delays the metrics' percentiles are taken over
RING = 4096
# the upper bounds (seconds) of the metrics' delay and latency histograms;
# a last bucket holds what is above them
TIME_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                0.5, 1.0, 2.5)
_BOUNDS = np.array(TIME_BUCKETS)


class Histogram:
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


class Stats:
    """A batcher's counters (StreamBatcher.metrics says what each means)."""

    def __init__(self, max_batch: int) -> None:
        self.batches = 0
        self.steps = 0
        self.rejected = 0
        self.failed = 0
        self.cancelled = 0
        self.sizes = [0] * (max_batch + 1)
        self.delays: Deque[float] = deque(maxlen=RING)
        self.delay_hist, self.latency_hist = Histogram(), Histogram()

    def record(self, start: float, end: float, ts: List[float], n: int,
               blocks: List[Tuple[float, int]]) -> None:
        """Counts a batch of n steps that ran from start to end: its single
        steps arrived at ts, and its blocks as (arrival time, steps) pairs."""
        self.batches += 1
        self.steps += n
        if n >= len(self.sizes):  # a block past max_batch
            self.sizes += [0] * (n + 1 - len(self.sizes))
        self.sizes[n] += 1
        if blocks:
            # a block's steps share one arrival time: recorded once, counted for each
            for t, count in itertools.chain(blocks, zip(ts, itertools.repeat(1))):
                self.delays.extend(itertools.repeat(start - t, count))
                self.delay_hist.add_many(start - t, count)
                self.latency_hist.add_many(end - t, count)
            return
        arrived = np.fromiter(ts, np.float64, len(ts))
        delays = start - arrived
        self.delays.extend(delays.tolist())
        self.delay_hist.add(delays)
        self.latency_hist.add(end - arrived)

    def as_dict(self, pending: int) -> Dict[str, Any]:
        """The counters as StreamBatcher.metrics gives them, with the steps
        pending (less the table's counts)."""
        p50 = p99 = None
        if self.delays:
            p50, p99 = (float(v) for v in np.percentile(self.delays, [50, 99]))
        return {
            "batches": self.batches,
            "steps": self.steps,
            "batch_mean": self.steps / self.batches if self.batches else 0.0,
            "batch_max": max((s for s, c in enumerate(self.sizes) if c), default=0),
            "batch_sizes": {s: c for s, c in enumerate(self.sizes) if c},
            "queue_delay_p50": p50,
            "queue_delay_p99": p99,
            "queue_delay_histogram": self.delay_hist.as_dict(),
            "latency_histogram": self.latency_hist.as_dict(),
            "pending": pending,
            "rejected": self.rejected,
            "failed": self.failed,
            "cancelled": self.cancelled,
        }
