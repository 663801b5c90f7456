"""The service: the streams a server holds, their table and batcher, and
what the WebSocket and the HTTP listeners share: adding and claiming
streams; the bookkeeping of a step, taken (submit) and answered (finish),
one for both WebSocket protocols and HTTP; one way for a stream to leave
(leave: an export or a delete); importing streams; draining and saving on a
restart; the health probes. A stream's connection holds it through an
:class:`Attachment`, whatever its protocol.

Each stream has a resume token, 192 random bits (``secrets``) made when the
stream opens, that its client must present to reconnect or to step it over
HTTP; it is compared in constant time (``hmac.compare_digest``). An export
and the state file carry it, so that a moved or restored stream keeps it.
"""
import asyncio
import hashlib
import hmac
import json
import os
import re
import secrets
import time

import numpy as np

import fastln
from fastln.rnn import OverloadedError, StreamBatcher, StreamTable, UnknownStreamError

from .errors import (
    CONFLICT,
    FORBIDDEN,
    GONE,
    INVALID,
    NOT_FOUND,
    POLICY,
    REASON_NAMES,
    RESTART,
    TRY_LATER,
    UNAUTHORIZED,
    Refused,
    check_stream_id,
)
from .model import check_streamable, config_of, input_dtype

TOKEN_BYTES = 24   # a resume token's random bytes: 192 bits, 32 URL-safe characters
# a token an import takes: URL-safe characters, as a reconnect's URL carries them
TOKEN = re.compile(r"[A-Za-z0-9_-]{1,256}")
MAX_T = 2 ** 63 - 1   # a step count, as the state file stores it (int64)


HASHED = "sha256:"   # the state file's token of a stream that knows only the token's hash


def _token_text(stream):
    """A stream's token as the state file stores it: the token, or HASHED and
    its hash's hex digits for a stream that knows only the hash."""
    return stream.token if stream.token is not None else HASHED + stream.token_hash.hex()


def _token_hash(payload):
    """The SHA-256 of an export's ``token_hash`` (64 hex digits), which
    stands for the token of a stream that knows only its hash; None when
    there is none."""
    text = payload.get("token_hash") if isinstance(payload, dict) else None
    if isinstance(text, str) and re.fullmatch(r"[0-9a-f]{64}", text):
        return bytes.fromhex(text)
    return None


def check_received(received, new=False):
    """A reconnect's count of the replies its client received of a stream
    (a multiplexed open entry's ``"received"``; the per-stream query's
    ``received=``, once its digits are read): an int from 0 to 2**63 - 1,
    else refused with 1008 (HTTP 422), and refused with new (a new stream
    has no replies to count)."""
    if type(received) is not int or not 0 <= received <= MAX_T:
        raise Refused(POLICY, 422, f"received must be the number of replies received, a whole "
                                   f"number from 0 to 2**63 - 1, got {repr(received)[:20]}")
    if new:
        raise Refused(POLICY, 422, "received goes with a reconnect, not with a new stream")
    return received


def _bad_state(message):
    """The refusal of an import whose body is not a state export() wrote."""
    return Refused(INVALID, 422, message, "bad_state")


class Stream:
    """What the server keeps of one stream besides its state in the table:
    the steps answered, the steps taken and not yet answered, its resume
    token (or, for a stream taken over from a checkpoint store, only its
    hash until a client presents it), the Attachment of the connection that
    holds it, when it was last used, and its checkpoints."""

    __slots__ = ("id", "t", "inflight", "token", "conn", "seen", "leaving", "ends", "base",
                 "saved", "owned", "moved", "snap", "_hash")

    def __init__(self, stream_id, token, t=0, token_hash=None, saved=None):
        self.id, self.token, self.t, self.inflight = stream_id, token, t, 0
        self.conn = None        # the Attachment of the connection that holds it, if any
        self.seen = time.monotonic()
        self.leaving = False    # being exported or ended: it takes no more steps
        self.ends = False       # ended by its client: removed once its steps are answered
        self.base = t           # t when the table took it: the table counts its steps from here
        self.saved = saved      # t of its latest checkpoint in the store; None before one
        self.owned = False      # a checkpoint of this server's holds it (a shared store's owner)
        self.moved = False      # it left for another server: the store is that server's
        # (t, state arrays) of its latest checkpoint told to a greeted connection: what a
        # reconnect that lost replies rewinds it to (fastln.serve.checkpoint)
        self.snap = None
        self._hash = token_hash

    @property
    def durable(self):
        """The durable step a greeting tells the client (None before a
        checkpoint): its latest checkpoint's, or that of the copy kept for a
        rewind when that is older, since the client keeps its steps from the
        step it is told, and a rewind to the copy must find them kept."""
        return self.saved if self.snap is None else min(self.saved, self.snap[0])

    @property
    def token_hash(self):
        """The SHA-256 of the resume token, as a checkpoint stores it."""
        if self._hash is None:
            self._hash = hashlib.sha256(self.token.encode()).digest()
        return self._hash

    def token_is(self, token):
        """Whether token (any str) is this stream's resume token, compared in
        constant time; a stream that knows only the token's hash learns the
        token from the first client that presents it."""
        got = token.encode("utf-8", "surrogatepass")
        if self.token is not None:
            return hmac.compare_digest(got, self.token.encode())
        if not hmac.compare_digest(hashlib.sha256(got).digest(), self._hash):
            return False
        self.token = token
        return True


class Attachment:
    """A stream held by a connection (``Stream.conn``): the connection, the
    stream's index on it (0 on a connection of one stream), and whether the
    connection has greeted the stream (Service.greet). Through it the
    service tells the connection that the stream leaves the server or that
    the server restarts (close).

    The connection (fastln.serve.ws) has ``close(code, message, reason=None)``,
    which closes it, and ``gone(attachment, message)``, which lets go of the
    one stream that leaves."""

    __slots__ = ("conn", "index", "greeted")

    def __init__(self, conn, index=0):
        self.conn, self.index, self.greeted = conn, index, False

    def close(self, code, message):
        """A 4410 (the stream leaves: an export, a delete) lets go of this
        stream alone; any other code (1012, a restart) closes the connection."""
        if code == GONE:
            self.conn.gone(self, message)
        else:
            self.conn.close(code, message)


class Service:
    """The streams, the table, the batcher, and what the two listeners share."""

    def __init__(self, model, capacity=1024, max_batch=256, max_delay=0.0,
                 max_queue_per_stream=64, echo=False, max_connections=4096,
                 max_streams_per_connection=1024, max_frame=1 << 16):
        check_streamable(model)
        self.model, self.echo = model, echo
        self.config = config_of(model)
        self.table = StreamTable(model, capacity)
        self.batcher = StreamBatcher(self.table, max_batch=max_batch, max_delay=max_delay,
                                     max_queue_per_stream=max_queue_per_stream,
                                     max_pending=capacity * max_queue_per_stream)
        self.streams = {}
        self.max_connections, self.connections = max_connections, 0   # WebSocket connections
        # a multiplexed connection's limits (fastln.serve.ws.mux): streams attached, frame bytes
        self.max_streams_per_connection, self.max_frame = max_streams_per_connection, max_frame
        # refusals by reason (errors.REASON_NAMES) and streams the server ended by reason
        self.rejections = dict.fromkeys(REASON_NAMES, 0)
        self.evictions = {"idle_timeout": 0}
        self.steps = 0
        self.draining = False
        self.inflight = 0                # steps taken and not yet answered, all streams
        self.tasks = set()               # of spawn
        self.checkpointer = None         # fastln.serve.checkpoint's, with a checkpoint store
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
        self.state_shape = (model.num_layers, 1, model.hidden_size)   # each state array's
        # one step now: a model's first step compiles its step (and packs the weights it
        # keeps packed) before a client's first step waits on it
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

    def add(self, stream_id=None, state=None, t=0, token=None, token_hash=None, saved=None):
        """A new stream: a zero state, or the given one (a list of the table's
        state arrays) after t steps; a random id of 16 hex digits when None,
        and a new resume token when token and token_hash are None (a stream
        taken over from a checkpoint knows only token_hash, and saved, the t
        of that checkpoint)."""
        generated = False
        if stream_id is not None:
            check_stream_id(stream_id)
        while stream_id is None or (generated and stream_id in self.streams):
            stream_id, generated = secrets.token_hex(8), True
        if stream_id in self.streams:
            raise Refused(CONFLICT, 409, f"stream {stream_id!r} exists")
        if self.draining:
            raise Refused(RESTART, 503, "the server restarts", "draining")
        if len(self.table) >= self.table.capacity:
            raise Refused(TRY_LATER, 429, f"the server holds {self.table.capacity} streams, "
                                          f"its --capacity", "table_full")
        sid = self.table.open(stream_id) if state is None else self._import(state, stream_id)
        if token is None and token_hash is None:
            token = secrets.token_urlsafe(TOKEN_BYTES)
        stream = self.streams[sid] = Stream(sid, token, t, token_hash, saved)
        if self.checkpointer is not None:
            self.checkpointer.added(sid)
        return stream

    def _import(self, state, stream_id):
        """Opens stream_id in the table with state (a list of the table's state arrays)."""
        return self.table.import_state(state[0] if len(state) == 1 else tuple(state), stream_id)

    def restore(self, stream, state, t):
        """Sets stream's state in the table to state (a list of the table's
        state arrays) and its step count to t; none of its steps may be in
        flight. The table has no setter: the stream is closed there and
        imported again under its id."""
        self.table.close(stream.id)
        self._import(state, stream.id)
        stream.t = stream.base = t

    def greet(self, stream, attachment, received=None):
        """A connection greets stream, which it holds through attachment, once
        the steps of the stream's earlier connections are answered (the
        hello, an opened entry): received, the replies its client says it
        received of them (a reconnect's), may rewind the stream to its last
        checkpoint (Checkpointer.rewind); the t that the greeting tells is
        final then. From then on the stream's checkpoints may be kept for a
        rewind. Nothing when the connection no longer holds the stream."""
        if stream.conn is not attachment:
            return
        if received is not None and self.checkpointer is not None:
            self.checkpointer.rewind(stream, received)
        attachment.greeted = True

    def get(self, stream_id):
        """The stream stream_id; Refused with 4404 (HTTP 404) when this server
        holds no such stream, or it is leaving."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.leaving:
            raise Refused(NOT_FOUND, 404, f"no stream {stream_id!r} here")
        return stream

    def claim(self, stream_id, token):
        """The stream stream_id for a client that presents token: Refused
        with 4401 (HTTP 401) when token is None, 4403 (403) when it is not
        the stream's (any string: one that is not UTF-8, a lone surrogate
        of a JSON escape, is simply not the token), 4404 when there is no
        such stream."""
        stream = self.get(stream_id)
        if token is None:
            raise Refused(UNAUTHORIZED, 401, f"stream {stream_id!r} needs its resume token "
                                             f"(token=, from the hello that opened it)")
        if not stream.token_is(token):
            raise Refused(FORBIDDEN, 403, f"the token given is not the resume token of "
                                          f"stream {stream_id!r}")
        return stream

    def submit(self, streams, x, callback, ids=None):
        """Queues one step of each of streams (a tuple or list): with ids None,
        the one stream's x (StreamBatcher.submit); else the rows x of a
        multiplexed frame, ids the streams' ids (submit_block). The batcher
        calls callback(y, error) once they are answered, and the callback
        calls finish(). Refused with 1013 (HTTP 503) when the batcher is full,
        4404 (404) for a stream the table no longer holds; False while the
        server drains: no step is taken."""
        if self.draining:
            return False
        if self.checkpointer is not None and self.checkpointer.lapsed():
            raise Refused(TRY_LATER, 503, "the server's lease on its streams lapsed (it was "
                                          "paused): it is renewing it; reconnect", "lease_lapsed")
        try:
            if ids is None:
                self.batcher.submit(streams[0].id, x, callback)
            else:
                self.batcher.submit_block(ids, x, callback)
        except OverloadedError as e:
            raise Refused(TRY_LATER, 503, str(e), "queue_full") from None
        except UnknownStreamError as e:
            raise Refused(NOT_FOUND, 404, str(e)) from None
        for stream in streams:
            stream.inflight += 1
        self.inflight += len(streams)
        return True

    def finish(self, streams, error, settle=True):
        """Counts the answered step of each of streams (failed ones when error
        is not None). With settle, each of them is marked as used now, and
        one that its client ended while the step ran is removed once its
        last step is answered; a multiplexed connection passes settle=False
        while none of its streams has left it with steps in flight."""
        self.inflight -= len(streams)
        if error is None:
            self.steps += len(streams)
            for stream in streams:
                stream.inflight -= 1
                stream.t += 1
        else:
            for stream in streams:
                stream.inflight -= 1
        if settle:
            now = time.monotonic()
            for stream in streams:
                stream.seen = now
                if stream.ends and not stream.inflight and self.streams.get(stream.id) is stream:
                    self.remove(stream)

    def end(self, stream):
        """Ends stream on its client's word (a close with 1000): it takes no
        more steps and is removed once those it took are answered; a
        stream that is leaving already (an export, a delete) is left to that."""
        if stream.leaving:
            return
        stream.leaving = stream.ends = True
        if not stream.inflight:
            self.remove(stream)

    def remove(self, stream):
        """Forgets stream and closes it in the table (and, unless it moved to
        another server, in the checkpoint store)."""
        self.streams.pop(stream.id, None)
        if self.checkpointer is not None:
            self.checkpointer.forget(stream)
        if stream.id in self.table:
            self.table.close(stream.id)

    @staticmethod
    async def quiet(stream):
        """Waits until none of stream's (or, given the service, any stream's)
        steps is in flight: a batch takes milliseconds, so a poll serves."""
        while stream.inflight:
            await asyncio.sleep(0.001)

    def when_quiet(self, streams, then):
        """Calls then() once none of streams has a step in flight: at once
        when none has, else from a task (quiet). A connection that takes
        streams over greets them so, once the steps their connection before
        took are answered, so that the t it tells them is final."""
        busy = [stream for stream in streams if stream.inflight]
        if not busy:
            then()
            return

        async def wait():
            for stream in busy:
                await self.quiet(stream)
            then()
        self.spawn(wait())

    def spawn(self, coro):
        """Runs coro in a task that the service holds until it ends (a task
        that the loop alone holds may be collected)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def leave(self, stream_id, message, moved=False):
        """Takes stream stream_id off this server: it takes no more steps,
        those it took are answered, its connection is told (4410, message),
        and it is removed (moved: it goes on in another server, which
        becomes its owner in a shared checkpoint store); returns the stream
        and its state."""
        stream = self.get(stream_id)
        stream.leaving, stream.moved = True, moved   # its frames from now on are not taken
        await self.quiet(stream)            # the steps it took are answered first
        if stream.conn is not None:
            stream.conn.close(GONE, message)
        state = self.table.export_state(stream.id)
        self.remove(stream)
        if moved and self.checkpointer is not None:
            await self.checkpointer.release(stream.id)
        return stream, state

    async def delete(self, stream_id):
        """Ends the stream stream_id (leave); returns it."""
        stream, _ = await self.leave(stream_id, "the stream was deleted")
        return stream

    async def export(self, stream_id):
        """The stream's state and step count as JSON-ready values; the stream
        leaves this server (leave)."""
        stream, state = await self.leave(stream_id, "the stream was exported to another server",
                                         moved=True)
        # a stream taken over from a checkpoint and not yet reconnected knows its token's hash
        secret = ({"token": stream.token} if stream.token is not None
                  else {"token_hash": stream.token_hash.hex()})
        return {"stream": stream.id, "t": stream.t, **secret,
                "dtype": self.y_dtype_name, "fingerprint": self.fingerprint,
                "state": [a.astype(np.float64).tolist() for a in self._parts(state)]}

    def import_(self, stream_id, payload):
        """Adds the stream that export() gave as payload."""
        token_hash = _token_hash(payload)
        if not isinstance(payload, dict) or not isinstance(payload.get("state"), list) or (
                type(payload.get("t")) is not int or not 0 <= payload["t"] <= MAX_T) or not (
                isinstance(payload.get("token"), str) and TOKEN.fullmatch(payload["token"])
                or token_hash is not None):
            raise _bad_state('the body must be export\'s JSON: {"t": steps (0 to 2**63 - 1), '
                             '"token": the resume token (1 to 256 letters, digits, \'_\' or '
                             '\'-\'), "state": [arrays], ...}')
        if payload.get("fingerprint", self.fingerprint) != self.fingerprint:
            raise _bad_state("the state comes from another model (the fingerprints differ)")
        parts = payload["state"]
        shape = (self.model.num_layers, 1, self.model.hidden_size)
        if len(parts) != len(self.state_dtypes):
            raise _bad_state(f"state must hold {len(self.state_dtypes)} arrays, "
                             f"got {len(parts)}")
        try:   # numbers only: NumPy would read strings of digits too
            arrays = [np.asarray(p) for p in parts]
        except (TypeError, ValueError, OverflowError):   # ragged
            arrays = None
        if arrays is None or any(a.dtype.kind not in "iuf" for a in arrays):
            raise _bad_state("state must hold arrays of numbers")
        if any(a.shape != shape for a in arrays):
            raise _bad_state(f"each state array must have shape {shape}, got "
                             f"{[a.shape for a in arrays]}")
        arrays = [a.astype(np.float64) for a in arrays]
        if not all(np.isfinite(a).all() for a in arrays):
            raise _bad_state("state must hold finite numbers")
        state = [a.astype(d) for a, d in zip(arrays, self.state_dtypes)]
        if any(not np.array_equal(s.astype(np.float64), a) for s, a in zip(state, arrays)):
            raise _bad_state(f"the state's values are not exact {self.y_dtype_name} values")
        if token_hash is not None:
            return self.add(stream_id, state, payload["t"], token_hash=token_hash)
        return self.add(stream_id, state, payload["t"], payload["token"])

    # ---- restarts -----------------------------------------------------------

    async def drain(self):
        """Stops taking steps, waits for those taken, and closes every connection."""
        self.draining = True
        await self.quiet(self)
        for stream in self.streams.values():
            if stream.conn is not None:
                stream.conn.close(RESTART, "the server restarts: reconnect and resume")

    def save(self, path):
        """Writes every stream's state, step count and resume token to path (a
        new file, readable by its owner only, renamed over the old one)."""
        ids = list(self.streams)
        arrays = {"fingerprint": np.array(self.fingerprint), "ids": np.array(json.dumps(ids)),
                  "tokens": np.array(json.dumps([_token_text(self.streams[s]) for s in ids])),
                  "t": np.array([self.streams[s].t for s in ids], np.int64)}
        states = [self._parts(self.table.export_state(s)) for s in ids]
        for k, dtype in enumerate(self.state_dtypes):
            shape = (self.model.num_layers, 0, self.model.hidden_size)
            a = np.concatenate([st[k] for st in states], axis=1) if ids else np.empty(shape, dtype)
            arrays[f"state{k}"] = a.view(np.uint16) if dtype.name == "bfloat16" else a
        tmp = f"{path}.tmp{os.getpid()}"
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
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
            ids, ts, tokens = json.loads(str(f["ids"])), f["t"], json.loads(str(f["tokens"]))
            parts = [f[f"state{k}"] for k in range(len(self.state_dtypes))]
        parts = [p.view(d) for p, d in zip(parts, self.state_dtypes)]
        for i, (sid, t, token) in enumerate(zip(ids, ts.tolist(), tokens)):
            known = not token.startswith(HASHED)
            self.add(sid, [p[:, i:i + 1] for p in parts], t, token if known else None,
                     None if known else bytes.fromhex(token[len(HASHED):]))
        return len(ids)

    def sweep(self, idle_timeout):
        """Ends the streams that no connection has held for idle_timeout seconds."""
        now = time.monotonic()
        for stream in [s for s in self.streams.values()
                       if s.conn is None and not s.inflight and now - s.seen > idle_timeout]:
            self.remove(stream)
            self.evictions["idle_timeout"] += 1

    def refused(self, reason):
        """Counts a refusal under reason (errors.REASON_NAMES)."""
        self.rejections[reason] += 1

    def readiness(self):
        """(ready, why not): ready to take new streams when the model is
        loaded (it is, once the service exists), the server is not draining,
        and the table has room."""
        why = []
        if self.draining:
            why.append("draining")
        if len(self.table) >= self.table.capacity:
            why.append(f"full: {len(self.table)} streams, --capacity {self.table.capacity}")
        return not why, why

    def health(self, ws_port, port):
        """The JSON of GET /health: the model, the settings and the counters."""
        out = {"status": "draining" if self.draining else "ok", "model": self.config,
               "echo": self.echo, "streams": len(self.streams),
               "capacity": self.table.capacity, "port": port, "ws_port": ws_port,
               "threads": fastln.get_num_threads(), "steps": self.steps,
               "cpu_seconds": time.process_time(), "batcher": self.batcher.metrics()}
        if self.checkpointer is not None:
            out["store"] = self.checkpointer.health()
        return out


# ---- the health probes ------------------------------------------------------
# both listeners answer them (fastln.serve.ws.routes, fastln.serve.http): the
# (status, JSON reply) of (service, ports), ports (ws_port, port)

def health(service, ports):
    """The model, the settings and the counters (Service.health)."""
    return 200, service.health(*ports)


def live(service, ports):
    """Liveness: the event loop answers."""
    return 200, {"live": True}


def ready(service, ports):
    """Readiness (Service.readiness): 503 while the server drains or its table
    is full; with a checkpoint store, its state (Checkpointer.health), which
    a store outage does not make unready: the streams go on from memory."""
    ok, why = service.readiness()
    reply = {"ready": True} if ok else {"ready": False, "why": why}
    if service.checkpointer is not None:
        reply["store"] = service.checkpointer.health()
    return (200 if ok else 503), reply


PROBES = {"/health": health, "/health/live": live, "/health/ready": ready}
