"""Many streams stepped one request at a time: the engine, StreamTable and
StreamBatcher, steps per second.

    python bench/streams.py [--streams 256] [--hidden 256] [--input 128] [--seconds 3]
                            [--threads 2] [--dtype float32|bfloat16] [--max-batch N]
                            [--naive] [--json PATH]

Three measurements of one model (LNLSTM(input, hidden), one layer), taken in
turns (engine, table, batcher, engine, ...) in one process on the same thread
count, each reported as the median over the rounds:

- engine: ``model.step(x, state)`` at B = streams, with read-only weights
  (packed once and kept), the state fed back, called from the main thread;
- engine in a thread: the same, called from a worker thread (the batcher
  runs its batches in one; OpenMP's teams of the main thread and of other
  threads are distinct, and their speeds can differ);
- table: ``StreamTable.step(ids, x)`` of all the streams at once;
- batcher: ``streams`` client coroutines, each looping
  ``await batcher.step(sid, x)`` on one stream, against one StreamBatcher
  (default settings but --max-batch) over the table; its steps/s are the
  steps completed over the timed window.

With --naive, a fourth turn times a plain batcher of the same clients for
reference: an asyncio.Queue of (stream, x, future), a worker that takes
what is waiting (one step per stream, the rest put back), stacks x, runs
``table.step`` in a thread and sets each future.

The ratios table/engine and batcher/engine (and batcher/engine in a thread)
say what the table and the batcher cost on top of the model step.
"""
import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the repository root, for an in-place build

import numpy as np  # noqa: E402

import fastln  # noqa: E402
from fastln import _selfcheck  # noqa: E402
from fastln.rnn import LNLSTM, StreamBatcher, StreamTable  # noqa: E402


def make_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--streams", type=int, default=256,
                   help="streams (the batch size of the engine and the table)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size")
    p.add_argument("--input", type=int, default=128, help="input size")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="timed seconds per measurement, split over the rounds")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the three measurements")
    p.add_argument("--threads", type=int, default=2, help="fastln threads")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the model's dtype")
    p.add_argument("--max-batch", type=int, default=None,
                   help="the batcher's max_batch (None: the table's capacity, --streams)")
    p.add_argument("--naive", action="store_true",
                   help="also time a plain batcher (an asyncio.Queue, one worker) for reference")
    p.add_argument("--json", default=None, help="also write the results to this JSON file")
    return p


def parse_args(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    for name in ("streams", "hidden", "input", "rounds", "threads", "max_batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.seconds > 0:
        p.error("--seconds must be positive")
    if args.json:
        _selfcheck.check_output_path(p, "--json", args.json)   # before the run, not after
    return args


def engine_rate(model, x, seconds):
    """model.step at B = len(x), state fed back: steps (rows) per second."""
    state = None
    n, t0 = 0, time.perf_counter()
    while True:
        _, state = model.step(x, state)
        n += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return n * len(x) / t


def engine_thread_rate(model, x, seconds):
    """engine_rate called from a worker thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(engine_rate, model, x, seconds).result()


def table_rate(table, ids, x, seconds):
    """StreamTable.step of every stream at once: steps per second."""
    n, t0 = 0, time.perf_counter()
    while True:
        table.step(ids, x)
        n += 1
        t = time.perf_counter() - t0
        if t >= seconds:
            return n * len(ids) / t


def batcher_rate(table, ids, x, seconds, warmup=0.1, max_batch=None):
    """len(ids) client coroutines stepping their streams through one
    StreamBatcher: steps completed per second over the timed window, and
    the batcher's metrics."""
    async def main():
        stop = False
        async with StreamBatcher(table, max_batch=max_batch) as batcher:
            async def client(sid, row):
                while not stop:
                    await batcher.step(sid, row)
            tasks = [asyncio.ensure_future(client(sid, x[i])) for i, sid in enumerate(ids)]
            await asyncio.sleep(warmup)
            s0, t0 = batcher.metrics()["steps"], time.perf_counter()
            await asyncio.sleep(seconds)
            s1, t1 = batcher.metrics()["steps"], time.perf_counter()
            stop = True
            await asyncio.gather(*tasks)
            return (s1 - s0) / (t1 - t0), batcher.metrics()
    return asyncio.run(main())


class NaiveBatcher:
    """The plain batcher of --naive (see the module docstring)."""

    def __init__(self, table):
        self.table = table
        self.queue = asyncio.Queue()
        self.steps = 0
        self.worker = asyncio.ensure_future(self.work())

    async def step(self, sid, x):
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((sid, x, fut))
        return await fut

    async def work(self):
        loop = asyncio.get_running_loop()
        while True:
            items = [await self.queue.get()]
            while not self.queue.empty():
                items.append(self.queue.get_nowait())
            batch, later, seen = [], [], set()
            for item in items:
                (later if item[0] in seen else batch).append(item)
                seen.add(item[0])
            for item in later:
                self.queue.put_nowait(item)
            x = np.stack([item[1] for item in batch])
            y = await loop.run_in_executor(None, self.table.step, [i[0] for i in batch], x)
            for i, item in enumerate(batch):
                item[2].set_result(y[i])
            self.steps += len(batch)


def naive_rate(table, ids, x, seconds, warmup=0.1):
    """batcher_rate with NaiveBatcher."""
    async def main():
        stop = False
        batcher = NaiveBatcher(table)

        async def client(sid, row):
            while not stop:
                await batcher.step(sid, row)
        tasks = [asyncio.ensure_future(client(sid, x[i])) for i, sid in enumerate(ids)]
        await asyncio.sleep(warmup)
        s0, t0 = batcher.steps, time.perf_counter()
        await asyncio.sleep(seconds)
        s1, t1 = batcher.steps, time.perf_counter()
        stop = True
        await asyncio.gather(*tasks)
        batcher.worker.cancel()
        return (s1 - s0) / (t1 - t0)
    return asyncio.run(main())


def run(streams=256, hidden=256, input_size=128, seconds=3.0, rounds=5, threads=2,
        dtype="float32", max_batch=None, naive=False):
    with fastln.threads(threads):
        return _run(streams, hidden, input_size, seconds, rounds, threads, dtype, max_batch,
                    naive)


def _run(streams, hidden, input_size, seconds, rounds, threads, dtype, max_batch, naive):
    model = LNLSTM(input_size, hidden, seed=0)
    if dtype == "bfloat16":
        model = model.to("bfloat16")
    for v in model.params.values():
        v.flags.writeable = False
    rng = np.random.default_rng(0)
    x = rng.standard_normal((streams, input_size)).astype(np.float32)
    if dtype == "bfloat16":
        x = x.astype(model.dtype)
    table = StreamTable(model, streams)
    ids = [table.open() for _ in range(streams)]
    each = seconds / rounds
    # one untimed call of each warms the packs, the threads and the allocator
    engine_rate(model, x, 0.05)
    table_rate(table, ids, x, 0.05)
    rates = {"engine": [], "engine_thread": [], "table": [], "batcher": []}
    metrics = None
    for _ in range(rounds):
        rates["engine"].append(engine_rate(model, x, each))
        rates["engine_thread"].append(engine_thread_rate(model, x, each))
        rates["table"].append(table_rate(table, ids, x, each))
        rate, metrics = batcher_rate(table, ids, x, each, max_batch=max_batch)
        rates["batcher"].append(rate)
        if naive:
            rates.setdefault("naive", []).append(naive_rate(table, ids, x, each))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "config": {"streams": streams, "hidden": hidden, "input": input_size, "seconds": seconds,
                   "rounds": rounds, "threads": threads, "dtype": dtype, "model": "LNLSTM",
                   "max_batch": max_batch or streams},
        "cpu": _selfcheck.cpu_model(), "python": platform.python_version(), "numpy": np.__version__,
        "rates": rates, "median": med,
        "table_vs_engine": med["table"] / med["engine"],
        "batcher_vs_engine": med["batcher"] / med["engine"],
        "batcher_vs_engine_thread": med["batcher"] / med["engine_thread"],
        "naive_vs_engine": med["naive"] / med["engine"] if naive else None,
        # the ratio within each round (its measurements a few seconds apart), median
        # over the rounds: steadier than the ratio of medians where load comes and goes
        "round_ratios": {f"{k}/engine": statistics.median(
            a / e for a, e in zip(rates[k], rates["engine"])) for k in rates if k != "engine"},
        "batcher_metrics": {k: v for k, v in metrics.items() if k != "batch_sizes"},
    }


def report(res):
    c = res["config"]
    lines = [f"LNLSTM({c['input']}, {c['hidden']}) {c['dtype']}, {c['streams']} streams, "
             f"{c['threads']} threads, {c['rounds']} rounds, batcher max_batch "
             f"{c['max_batch']}; {res['cpu']}"]
    for k, label in (("engine", f"engine model.step B={c['streams']}"),
                     ("engine_thread", "  the same, in a worker thread"),
                     ("table", f"StreamTable.step B={c['streams']}"),
                     ("batcher", f"StreamBatcher, {c['streams']} clients"),
                     ("naive", f"a plain batcher, {c['streams']} clients")):
        if k not in res["rates"]:
            continue
        runs = " ".join(f"{r:.0f}" for r in res["rates"][k])
        lines.append(f"  {label:34s} {res['median'][k]:10.0f} steps/s   (rounds: {runs})")
    lines.append(f"  table / engine   {res['table_vs_engine']:.3f}")
    lines.append(f"  batcher / engine {res['batcher_vs_engine']:.3f}")
    lines.append(f"  batcher / engine in a thread {res['batcher_vs_engine_thread']:.3f}")
    if res["naive_vs_engine"] is not None:
        lines.append(f"  plain batcher / engine {res['naive_vs_engine']:.3f}")
    lines.append("  per-round ratios, median: " + ", ".join(
        f"{k} {v:.3f}" for k, v in res["round_ratios"].items()))
    m = res["batcher_metrics"]
    lines.append(f"  batcher: mean batch {m['batch_mean']:.1f}, max {m['batch_max']}, "
                 f"queue delay p50 {1e3 * (m['queue_delay_p50'] or 0):.2f} ms, "
                 f"p99 {1e3 * (m['queue_delay_p99'] or 0):.2f} ms (last round)")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    res = run(args.streams, args.hidden, args.input, args.seconds, args.rounds, args.threads,
              args.dtype, args.max_batch, args.naive)
    print(report(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
