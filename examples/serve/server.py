"""Serves one fastln.rnn model over HTTP (Starlette on uvicorn), keeping the
recurrent state of each client stream, with dynamic batching.

Run (with fastln importable: installed, or PYTHONPATH=. in a checkout built in place)::

    python examples/serve/model.py model.npz              # a new LN-LSTM, I=128, H=256
    python examples/serve/server.py --model model.npz [--port 8000] [--batching on|off]
        [--max-batch 256] [--window-ms 2] [--max-streams 1024]
    python examples/serve/server.py --onnx lstm.onnx     # an ONNX LSTM, GRU or RNN node

--model takes a file of model.py's save_model, an .npz of a forward LNLSTM,
LNGRU or LSTM's bare state_dict (np.savez(path, **model.state_dict())), or an
.onnx file (served as --onnx would).

Endpoints (JSON)::

    POST   /streams               -> 201 {"stream": id}        a new stream, zero state
    POST   /streams/{id}/step     {"x": [I numbers]} -> {"y": [H numbers], "t": step index}
    DELETE /streams/{id}          -> {"stream": id, "steps": steps run}
    GET    /health                -> the model, the settings and the batch statistics

y holds the float32 (or bfloat16, float64) values of the model's output as JSON
numbers, which read back to the same values. Bad requests get a 4xx status and
{"error": message}: 400 for a body that is not JSON, 422 for a JSON body that is
not {"x": [I finite numbers]}, 404 for an unknown stream, 413 for a body over
--max-body bytes, 429 when --max-streams streams are open, 503 when
--max-queue steps are waiting.

Dynamic batching (--batching on): each step request joins a queue. One batcher
task takes the requests that arrive within --window-ms of the oldest waiting
one (sooner once --max-batch requests wait, or as many as there are open
streams), stacks their x into (B, I) and their streams' states along the batch
axis, runs one ``model.step`` in a worker thread (the engine releases the GIL,
so the event loop keeps taking requests), then hands each stream its row of
the new state and each request its row of y. A batch holds at most one request
per stream: a second request for a stream waits for the next batch, so each
stream's steps run one after the other, in the order they arrived.
--batching off runs the same queue with batches of one request: one B=1 step
at a time, through the same worker thread.
"""
import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import secrets
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.routing import Route

import fastln

if __package__:
    from .model import HelpFormatter, check_streamable, config_of, freeze, input_dtype, load_model
else:   # run as a script: this directory is sys.path[0]
    from model import HelpFormatter, check_streamable, config_of, freeze, input_dtype, load_model


class StreamClosed(Exception):
    """The stream of a waiting step request was deleted before the step ran."""


class Stream:
    """One client stream: its state (a tuple of (num_layers, 1, H) arrays: (h,) or
    (h, c)), the number of steps it has run, and its waiting step requests."""

    __slots__ = ("id", "state", "t", "pending", "busy", "closed")

    def __init__(self, stream_id, state):
        self.id, self.state, self.t = stream_id, state, 0
        self.pending = collections.deque()   # (x, future, arrival time), oldest first
        self.busy = False                    # a step of it is running
        self.closed = False


class Batcher:
    """The step queue and the task that runs it (see the module's docstring).

    Each stream keeps its own waiting requests; ``ready`` lists the streams
    that have one and no step running, in the order they became so. A batch
    takes the first request of up to max_batch ready streams, so it never
    holds two steps of one stream, and each stream's steps run in order."""

    def __init__(self, model, max_batch, window_s, max_queue, open_streams):
        self.model, self.max_batch, self.window_s, self.max_queue = (
            model, max_batch, window_s, max_queue)
        self.open_streams = open_streams     # how many streams are open now
        self.x_dtype = input_dtype(model)
        self.ready = collections.deque()
        self.queued = 0                      # waiting requests, all streams together
        self.arrived = asyncio.Event()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="model-step")
        self.stats = {"steps": 0, "batches": 0, "largest_batch": 0}

    def submit(self, stream, x):
        """Queues one step of stream; the future gets (y row as floats, step index)."""
        if stream.closed:   # deleted while its request's body was read
            raise StreamClosed()
        if self.queued >= self.max_queue:
            raise HTTPException(503, f"the server is busy: {self.max_queue} steps are waiting")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        stream.pending.append((x, future, loop.time()))
        self.queued += 1
        if len(stream.pending) == 1 and not stream.busy:
            self.ready.append(stream)
            self.arrived.set()
        return future

    def close(self, stream):
        """Deletes stream: its waiting requests fail with StreamClosed."""
        stream.closed = True
        for _, future, _ in stream.pending:
            if not future.done():
                future.set_exception(StreamClosed())
        self.queued -= len(stream.pending)
        stream.pending.clear()

    async def run(self):
        loop = asyncio.get_running_loop()
        while True:
            while not self.ready:
                self.arrived.clear()
                await self.arrived.wait()
            first = self.ready[0].pending
            deadline = (first[0][2] if first else loop.time()) + self.window_s
            while (len(self.ready) < min(self.max_batch, self.open_streams())
                   and loop.time() < deadline):
                self.arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), deadline - loop.time())
            batch = self.take()
            if batch:
                await self.run_batch(batch)

    def take(self):
        """(stream, x, future) of the first waiting request of up to max_batch ready streams."""
        batch = []
        while self.ready and len(batch) < self.max_batch:
            stream = self.ready.popleft()
            while stream.pending and stream.pending[0][1].done():   # its client went away
                stream.pending.popleft()
                self.queued -= 1
            if stream.pending:   # a closed stream has none
                x, future, _ = stream.pending.popleft()
                self.queued -= 1
                stream.busy = True
                batch.append((stream, x, future))
        return batch

    def step_fn(self, x, state):
        """One model step over a batch; the state as a tuple in and out."""
        y, new = self.model.step(x, state if len(state) == 2 else state[0])
        return y, new if isinstance(new, tuple) else (new,)

    async def run_batch(self, batch):
        streams = [stream for stream, _, _ in batch]
        x = np.stack([x for _, x, _ in batch])
        state = tuple(np.concatenate(parts, axis=1) for parts in zip(*(s.state for s in streams)))
        loop = asyncio.get_running_loop()
        error = None
        try:
            y, new = await loop.run_in_executor(self.executor, self.step_fn, x, state)
            rows = y.astype(np.float64).tolist()   # exact for float32, bfloat16 and float64
        except Exception as e:   # not expected: the requests were checked
            error = e
        for b, (stream, _, future) in enumerate(batch):
            if error is None:
                stream.state = tuple(a[:, b:b + 1].copy() for a in new)
                stream.t += 1
            if not future.done():
                if error is None:
                    future.set_result((rows[b], stream.t - 1))
                else:
                    future.set_exception(error)
            stream.busy = False
            if stream.pending:
                self.ready.append(stream)
        if error is None:
            self.stats["steps"] += len(batch)
            self.stats["batches"] += 1
            self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))


async def read_json(request, limit):
    """The request's body parsed as JSON: 413 past limit bytes, 400 if it is not JSON."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise HTTPException(413, f"the body must be at most {limit} bytes, "
                                 f"Content-Length says {length}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"the body must be at most {limit} bytes")

    def no_constants(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(body, parse_constant=no_constants)
    except ValueError as e:   # json.JSONDecodeError and UnicodeDecodeError included
        raise HTTPException(400, f"the body is not valid JSON: {e}") from None


def parse_x(payload, size, dtype):
    """x of a step request as a (size,) array of dtype; 422 with the reason if it is not one."""
    if not isinstance(payload, dict) or "x" not in payload:
        raise HTTPException(422, 'the body must be a JSON object {"x": [numbers]}')
    x = payload["x"]
    if not isinstance(x, list) or len(x) != size:
        got = f"a list of {len(x)}" if isinstance(x, list) else f"a {type(x).__name__}"
        raise HTTPException(422, f"x must be a list of {size} numbers, got {got}")
    for i, v in enumerate(x):
        if type(v) not in (int, float):   # bool, str, None, lists are not numbers here
            raise HTTPException(422, f"x[{i}] must be a number, got {json.dumps(v)}")
    try:
        with np.errstate(over="ignore"):
            a = np.array(x, dtype)
    except OverflowError:   # an int past the float range
        raise HTTPException(422, f"x must hold finite {dtype} numbers, "
                                 f"an integer in x is too large") from None
    if not np.isfinite(a).all():
        raise HTTPException(422, f"x must hold finite {dtype} numbers, "
                                 f"x[{int(np.argmin(np.isfinite(a)))}] is not")
    return a


def create_app(model, batching=True, max_batch=256, window_ms=2.0, max_streams=1024,
               max_body=1 << 16, max_queue=4096):
    """The Starlette app serving ``model`` (a forward fastln.rnn model; see the module)."""
    check_streamable(model)
    for name, value, low in (("max_batch", max_batch, 1), ("max_streams", max_streams, 1),
                             ("max_body", max_body, 1), ("max_queue", max_queue, 1),
                             ("window_ms", window_ms, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not value >= low or not math.isfinite(value):
            raise ValueError(f"{name} must be at least {low}, got {value}")
    config = config_of(model)
    # one step on a zero state: the state's dtypes and shapes, and the engine warmed up
    _, zero = model.step(np.zeros((1, model.input_size), input_dtype(model)))
    zero = tuple(np.zeros_like(a) for a in (zero if isinstance(zero, tuple) else (zero,)))
    streams = {}
    batcher = None

    def stream_of(request):
        stream = streams.get(request.path_params["stream_id"])
        if stream is None:
            raise HTTPException(404, f"unknown stream {request.path_params['stream_id']!r}")
        return stream

    async def create(request):
        if len(streams) >= max_streams:
            raise HTTPException(429, f"too many streams: {max_streams} are open; "
                                     f"DELETE finished ones")
        stream_id = secrets.token_hex(8)
        streams[stream_id] = Stream(stream_id, zero)
        return JSONResponse({"stream": stream_id}, status_code=201)

    async def step(request):
        stream = stream_of(request)
        x = parse_x(await read_json(request, max_body), model.input_size, batcher.x_dtype)
        try:
            y, t = await batcher.submit(stream, x)
        except StreamClosed:
            raise HTTPException(404, f"stream {stream.id!r} was deleted") from None
        return JSONResponse({"y": y, "t": t})

    async def delete(request):
        stream = stream_of(request)
        del streams[stream.id]
        batcher.close(stream)
        return JSONResponse({"stream": stream.id, "steps": stream.t})

    async def health(request):
        return JSONResponse({
            "status": "ok", "model": config, "batching": batching,
            "max_batch": batcher.max_batch, "window_ms": window_ms if batching else 0.0,
            "streams": len(streams), "max_streams": max_streams, "max_body": max_body,
            "queued": batcher.queued, "threads": fastln.get_num_threads(),
            **batcher.stats})

    async def error(request, exc):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        nonlocal batcher
        batcher = Batcher(model, max_batch if batching else 1,
                          window_ms / 1000 if batching else 0.0, max_queue,
                          lambda: len(streams))
        task = asyncio.create_task(batcher.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            batcher.executor.shutdown()

    routes = [Route("/streams", create, methods=["POST"]),
              Route("/streams/{stream_id}/step", step, methods=["POST"]),
              Route("/streams/{stream_id}", delete, methods=["DELETE"]),
              Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: error})


def port_number(text):
    """A TCP port, 1 to 65535, or argparse's error."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {port}")
    return port


def make_parser():
    """The command line's parser; every option shows its default in --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="a model file: an .npz of examples/serve/model.py's "
                        "save_model or of a model's state_dict, or an .onnx file")
    source.add_argument("--onnx", help="an .onnx file with one LSTM, GRU or RNN node")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=port_number, default=8000, help="the TCP port to listen on")
    p.add_argument("--batching", choices=["on", "off"], default="on",
                   help="dynamic batching of the streams' steps")
    p.add_argument("--max-batch", type=int, default=256, help="requests per batch at most")
    p.add_argument("--window-ms", type=float, default=2.0,
                   help="how long the oldest waiting request waits for others")
    p.add_argument("--max-streams", type=int, default=1024, help="open streams at most")
    p.add_argument("--max-body", type=int, default=1 << 16, help="request body bytes at most")
    p.add_argument("--max-queue", type=int, default=4096, help="waiting steps at most")
    p.add_argument("--threads", type=int,
                   help="fastln's threads; None keeps fastln's own (all cores)")
    return p


def open_model(p, args):
    """The model of --model or --onnx, or argparse's error naming the option."""
    flag, path = ("--model", args.model) if args.model else ("--onnx", args.onnx)
    if not os.path.isfile(path):
        p.error(f"{flag} {path}: no such file")
    if flag == "--onnx" or path.lower().endswith(".onnx"):
        try:
            return freeze(fastln.rnn.from_onnx(path))
        except ImportError as e:
            p.error(f"{flag} {path}: reading ONNX needs the onnx package ({e})")
        except Exception as e:   # onnx's parser raises protobuf's DecodeError, among others
            p.error(f"{flag} {path}: not an ONNX model fastln.rnn.from_onnx reads "
                    f"({type(e).__name__}: {e})")
    try:
        return load_model(path)
    except (OSError, TypeError, ValueError) as e:
        p.error(f"{flag} {e}")


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)

    import uvicorn

    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be at least 1, got {args.threads}")
    if args.threads is not None:
        fastln.set_num_threads(args.threads)
    model = open_model(p, args)
    try:
        app = create_app(model, args.batching == "on", args.max_batch, args.window_ms,
                         args.max_streams, args.max_body, args.max_queue)
    except (TypeError, ValueError) as e:   # create_app names its arguments: give the options
        message = str(e)
        for name in ("max_batch", "window_ms", "max_streams", "max_body", "max_queue"):
            message = message.replace(name, "--" + name.replace("_", "-"))
        p.error(message)
    print(f"serving {json.dumps(config_of(model))} on http://{args.host}:{args.port} "
          f"(batching {args.batching})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
