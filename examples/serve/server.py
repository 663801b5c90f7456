"""Serves one fastln.rnn model to many streams: binary WebSocket frames, one
connection per stream, over a StreamTable and a StreamBatcher; JSON over HTTP
for curl, health checks and moving streams between servers.

Run (with fastln importable: installed, or PYTHONPATH=. in a checkout built in place)::

    python examples/serve/model.py model.npz              # a new LN-LSTM, I=128, H=256
    python examples/serve/server.py --model model.npz [--port 8000] [--ws-port 8001]
        [--state-file streams.npz] [--capacity 1024] [--threads 1]

--model takes a file of model.py's save_model (float32, float64, bfloat16 or
int8), an .npz of a forward LNLSTM, LNGRU or LSTM's bare state_dict (float or
int8), or an .onnx file with one LSTM, GRU or RNN node.

WebSocket, on --ws-port: ``ws://HOST:WS_PORT/ws/STREAM_ID[?new=1][&dtype=bfloat16]``.
STREAM_ID is 1 to 64 characters of letters, digits, '_', '.' and '-', chosen by
the client (so that a proxy can route by it). ``new=1`` opens the stream with a
zero state; without it the stream must exist (a reconnect, after a restart or
a move). The server's first frame is a text frame of JSON::

    {"stream": id, "t": steps run, "input_size": I, "hidden_size": H,
     "x_dtype": "float32", "y_dtype": "float32"}

Then each binary frame of the client holds one step's x: I little-endian
values of x_dtype (``dtype=``: float32, the default, or bfloat16 for a bfloat16
model; float64 for a float64 model). The server answers each with one binary
frame of y: H values of y_dtype, the model's dtype (bfloat16 as its 16-bit
patterns; float32 for an int8 model of fastln.rnn.quantize, whose x, y and
state are float32), in the order the frames came. A client may send several
frames before their replies come, up to --max-queue-per-stream waiting. A
close from the client with code 1000 ends the stream; any other end of the
connection keeps it for a reconnect, until --idle-timeout. A peer that answers
no ping for 2 x --ping seconds is disconnected.

The server closes a connection with a code and a message that says why:

    1003  a text frame after the hello       1012  the server restarts: reconnect
    1007  x of the wrong length, or not finite      without new=1 and resume at t
    1008  a bad stream id or query           1013  the table is full, or too many
    1009  a frame over --max-frame bytes           frames of the stream wait
    4404  no such stream                     4409  the stream exists (new=1), or
    4410  the stream was exported                  another connection holds it

GET /health on the WebSocket port answers as the HTTP one does, and GET
/owner/STREAM_ID with this server's addresses (``--advertise``): asked
through a proxy that routes by the stream id, it names the stream's owner.

HTTP, on --port (JSON bodies)::

    GET    /health                 the model, the settings, counters, cpu_seconds
    GET    /streams                -> {"streams": {id: steps run}}
    POST   /streams                {"stream": id} optional -> 201 {"stream": id}
    POST   /streams/{id}/step      {"x": [I numbers]} -> {"y": [H numbers], "t": step index}
    DELETE /streams/{id}           -> {"stream": id, "steps": t}
    POST   /streams/{id}/export    -> {"stream", "t", "dtype", "state"}; the stream
                                   leaves this server (its WebSocket closes with 4410)
    PUT    /streams/{id}/state     export's JSON -> 201: the stream continues here

Restarts lose nothing: on SIGTERM or SIGINT the server stops taking frames,
lets every step it took finish and answers it, closes every WebSocket with
1012, writes every stream's state and step count to --state-file (a new file,
then renamed over the old one) and exits; on start it loads that file, so a
client that reconnects continues bit for bit where it stopped.

Every step runs through one StreamBatcher: the frames that one pass of the
event loop reads are queued with ``submit`` and answered in its callbacks
(no future or task per frame), and each batch is one ``StreamTable.step`` in
a worker thread.
--echo answers each frame at once with zero bytes of y's size and runs no
model: the transport's own cost, for comparison.
"""
import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import signal
import sys
import time
from urllib.parse import parse_qs

import numpy as np
import uvicorn
from picows import (
    WSCloseCode,
    WSListener,
    WSMsgType,
    WSUpgradeResponse,
    WSUpgradeResponseWithListener,
    ws_create_server,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.routing import Route

import fastln
from fastln.rnn import OverloadedError, StreamBatcher, StreamTable, UnknownStreamError

if __package__:
    from .client import run
    from .model import HelpFormatter, check_streamable, config_of, freeze, input_dtype, load_model
else:   # run as a script: this directory is sys.path[0]
    from client import run
    from model import HelpFormatter, check_streamable, config_of, freeze, input_dtype, load_model

STREAM_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# WebSocket close codes (RFC 6455 section 7.4, and 4000-4999 for this application)
UNSUPPORTED, INVALID, POLICY = 1003, 1007, 1008   # 1009: picows, past --max-frame
INTERNAL, RESTART, TRY_LATER = 1011, 1012, 1013
NOT_FOUND, CONFLICT, GONE = 4404, 4409, 4410
CLOSE_WAIT = 5.0   # seconds a client has to answer the server's close frame


class Refused(Exception):
    """A request the server refuses: a WebSocket close code (or HTTP status) and why."""

    def __init__(self, code, status, message):
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


class Stream:
    """What the server keeps of one stream besides its state in the table:
    the steps answered, the steps taken and not yet answered, the
    connection that holds it, and when it was last used."""

    __slots__ = ("id", "t", "inflight", "conn", "seen", "leaving", "ends")

    def __init__(self, stream_id, t=0):
        self.id, self.t, self.inflight = stream_id, t, 0
        self.conn = None        # the Connection attached, if any
        self.seen = time.monotonic()
        self.leaving = False    # being exported or ended: it takes no more steps
        self.ends = False       # ended by its client: removed once its steps are answered


class Service:
    """The streams, the table, the batcher, and what the two listeners share."""

    def __init__(self, model, capacity=1024, max_batch=256, max_delay=0.0,
                 max_queue_per_stream=64, echo=False):
        check_streamable(model)
        self.model, self.echo = model, echo
        self.config = config_of(model)
        self.table = StreamTable(model, capacity)
        self.batcher = StreamBatcher(self.table, max_batch=max_batch, max_delay=max_delay,
                                     max_queue_per_stream=max_queue_per_stream,
                                     max_pending=capacity * max_queue_per_stream)
        self.streams = {}
        self.steps = 0
        self.draining = False
        self.inflight = 0                # steps taken and not yet answered, all streams
        self.x_dtypes = {"float32": np.dtype(np.float32)}
        y_dtype = np.dtype(model.dtype)   # float32 for an int8 model, as are its x and state
        if y_dtype.name == "bfloat16":
            self.x_dtypes["bfloat16"] = y_dtype
        elif y_dtype.name == "float64":
            self.x_dtypes = {"float64": y_dtype}
        # y as bytes: bfloat16 goes out as its 16-bit patterns
        self.y_view = np.uint16 if y_dtype.name == "bfloat16" else y_dtype
        self.y_dtype_name = y_dtype.name
        self.y_bytes = model.hidden_size * y_dtype.itemsize
        self.zeros = bytes(self.y_bytes)       # --echo's reply
        probe = self.table.open()
        self.state_dtypes = [a.dtype for a in self._parts(self.table.export_state(probe))]
        # one step now: the engine packs its weights before a client's first step waits on it
        self.table.step([probe], np.zeros((1, model.input_size), input_dtype(model)))
        self.table.close(probe)
        digest = hashlib.sha256(json.dumps(self.config, sort_keys=True).encode())
        for key in sorted(model.params):
            digest.update(np.ascontiguousarray(model.params[key]).view(np.uint8).data)
        self.fingerprint = digest.hexdigest()

    @staticmethod
    def _parts(state):
        return state if isinstance(state, tuple) else (state,)

    # ---- streams ------------------------------------------------------------

    def add(self, stream_id=None, state=None, t=0):
        """A new stream: a zero state, or the given one (a list of the table's
        state arrays) after t steps; a random id of 16 hex digits when None."""
        generated = False
        while stream_id is None or (generated and stream_id in self.streams):
            stream_id, generated = secrets.token_hex(8), True
        if stream_id in self.streams:
            raise Refused(CONFLICT, 409, f"stream {stream_id!r} exists")
        if self.draining:
            raise Refused(RESTART, 503, "the server restarts")
        if len(self.table) >= self.table.capacity:
            raise Refused(TRY_LATER, 429, f"the server holds {self.table.capacity} streams, "
                                          f"its --capacity")
        if state is None:
            sid = self.table.open(stream_id)
        else:
            sid = self.table.import_state(state[0] if len(state) == 1 else tuple(state),
                                          stream_id)
        stream = self.streams[sid] = Stream(sid, t)
        return stream

    def get(self, stream_id):
        stream = self.streams.get(stream_id)
        if stream is None or stream.leaving:
            raise Refused(NOT_FOUND, 404, f"no stream {stream_id!r} here")
        return stream

    def submit(self, stream, x, callback):
        """Queues one step of stream; the batcher calls callback(y, error) once
        it is answered (see StreamBatcher.submit), and the callback calls
        finish(). False while the server drains: the step is not taken."""
        if self.draining:
            return False
        try:
            self.batcher.submit(stream.id, x, callback)
        except OverloadedError as e:
            raise Refused(TRY_LATER, 503, str(e)) from None
        except UnknownStreamError:
            raise Refused(NOT_FOUND, 404, f"no stream {stream.id!r} here") from None
        stream.inflight += 1
        self.inflight += 1
        return True

    def finish(self, stream, error):
        """Counts an answered step (a failed one when error is not None);
        returns the step's index."""
        stream.inflight -= 1
        self.inflight -= 1
        stream.seen = time.monotonic()
        if error is not None:
            return stream.t
        stream.t += 1
        self.steps += 1
        return stream.t - 1

    def remove(self, stream):
        self.streams.pop(stream.id, None)
        if stream.id in self.table:
            self.table.close(stream.id)

    @staticmethod
    async def quiet(stream):
        """Waits until none of stream's (or, given the service, any stream's)
        steps is in flight: a batch takes milliseconds, so a poll serves."""
        while stream.inflight:
            await asyncio.sleep(0.001)

    async def export(self, stream_id):
        """The stream's state and step count as JSON-ready values; the stream
        leaves this server."""
        stream = self.get(stream_id)
        stream.leaving = True               # its frames from now on are not taken
        await self.quiet(stream)            # the steps it took are answered first
        if stream.conn is not None:
            stream.conn.close(GONE, "the stream was exported to another server")
        state = self.table.export_state(stream.id)
        self.remove(stream)
        return {"stream": stream.id, "t": stream.t, "dtype": self.y_dtype_name,
                "fingerprint": self.fingerprint,
                "state": [a.astype(np.float64).tolist() for a in self._parts(state)]}

    def import_(self, stream_id, payload):
        """Adds the stream that export() gave as payload."""
        if not isinstance(payload, dict) or not isinstance(payload.get("state"), list) or (
                type(payload.get("t")) is not int or payload["t"] < 0):
            raise Refused(INVALID, 422, 'the body must be export\'s JSON: {"t": steps, '
                                        '"state": [arrays], ...}')
        if payload.get("fingerprint", self.fingerprint) != self.fingerprint:
            raise Refused(INVALID, 422, "the state comes from another model (the "
                                        "fingerprints differ)")
        parts = payload["state"]
        shape = (self.model.num_layers, 1, self.model.hidden_size)
        if len(parts) != len(self.state_dtypes):
            raise Refused(INVALID, 422, f"state must hold {len(self.state_dtypes)} arrays, "
                                        f"got {len(parts)}")
        try:
            arrays = [np.array(p, np.float64) for p in parts]
        except (TypeError, ValueError):
            raise Refused(INVALID, 422, "state must hold arrays of numbers") from None
        if any(a.shape != shape for a in arrays):
            raise Refused(INVALID, 422, f"each state array must have shape {shape}, got "
                                        f"{[a.shape for a in arrays]}")
        state = [a.astype(d) for a, d in zip(arrays, self.state_dtypes)]
        if any(not np.array_equal(s.astype(np.float64), a) for s, a in zip(state, arrays)):
            raise Refused(INVALID, 422, f"the state's values are not exact {self.y_dtype_name} "
                                        f"values")
        return self.add(stream_id, state, payload["t"])

    # ---- restarts -----------------------------------------------------------

    async def drain(self):
        """Stops taking steps, waits for those taken, and closes every connection."""
        self.draining = True
        await self.quiet(self)
        for stream in self.streams.values():
            if stream.conn is not None:
                stream.conn.close(RESTART, "the server restarts: reconnect and resume")

    def save(self, path):
        """Writes every stream's state and step count to path (a new file,
        renamed over the old one)."""
        ids = list(self.streams)
        arrays = {"fingerprint": np.array(self.fingerprint), "ids": np.array(json.dumps(ids)),
                  "t": np.array([self.streams[s].t for s in ids], np.int64)}
        states = [self._parts(self.table.export_state(s)) for s in ids]
        for k, dtype in enumerate(self.state_dtypes):
            shape = (self.model.num_layers, 0, self.model.hidden_size)
            a = np.concatenate([st[k] for st in states], axis=1) if ids else np.empty(shape, dtype)
            arrays[f"state{k}"] = a.view(np.uint16) if dtype.name == "bfloat16" else a
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return len(ids)

    def load(self, path):
        """Adds the streams that save() wrote to path; ValueError for a file of another model."""
        with np.load(path, allow_pickle=False) as f:
            if str(f["fingerprint"]) != self.fingerprint:
                raise ValueError(f"{path} holds the streams of another model (the "
                                 f"fingerprints differ)")
            ids, ts = json.loads(str(f["ids"])), f["t"]
            parts = [f[f"state{k}"] for k in range(len(self.state_dtypes))]
        parts = [p.view(d) for p, d in zip(parts, self.state_dtypes)]
        for i, (sid, t) in enumerate(zip(ids, ts.tolist())):
            self.add(sid, [p[:, i:i + 1] for p in parts], t)
        return len(ids)

    def sweep(self, idle_timeout):
        """Ends the streams that no connection has held for idle_timeout seconds."""
        now = time.monotonic()
        for stream in [s for s in self.streams.values()
                       if s.conn is None and not s.inflight and now - s.seen > idle_timeout]:
            self.remove(stream)

    def health(self, ws_port, port):
        return {"status": "draining" if self.draining else "ok", "model": self.config,
                "echo": self.echo, "streams": len(self.streams),
                "capacity": self.table.capacity, "port": port, "ws_port": ws_port,
                "threads": fastln.get_num_threads(), "steps": self.steps,
                "cpu_seconds": time.process_time(), "batcher": self.batcher.metrics()}


# ---------------------------------------------------------------- WebSocket

class Connection(WSListener):
    """One WebSocket connection and the stream it holds (see the module's docstring)."""

    def __init__(self, service, stream_id, new=False, x_dtype=np.float32, refusal=None):
        super().__init__()
        self.service, self.stream_id, self.new = service, stream_id, new
        self.x_dtype = np.dtype(x_dtype)
        self.x_bytes = service.model.input_size * self.x_dtype.itemsize
        self.dot_checks = self.x_dtype.name in ("float32", "float64")
        self.refusal = refusal     # a bad query, told once the connection is up
        self.transport = self.stream = None
        self.closed = False
        self.hello_due = False
        self.answer = self._answer

    def on_ws_connected(self, transport):
        self.transport = transport
        svc = self.service
        try:
            if self.refusal is not None:
                raise self.refusal
            stream = svc.add(self.stream_id) if self.new else svc.get(self.stream_id)
            if stream.conn is not None:
                raise Refused(CONFLICT, 409, f"another connection holds stream {stream.id!r}")
        except Refused as e:
            self.close(e.code, e.message)
            return
        stream.conn, self.stream = self, stream
        if stream.inflight:        # steps of an earlier connection still run: t is not final
            self.hello_due = True
        else:
            self.hello()

    def hello(self):
        svc = self.service
        self.hello_due = False
        self.transport.send(WSMsgType.TEXT, json.dumps({
            "stream": self.stream.id, "t": self.stream.t,
            "input_size": svc.model.input_size, "hidden_size": svc.model.hidden_size,
            "x_dtype": self.x_dtype.name, "y_dtype": svc.y_dtype_name}).encode())

    def on_ws_frame(self, transport, frame):
        kind = frame.msg_type
        if kind != WSMsgType.BINARY or not frame.fin:
            if kind == WSMsgType.CLOSE:
                if self.closed:            # the client's answer to the server's close
                    transport.disconnect()
                else:
                    self.client_closed(frame.get_close_code())
            elif kind == WSMsgType.TEXT:
                self.close(UNSUPPORTED, "frames after the hello must be binary (x)")
            elif kind in (WSMsgType.BINARY, WSMsgType.CONTINUATION):
                self.close(UNSUPPORTED, "x must come in one frame, not fragments")
            return
        stream = self.stream
        if stream is None or self.closed or stream.leaving:
            return
        payload = frame.get_payload_as_bytes()
        if len(payload) != self.x_bytes:
            n, size = len(payload), self.service.model.input_size
            other = {2 * size: "bfloat16", 4 * size: "float32"}.get(n)
            hint = (f": the size of {other} x, which needs ?dtype={other}"
                    if other in self.service.x_dtypes else "")
            self.close(INVALID, f"x must be {self.x_bytes} bytes ({self.service.model.input_size} "
                                f"{self.x_dtype.name} values), got {n}{hint}")
            return
        svc = self.service
        if svc.echo:
            svc.steps += 1
            transport.send(WSMsgType.BINARY, svc.zeros)
            return
        x = np.frombuffer(payload, self.x_dtype)
        # x.x is finite when every value is (and none is huge): one dot product,
        # cheaper than isfinite's array; the exact check decides otherwise
        if not (self.dot_checks and math.isfinite(x.dot(x))) and not np.isfinite(x).all():
            self.close(INVALID, f"x[{int(np.argmin(np.isfinite(x)))}] is not finite")
            return
        try:
            svc.submit(stream, x, self.answer)
        except Refused as e:
            self.close(e.code, e.message)

    def _answer(self, y, error):
        svc, stream = self.service, self.stream
        svc.finish(stream, error)
        if not self.closed:
            if error is None:
                self.transport.send(WSMsgType.BINARY, y.view(svc.y_view))
            else:
                self.close(INTERNAL, f"the step failed: {error}")
        if not stream.inflight:
            if stream.conn is not None and stream.conn.hello_due:
                stream.conn.hello()
            elif stream.ends and stream.id in svc.streams:
                svc.remove(stream)         # ended by its client while steps ran

    def client_closed(self, code):
        """The client's close: code 1000 ends the stream (once its steps are answered)."""
        stream = self.stream
        if code == WSCloseCode.OK and stream is not None and stream.conn is self:
            stream.leaving = stream.ends = True
            if not stream.inflight:
                self.service.remove(stream)
        self.closed = True
        self.transport.send_close(WSCloseCode.OK)
        self.transport.disconnect()

    def close(self, code, message):
        if self.closed:
            return
        self.closed = True
        # a close frame holds at most 123 bytes of reason
        reason = message.encode()[:123].decode("utf-8", "ignore").encode()
        self.transport.send_close(code, reason)
        # the TCP connection closes when the client answers (RFC 6455, 7.1.1):
        # closing it now would reset it if the client is still sending, and the
        # reset can discard the close frame before the client reads it
        asyncio.get_running_loop().call_later(CLOSE_WAIT, self.transport.disconnect)
        self.detach()              # a reconnect need not wait for that answer

    def on_ws_disconnected(self, transport):
        self.closed = True
        self.detach()

    def detach(self):
        """Lets go of the stream, which waits for its next connection."""
        stream = self.stream
        if stream is not None and stream.conn is self:
            stream.conn = None
            stream.seen = time.monotonic()


def ws_factory(service, ports, address):
    """picows's listener factory: routes /ws/ID to a Connection, and answers
    GET /health and GET /owner/ID (this server's addresses: through a proxy
    that routes by the stream id, those of the server that owns ID)."""
    def factory(request):
        path, _, query = request.path.decode("latin-1").partition("?")
        if path == "/health":
            body = json.dumps(service.health(*ports)).encode()
            return WSUpgradeResponseWithListener(WSUpgradeResponse.create_ok_response(
                body, {"Content-Type": "application/json"}), None)
        if path.startswith("/owner/"):
            body = json.dumps({"http": f"http://{address}:{ports[1]}",
                               "ws": f"ws://{address}:{ports[0]}"}).encode()
            return WSUpgradeResponseWithListener(WSUpgradeResponse.create_ok_response(
                body, {"Content-Type": "application/json"}), None)
        if not path.startswith("/ws/"):
            return None            # 404
        stream_id, q = path[4:], parse_qs(query)
        refusal = None
        if not STREAM_ID.fullmatch(stream_id):
            got = f"{len(stream_id)} characters" if len(stream_id) > 20 else repr(stream_id)
            refusal = Refused(POLICY, 400, f"a stream id is 1 to 64 letters, digits, '_', '.' "
                                           f"or '-', got {got}")
        dtype = q.get("dtype", [next(iter(service.x_dtypes))])[-1]
        if dtype not in service.x_dtypes:
            refusal = Refused(POLICY, 400, f"dtype must be one of {', '.join(service.x_dtypes)}, "
                                           f"got {dtype[:20]!r}")
        new = q.get("new", ["0"])[-1]
        if new not in ("0", "1"):
            refusal = Refused(POLICY, 400, f"new must be 0 or 1, got {new[:20]!r}")
        return Connection(service, stream_id, new == "1",
                          service.x_dtypes.get(dtype, np.float32), refusal)
    return factory


# ---------------------------------------------------------------- HTTP

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
        return json.loads(body, parse_constant=no_constants) if body else None
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


def create_app(service, ports, max_body=1 << 16):
    """The Starlette app of the JSON endpoints (see the module's docstring)."""
    x_dtype = input_dtype(service.model)

    def refused(e):
        return JSONResponse({"error": e.message}, status_code=e.status)

    async def health(request):
        return JSONResponse(service.health(*ports))

    async def listing(request):
        return JSONResponse({"streams": {sid: s.t for sid, s in service.streams.items()
                                         if not s.leaving}})

    async def create(request):
        payload = await read_json(request, max_body)
        stream_id = None
        if payload is not None:
            stream_id = payload.get("stream") if isinstance(payload, dict) else None
            if not isinstance(stream_id, str) or not STREAM_ID.fullmatch(stream_id):
                raise HTTPException(422, 'the body must be {"stream": id}, an id of 1 to 64 '
                                         "letters, digits, '_', '.' or '-', or empty")
        try:
            stream = service.add(stream_id)
        except Refused as e:
            return refused(e)
        return JSONResponse({"stream": stream.id}, status_code=201)

    async def step(request):
        x = parse_x(await read_json(request, max_body), service.model.input_size, x_dtype)
        try:
            stream = service.get(request.path_params["stream_id"])
            if service.echo:
                raise Refused(UNSUPPORTED, 409, "an --echo server runs no model")
            answered = asyncio.get_running_loop().create_future()

            def answer(y, error):
                t = service.finish(stream, error)
                if not answered.done():    # its request may have been cancelled
                    answered.set_result((y, t, error))
            if not service.submit(stream, x, answer):
                raise Refused(RESTART, 503, "the server restarts")
        except Refused as e:
            return refused(e)
        y, t, error = await answered
        if error is not None:
            return JSONResponse({"error": f"the step failed: {error}"}, 500)
        return JSONResponse({"y": y.astype(np.float64).tolist(), "t": t})

    async def delete(request):
        try:
            stream = service.get(request.path_params["stream_id"])
        except Refused as e:
            return refused(e)
        stream.leaving = True
        await service.quiet(stream)
        if stream.conn is not None:
            stream.conn.close(GONE, "the stream was deleted")
        service.remove(stream)
        return JSONResponse({"stream": stream.id, "steps": stream.t})

    async def export(request):
        try:
            return JSONResponse(await service.export(request.path_params["stream_id"]))
        except Refused as e:
            return refused(e)

    async def put_state(request):
        payload = await read_json(request, max(max_body, 64 * service.y_bytes
                                               * service.model.num_layers + 4096))
        try:
            stream = service.import_(request.path_params["stream_id"], payload)
        except Refused as e:
            return refused(e)
        return JSONResponse({"stream": stream.id, "t": stream.t}, status_code=201)

    async def error(request, exc):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code,
                            headers=exc.headers)

    routes = [Route("/health", health, methods=["GET"]),
              Route("/streams", listing, methods=["GET"]),
              Route("/streams", create, methods=["POST"]),
              Route("/streams/{stream_id}/step", step, methods=["POST"]),
              Route("/streams/{stream_id}", delete, methods=["DELETE"]),
              Route("/streams/{stream_id}/export", export, methods=["POST"]),
              Route("/streams/{stream_id}/state", put_state, methods=["PUT"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: error})


# ---------------------------------------------------------------- the process

def port_number(text):
    """A TCP port, 0 (any free one) to 65535, or argparse's error."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, got {port}")
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
    p.add_argument("--advertise",
                   help="the address GET /owner/ID names; None names --host")
    p.add_argument("--port", type=port_number, default=8000,
                   help="the HTTP (JSON) port; 0 picks a free one")
    p.add_argument("--ws-port", type=port_number, default=8001,
                   help="the WebSocket port; 0 picks a free one")
    p.add_argument("--capacity", type=int, default=1024, help="streams held at most")
    p.add_argument("--max-batch", type=int, default=256, help="steps per batch at most")
    p.add_argument("--max-delay-ms", type=float, default=0.0,
                   help="how long the oldest waiting step waits for others to join its batch")
    p.add_argument("--max-queue-per-stream", type=int, default=64,
                   help="frames of one stream waiting at most")
    p.add_argument("--max-frame", type=int, default=1 << 16,
                   help="bytes of one WebSocket frame at most")
    p.add_argument("--max-body", type=int, default=1 << 16, help="HTTP request body bytes at most")
    p.add_argument("--idle-timeout", type=float, default=600.0,
                   help="seconds a stream with no connection is kept")
    p.add_argument("--ping", type=float, default=20.0,
                   help="seconds of silence before a ping, and for its answer; a peer that "
                        "does not answer is disconnected and its stream kept")
    p.add_argument("--state-file",
                   help="where SIGTERM writes the streams, and where a start reads them")
    p.add_argument("--threads", type=int, default=1,
                   help="fastln's threads (the event loop and the batch thread need a core too)")
    p.add_argument("--echo", action="store_true",
                   help="answer each frame with zero bytes at once, running no model")
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


class HTTPServer(uvicorn.Server):
    """uvicorn's server, leaving SIGTERM and SIGINT to the service."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def serve(args, service):
    loop = asyncio.get_running_loop()
    ports = [args.ws_port, args.port]
    # pings find a peer that vanished without closing, so that its stream can be resumed
    ws = await ws_create_server(ws_factory(service, ports, args.advertise or args.host),
                                args.host, args.ws_port, max_frame_size=args.max_frame,
                                enable_auto_ping=True, auto_ping_idle_timeout=args.ping,
                                auto_ping_reply_timeout=args.ping)
    ports[0] = ws.sockets[0].getsockname()[1]
    http = HTTPServer(uvicorn.Config(create_app(service, ports, args.max_body), host=args.host,
                                     port=args.port, log_level="warning", lifespan="off"))
    http_task = loop.create_task(http.serve())
    while not http.started:
        if http_task.done():
            http_task.result()
            raise SystemExit(f"the HTTP server on port {args.port} did not start")
        await asyncio.sleep(0.01)
    ports[1] = http.servers[0].sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving {json.dumps(service.config)}{' (echo)' if service.echo else ''} on "
          f"http://{args.host}:{ports[1]} and ws://{args.host}:{ports[0]}/ws/", flush=True)
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), min(args.idle_timeout / 4, 5.0))
        service.sweep(args.idle_timeout)
    await service.drain()
    ws.close()
    if args.state_file:
        n = service.save(args.state_file)
        print(f"saved {n} streams to {args.state_file}", flush=True)
    http.should_exit = True
    await http_task
    await service.batcher.aclose()


def main(argv=None):
    p = make_parser()
    args = p.parse_args(argv)
    for name in ("capacity", "max_batch", "max_queue_per_stream", "max_frame", "max_body",
                 "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not (args.max_delay_ms >= 0 and math.isfinite(args.max_delay_ms)):
        p.error(f"--max-delay-ms must be finite and at least 0, got {args.max_delay_ms}")
    for name in ("idle_timeout", "ping"):
        if not (getattr(args, name) > 0 and math.isfinite(getattr(args, name))):
            p.error(f"--{name.replace('_', '-')} must be finite and above 0, "
                    f"got {getattr(args, name)}")
    fastln.set_num_threads(args.threads)
    model = open_model(p, args)
    service = Service(model, args.capacity, args.max_batch, args.max_delay_ms / 1000,
                      args.max_queue_per_stream, args.echo)
    if args.state_file and os.path.exists(args.state_file):
        try:
            n = service.load(args.state_file)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--state-file {args.state_file}: {e}")
        print(f"loaded {n} streams from {args.state_file}", flush=True)
    run(serve(args, service))


if __name__ == "__main__":
    sys.exit(main())
