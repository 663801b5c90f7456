"""What fastln-serve answers to input it refuses, tried with raw bytes on
both WebSocket protocols and the HTTP API:

1. No input gets a 500 or a 1011. Malformed Unicode (lone UTF-16 surrogates
   as JSON escapes, %-escapes and bytes that are not UTF-8, a NUL, a
   non-character) and values of other types, in every string and field a
   client sends: stream ids (in URLs, JSON and paths), resume tokens, the
   JSON bodies' fields, the admin bearer token, /mux control messages, query
   strings, text and close frames, headers. Each case gets the refusal of
   its table row (status or close code) with a message of clean Unicode,
   and the server logs no traceback and goes on.
2. Stream ids are not secrets (the serving guide says so): without its
   token, a stream answers that it exists (4401, 4403, 4409) where another
   id answers 4404, and nothing else: no refusal names its token or its
   step count.
3. The serving guide's table of refusals: each row, provoked on a server
   (the restart rows on one that drains: a step it holds keeps it
   draining), moves its reason in ``fastln_serve_rejections_total`` by one
   and no other reason; every row of the table is tried, and every
   provocation below is a row of it.
"""
import base64
import functools
import json
import os
import re
import signal
import socket
import struct
import threading
import time
import urllib.request
from urllib.parse import quote

import pytest

from fastln.rnn import LNLSTM

from _util import require

for _name in ("picows", "starlette", "uvicorn", "prometheus_client"):
    require(_name)

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fastln.serve.client import run_server  # noqa: E402
from fastln.serve.frames import encode  # noqa: E402
from fastln.serve.model import save_model  # noqa: E402

I, H = 8, 16
ADMIN = "refusals-admin-token-0123456789"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X = [0.5] * I
TEXT, BINARY, CLOSE = 1, 2, 8


# ---------------------------------------------------------------- raw clients

def _address(url):
    host, port = url.split("//")[1].rsplit(":", 1)
    return host, int(port)


def clean(text):
    """text, which must be Unicode that encodes (no lone surrogate)."""
    assert isinstance(text, str) and text, text
    text.encode("utf-8")
    return text


class RawWS:
    """A WebSocket client of raw bytes on a blocking socket: any target and
    header in the upgrade request, any frame, masked or not."""

    def __init__(self, url, target, headers=()):
        self.sock = socket.create_connection(_address(url), timeout=20)
        key = base64.b64encode(os.urandom(16))
        lines = [b"GET " + _bytes(target) + b" HTTP/1.1", b"Host: localhost",
                 b"Upgrade: websocket", b"Connection: Upgrade", b"Sec-WebSocket-Key: " + key,
                 b"Sec-WebSocket-Version: 13", *(_bytes(k) + b": " + _bytes(v)
                                                 for k, v in headers)]
        self.sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            data = self.sock.recv(65536)
            assert data, f"no answer to the upgrade of {target!r}"
            self.buffer += data
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        self.status = int(head.split()[1])
        self.closed = None

    def send(self, opcode, payload=b"", fin=True, mask=True):
        n = len(payload)
        first = (0x80 if fin else 0) | opcode
        bit = 0x80 if mask else 0
        if n < 126:
            head = struct.pack("!BB", first, bit | n)
        elif n < 65536:
            head = struct.pack("!BBH", first, bit | 126, n)
        else:
            head = struct.pack("!BBQ", first, bit | 127, n)
        if mask:
            key = os.urandom(4)
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
            head += key
        self.sock.sendall(head + payload)

    def send_json(self, message):
        self.send(TEXT, json.dumps(message).encode())

    def frame(self):
        """(opcode, payload) of the server's next frame, None at the end."""
        while True:
            n, at = (self.buffer[1] & 0x7F, 2) if len(self.buffer) >= 2 else (0, 2 ** 64)
            if n == 126:
                n, at = int.from_bytes(self.buffer[2:4], "big"), 4
            elif n == 127:
                n, at = int.from_bytes(self.buffer[2:10], "big"), 10
            if len(self.buffer) >= at + n:
                opcode, payload = self.buffer[0] & 0xF, self.buffer[at:at + n]
                self.buffer = self.buffer[at + n:]
                return opcode, payload
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                data = b""
            if not data:
                return None
            self.buffer += data

    def text(self):
        """The server's next frame, a text frame of JSON, parsed."""
        opcode, payload = self.frame()
        assert opcode == TEXT, (opcode, payload[:200])
        return json.loads(payload.decode("utf-8"))   # strict: clean UTF-8

    def close_of(self):
        """(code, message) of the server's close, answered; frames before it
        are skipped. Returns once the server has ended the TCP connection,
        so that it has let go of what the connection held."""
        while True:
            f = self.frame()
            assert f is not None, "the connection ended without a close frame"
            if f[0] == CLOSE:
                code = struct.unpack("!H", f[1][:2])[0]
                self.closed = (code, f[1][2:].decode("utf-8"))    # strict: clean UTF-8
                self.send(CLOSE, f[1][:2])
                while self.frame() is not None:
                    pass
                self.sock.close()
                return self.closed

    def end(self, code=None):
        """Closes with code (1000 ends the streams, 1001 keeps them) and waits
        for the answer, or (None) closes the socket only."""
        if code is not None:
            self.send(CLOSE, struct.pack("!H", code))
            while (f := self.frame()) is not None and f[0] != CLOSE:
                pass
        self.sock.close()


def _bytes(v):
    return v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")


def http(base, method, target, body=None, headers=(), token=None):
    """(status, headers, body bytes) of one HTTP request of raw bytes:
    target and header values as given (str as UTF-8), body JSON-ready
    values (json.dumps: lone surrogates as escapes) or bytes."""
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(
        body).encode()
    headers = list(headers)
    if token is not None:
        headers.append(("Authorization", f"Bearer {token}"))
    lines = [_bytes(method) + b" " + _bytes(target) + b" HTTP/1.1", b"Host: localhost",
             b"Connection: close", b"Content-Type: application/json",
             b"Content-Length: %d" % len(data), *(_bytes(k) + b": " + _bytes(v)
                                                   for k, v in headers)]
    with socket.create_connection(_address(base), timeout=60) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, content = reply.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, content


def error_of(status, content):
    """The message of a refusal, whose answer must be a 4xx status (or 503,
    try later) and JSON {"error": message} in clean Unicode."""
    assert 400 <= status < 500 or status == 503, (status, content[:300])
    return clean(json.loads(content.decode("utf-8"))["error"])


def refusal(base, method, target, body=None, headers=(), token=None):
    """(status, message) of a refused request (error_of)."""
    status, _, content = http(base, method, target, body, headers, token)
    return status, error_of(status, content)


def metrics(server):
    """{(name, frozenset of labels): value} of the server's /metrics."""
    with urllib.request.urlopen(server.http + "/metrics", timeout=20) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def gauge(server, name):
    return metrics(server)[f"fastln_serve_{name}", frozenset()]


def rejections(server):
    return {dict(labels)["reason"]: v for (name, labels), v in metrics(server).items()
            if name == "fastln_serve_rejections_total"}


def until(check, what, timeout=20.0):
    """Polls check() until it is true."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def hello(url, target):
    """A RawWS whose hello came, and the hello."""
    ws = RawWS(url, target)
    assert ws.status == 101, (target, ws.status)
    return ws, ws.text()


def ws_close(url, target, *frames, headers=()):
    """(code, message) of the close that ends a connection to target, after
    frames (opcode, payload[, mask]) sent once it is upgraded."""
    ws = RawWS(url, target, headers)
    assert ws.status == 101, (target, ws.status)
    for opcode, payload, *mask in frames:
        ws.send(opcode, payload, mask=mask[0] if mask else True)
    code, message = ws.close_of()
    return code, message


def mux_answer(ws, message):
    """The answer to one /mux control message."""
    ws.send(TEXT, message if isinstance(message, bytes) else json.dumps(message).encode())
    return ws.text()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("refusals") / "m.npz"
    save_model(path, LNLSTM(I, H, seed=5))
    return str(path)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("admin") / "token"
    path.write_text(ADMIN + "\n")
    return str(path)


# ---------------------------------------------------------------- 1. malformed input

# strings where a string is due: lone surrogates (sent as JSON escapes, or
# UTF-8 of them as %-escapes in URLs and bytes in headers), a reversed pair, a
# NUL, a non-character, an emoji, a right-to-left override, long ones, none
STRINGS = ["\ud800", "\udfff", "\udc00\ud800", "a\x00b", "\uffff", "\U0001f600", "\u202eabc",
           "\u00e9" * 40, "x" * 5000, ""]
# values of other types where a string or a number is due
VALUES = [0, -1, 1.5, 10 ** 400, True, [], {}, ["\ud800"], {"\ud800": 1}]
# byte strings that are not UTF-8: a stray byte, an overlong '/', a surrogate, past U+10FFFF
BYTES = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]


def _quoted(s):
    return quote(s.encode("utf-8", "surrogatepass"), safe="")


def _number(v):
    """Whether v is a finite JSON number, which a field of numbers takes."""
    return type(v) in (int, float) and abs(v) < 1e30


def http_cases(token):
    """(what, method, target, body, headers, status) of the HTTP API."""
    step = "/streams/s/step"
    state = {"t": 1, "token": "t" * 32, "state": [[[[0.0] * H]]] * 2}
    good_x = ", ".join(["0.5"] * (I - 1)).encode()
    cases = []
    for v in STRINGS + VALUES:
        cases += [(f"create stream={v!r:.30}", "POST", "/streams", {"stream": v}, (), 422),
                  (f"step x={v!r:.30}", "POST", step, {"x": v, "token": token}, (), 422),
                  (f"step token={v!r:.30}", "POST", step, {"x": X, "token": v}, (),
                   403 if isinstance(v, str) else 422),
                  (f"put token={v!r:.30}", "PUT", "/streams/k/state", {**state, "token": v},
                   (), 422),
                  (f"put state={v!r:.30}", "PUT", "/streams/k/state", {**state, "state": v},
                   (), 422),
                  (f"put state[0]={v!r:.30}", "PUT", "/streams/k/state",
                   {**state, "state": [v, state["state"][1]]}, (), 422),
                  (f"put fingerprint={v!r:.30}", "PUT", "/streams/k/state",
                   {**state, "fingerprint": v}, (), 422)]
        if not _number(v):
            cases += [(f"step x[3]={v!r:.30}", "POST", step,
                       {"x": X[:3] + [v] + X[4:], "token": token}, (), 422),
                      (f"put t={v!r:.30}", "PUT", "/streams/k/state", {**state, "t": v}, (),
                       422)]
    for s in filter(None, STRINGS):
        q = _quoted(s)
        cases += [(f"step path {s!r:.30}", "POST", f"/streams/{q}/step", {"x": X, "token": token},
                   (), 404),
                  (f"delete path {s!r:.30}", "DELETE", f"/streams/{q}", None, (), 404),
                  (f"export path {s!r:.30}", "POST", f"/streams/{q}/export", None, (), 404),
                  (f"put path {s!r:.30}", "PUT", f"/streams/{q}/state", state, (), 422),
                  (f"query {s!r:.30}", "GET", f"/health/live?stream={q}", None, (), 200)]
    for s in STRINGS:
        if "\x00" not in s:     # a NUL in a header is not HTTP (test_the_http_parser_...)
            cases += [(f"admin Bearer {s!r:.30}", "GET", "/streams", None,
                       [("Authorization", f"Bearer {s}")], 403 if s.strip() else 401),
                      (f"admin no scheme {s!r:.30}", "GET", "/streams", None,
                       [("Authorization", s)], 401)]
    for b in BYTES:
        # json.loads reads UTF-8 of a surrogate in a string as the surrogate: a bad id
        cases += [(f"create body {b!r}", "POST", "/streams", b'{"stream": "' + b + b'"}', (),
                   422 if b == b"\xed\xa0\x80" else 400),
                  (f"step body {b!r}", "POST", step, b'{"x": [' + b + b'], "token": "t"}', (),
                   400),
                  (f"admin Bearer {b!r}", "GET", "/streams", None,
                   [("Authorization", b"Bearer " + b)], 403),
                  (f"a header {b!r}", "POST", "/streams/s/step", {"x": X, "token": "t"},
                   [("X-Note", b), ("Accept-Language", b)], 403)]
    cases += [("deep arrays", "POST", "/streams", b"[" * 60000, (), 400),
              ("deep objects", "POST", "/streams", b'{"a":' * 12000, (), 400),
              ("a number of 5000 digits", "POST", step, b'{"x": [' + b"7" * 5000 + b"]}", (),
               400),
              ("a number past the float range", "POST", step,
               b'{"x": [1e400, ' + good_x + b'], "token": "' + token.encode() + b'"}', (), 422),
              ("NaN", "POST", step, b'{"x": [NaN], "token": "t"}', (), 400),
              ("a body past --max-body", "POST", "/streams", b" " * 70000, (), 413),
              ("not an object", "POST", "/streams", ["\ud800"], (), 422),
              ("a state of strings", "PUT", "/streams/k/state",
               {**state, "state": [[[["0.5"] * H]]] * 2}, (), 422),
              ("a state not finite", "PUT", "/streams/k/state",
               json.dumps(state).replace("0.0", "1e400", 1).encode(), (), 422),
              ("a step count past int64", "PUT", "/streams/k/state", {**state, "t": 2 ** 63},
               (), 422),
              ("a token not URL-safe", "PUT", "/streams/k/state", {**state, "token": "a b&c"},
               (), 422),
              ("no such path", "GET", "/%ED%A0%80", None, (), 404),
              ("no such method", "PATCH", "/streams", None, (), 405)]
    return cases


def ws_cases(token):
    """(what, target, frames, headers, close code) of the per-stream WebSocket."""
    cases = []
    for s in STRINGS:
        q = _quoted(s)
        cases += [(f"id {s!r:.30}", f"/ws/{q}?new=1", (), (), 1008),
                  (f"token {s!r:.30}", f"/ws/s?token={q}", (), (), 4403 if s else 4401)]
        if s:                     # a blank value is none: the default
            cases += [(f"dtype {s!r:.30}", f"/ws/s?token={token}&dtype={q}", (), (), 1008),
                      (f"new {s!r:.30}", f"/ws/s?token={token}&new={q}", (), (), 1008)]
    for b in BYTES:
        cases += [(f"raw id {b!r}", b"/ws/" + b + b"?new=1", (), (), 1008),
                  (f"raw token {b!r}", b"/ws/s?token=" + b, (), (), 4403),
                  (f"text frame {b!r}", f"/ws/s?token={token}", [(TEXT, b)], (), 1003),
                  (f"close reason {b!r}", f"/ws/s?token={token}",
                   [(CLOSE, struct.pack("!H", 1001) + b)], (), 1007),
                  (f"header {b!r}", f"/ws/s?token={token}", [(TEXT, b"{}")],
                   [("Origin", b), ("Sec-WebSocket-Protocol", b), ("User-Agent", b)], 1003)]
    cases += [("a close frame of one byte", f"/ws/s?token={token}", [(CLOSE, b"\x03")], (),
               1002),
              ("a close code not allowed", f"/ws/s?token={token}",
               [(CLOSE, struct.pack("!H", 1005))], (), 1002),
              ("an unmasked frame", f"/ws/s?token={token}", [(BINARY, b"\0" * 4 * I, False)],
               (), 1002),
              ("an unknown opcode", f"/ws/s?token={token}", [(3, b"x")], (), 1002)]
    return cases


def mux_entry_cases(token):
    """(what, open entry, code of its refusal) of /mux opens."""
    cases = []
    for v in STRINGS + VALUES + [None]:
        cases.append((f"stream {v!r:.30}", {"stream": v, "new": True}, 1008))
        if type(v) is not bool:
            cases.append((f"new {v!r:.30}", {"stream": "n", "new": v}, 1008))
        if not isinstance(v, str) and v is not None:
            cases.append((f"token {v!r:.30}", {"stream": "s", "token": v}, 1008))
    cases += [(f"token {s!r:.30}", {"stream": "s", "token": s}, 4403) for s in STRINGS]
    cases += [(f"entry {v!r:.30}", v, 1008) for v in STRINGS + VALUES]
    return cases


def mux_close_cases():
    """(what, query, text frame, close code) of /mux connections a frame closes."""
    cases = []
    for v in STRINGS + VALUES:
        cases += [(f"close [{v!r:.30}]", "", json.dumps({"close": [v]}).encode(), 1008),
                  (f"detach [{v!r:.30}]", "", json.dumps({"detach": [v]}).encode(), 1008),
                  (f"verb {v!r:.30}", "", json.dumps({str(v): []}).encode(), 1008)]
        if not isinstance(v, list):      # a list's entries are refused one by one (above)
            cases.append((f"open {v!r:.30}", "", json.dumps({"open": v}).encode(), 1008))
    for s in filter(None, STRINGS):
        cases.append((f"dtype {s!r:.30}", f"?dtype={_quoted(s)}", None, 1008))
    for b in BYTES:
        cases.append((f"text {b!r}", "", b'{"open": ' + b + b"}", 1008))
    cases += [("deep JSON", "", b"[" * 30000, 1008), ("not JSON", "", b"{", 1008)]
    return cases


def test_no_input_gets_a_500_or_a_1011(model_file, token_file):
    with run_server("--model", model_file, "--admin-token-file", token_file) as server:
        status, _, content = http(server.http, "POST", "/streams", {"stream": "s"})
        assert status == 201, content
        token = json.loads(content)["token"]
        got = {}
        for what, method, target, body, headers, want in http_cases(token):
            status, _, content = http(server.http, method, target, body, headers,
                                      None if headers else ADMIN)
            if status < 300:
                json.loads(content.decode("utf-8"))
            else:
                error_of(status, content)
            got["http " + what] = (status, want)
        for what, target, frames, headers, want in ws_cases(token):
            got["ws " + what] = (ws_close(server.ws, target, *frames, headers=headers)[0], want)
        ws, _ = hello(server.ws, "/mux")
        for what, entry, want in mux_entry_cases(token):
            (answer,) = mux_answer(ws, {"open": [entry]})["opened"]
            clean(answer["error"])
            sid = entry.get("stream") if isinstance(entry, dict) else None
            assert answer["stream"] == (sid if sid in ("s", "n") else None), (what, answer)
            got["mux open " + what] = (answer["code"], want)
        ws.end(1000)
        for what, query, text, want in mux_close_cases():
            frames = [] if text is None else [(TEXT, text)]
            got["mux " + what] = (ws_close(server.ws, f"/mux{query}", *frames)[0], want)
        # the stream is as it was: its first step is answered at t = 0
        status, _, content = http(server.http, "POST", "/streams/s/step",
                                  {"x": X, "token": token})
        assert status == 200 and json.loads(content)["t"] == 0, content
        assert server.health()["status"] == "ok"
        log = server.output()
    wrong = {what: pair for what, pair in got.items() if pair[0] != pair[1]}
    assert not wrong, wrong
    assert not any(code in (500, 1011) for code, _ in got.values())
    assert len(got) > 400
    for sign in ("Traceback", "exception from WSListener", "Exception in ASGI"):
        assert sign not in log, log[-3000:]


def test_the_http_parser_refuses_what_is_not_http(model_file):
    """Bytes that are not HTTP/1.1 (a Content-Length not a number, bytes
    that are not ASCII in the target, a NUL in a header) get the parser's
    400 before the application sees them, and count nowhere (the guide
    says so)."""
    with run_server("--model", model_file) as server:
        before = rejections(server)
        for raw in (b"POST /streams HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                    b"POST /streams HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",
                    b"POST /streams/\xff/step HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
                    b"GET /health?\xff HTTP/1.1\r\n\r\n",
                    b"GET /health HTTP/1.1\r\nX-Note: a\x00b\r\n\r\n"):
            with socket.create_connection(_address(server.http), timeout=20) as sock:
                sock.sendall(raw.replace(b"\r\n\r\n", b"\r\nHost: x\r\nConnection: close\r\n\r\n",
                                         1))
                reply = b""
                while chunk := sock.recv(65536):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 400 "), (raw, reply[:200])
        assert rejections(server) == before
        assert "Traceback" not in server.output()


# ---------------------------------------------------------------- 2. ids are not secrets

def test_without_its_token_a_stream_tells_only_that_it_exists(model_file):
    with run_server("--model", model_file) as server:
        status, _, content = http(server.http, "POST", "/streams", {"stream": "known"})
        token = json.loads(content)["token"]
        for _ in range(3):
            assert http(server.http, "POST", "/streams/known/step",
                        {"x": X, "token": token})[0] == 200
        answers = {
            "ws no token": ws_close(server.ws, "/ws/known"),
            "ws wrong token": ws_close(server.ws, "/ws/known?token=" + "A" * 32),
            "ws new": ws_close(server.ws, "/ws/known?new=1"),
            "ws absent": ws_close(server.ws, "/ws/absent?token=" + "A" * 32),
            "ws absent, no token": ws_close(server.ws, "/ws/absent"),
            "http no token": refusal(server.http, "POST", "/streams/known/step", {"x": X}),
            "http wrong token": refusal(server.http, "POST", "/streams/known/step",
                                        {"x": X, "token": "A" * 32}),
            "http new": refusal(server.http, "POST", "/streams", {"stream": "known"}),
            "http absent": refusal(server.http, "POST", "/streams/absent/step",
                                   {"x": X, "token": "A" * 32})}
        ws, _ = hello(server.ws, "/mux")
        for entry in ({"stream": "known"}, {"stream": "known", "token": "A" * 32},
                      {"stream": "known", "new": True}, {"stream": "absent", "token": "x"}):
            (e,) = mux_answer(ws, {"open": [entry]})["opened"]
            answers[f"mux {entry}"] = (e["code"], e["error"])
        ws.end(1000)
        status, _, content = http(server.http, "POST", "/streams/known/step",
                                  {"x": X, "token": token})
    assert [code for code, _ in answers.values()] == [
        4401, 4403, 4409, 4404, 4404, 401, 403, 409, 404, 4401, 4403, 4409, 4404]
    for what, (_, message) in answers.items():
        assert token not in message and token[:8] not in message, (what, message)
        assert not re.search(r"\b3\b", message), (what, message)   # the step count
    assert json.loads(content)["t"] == 3          # nothing above touched the stream


def test_the_guide_says_ids_are_not_secrets():
    with open(os.path.join(ROOT, "docs", "serving.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert "Stream ids are not secrets; tokens are." in text
    assert "4404 (404) where no stream has the id and 4401 or 4403 (401, 403)" in text


# ---------------------------------------------------------------- 3. the table of refusals

def guide_rows():
    """{(where, answer, reason): what} of the serving guide's table of refusals."""
    with open(os.path.join(ROOT, "docs", "serving.md"), encoding="utf-8") as f:
        text = f.read()
    table = text[text.index("| where | answer | refused when | reason |"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        where, answer, what, reason = (c.strip().strip("`") for c in line.strip("|").split("|"))
        assert (where, answer, reason) not in rows, line
        rows[where, answer, reason] = what
    return rows


class Ctx:
    """A server the provocations share: its URLs, a stream r and its token,
    and a stream idle that steps only to release a step of r held in the
    batcher (on a server of --max-batch 2 and a long --max-delay-ms, a lone
    step waits while another stream does not step)."""

    def __init__(self, server):
        self.server, self.http, self.ws = server, server.http, server.ws
        self.token = self.new("r")
        self.idle_token = self.new("idle")

    def new(self, sid):
        status, _, content = http(self.http, "POST", "/streams", {"stream": sid})
        assert status == 201, content
        return json.loads(content)["token"]

    def delete(self, *sids):
        for sid in sids:
            assert http(self.http, "DELETE", f"/streams/{sid}", token=ADMIN)[0] == 200, sid

    def step(self, sid, token):
        status, _, content = http(self.http, "POST", f"/streams/{sid}/step",
                                  {"x": X, "token": token})
        assert status == 200, content

    def release(self):
        """Steps idle, so that the step of r held in the batcher runs with
        it, and waits until every step is answered."""
        self.step("idle", self.idle_token)
        until(lambda: gauge(self.server, "steps_in_flight") == 0, "the held steps")


def held(ctx, n=1):
    until(lambda: gauge(ctx.server, "steps_in_flight") == n, f"{n} steps held")


def p_unmasked(c):
    assert ws_close(c.ws, "/mux", (BINARY, b"\0" * 48, False))[0] == 1002


def p_close_one_byte(c):
    assert ws_close(c.ws, f"/ws/r?token={c.token}", (CLOSE, b"\x03"))[0] == 1002


def p_text(c):
    assert ws_close(c.ws, f"/ws/r?token={c.token}", (TEXT, b"{}"))[0] == 1003


def p_mux_fragment(c):
    ws, _ = hello(c.ws, "/mux")
    ws.send(BINARY, bytes(8), fin=False)
    assert ws.close_of()[0] == 1003


def p_short(c):
    assert ws_close(c.ws, f"/ws/r?token={c.token}", (BINARY, b"\0" * 3))[0] == 1007


def p_mux_short(c):
    assert ws_close(c.ws, "/mux", (BINARY, b"\1\0\0\0"))[0] == 1007


def p_close_reason(c):
    assert ws_close(c.ws, "/mux", (CLOSE, struct.pack("!H", 1001) + b"\xff"))[0] == 1007


def p_bad_id(c):
    assert ws_close(c.ws, "/ws/a%20b?new=1")[0] == 1008


def p_mux_not_json(c):
    assert ws_close(c.ws, "/mux", (TEXT, b"{"))[0] == 1008


def p_mux_dtype(c):
    assert ws_close(c.ws, "/mux?dtype=int8")[0] == 1008


def p_too_big(c):
    assert ws_close(c.ws, "/mux", (BINARY, bytes(5000)))[0] == 1009


def p_table_full_ws(c):
    c.new("x1")                             # --capacity 3, with r and idle
    assert ws_close(c.ws, "/ws/x2?new=1")[0] == 1013
    c.delete("x1")


def p_table_full_mux(c):
    c.new("x1")
    ws, _ = hello(c.ws, "/mux")
    (entry,) = mux_answer(ws, {"open": [{"stream": "x2", "new": True}]})["opened"]
    ws.end(1000)
    assert entry["code"] == 1013 and "--capacity" in entry["error"]
    c.delete("x1")


def p_table_full_http(c):
    c.new("x1")
    assert refusal(c.http, "POST", "/streams", {"stream": "x2"})[0] == 429
    c.delete("x1")


def p_queue_full_ws(c):
    ws, _ = hello(c.ws, f"/ws/r?token={c.token}")
    ws.send(BINARY, b"\0" * 4 * I)         # held (Ctx)
    ws.send(BINARY, b"\0" * 4 * I)         # --max-queue-per-stream 1
    assert ws.close_of()[0] == 1013
    c.release()


def p_queue_full_http(c):
    first = threading.Thread(target=c.step, args=("r", c.token))
    first.start()
    held(c)
    assert refusal(c.http, "POST", "/streams/r/step", {"x": X, "token": c.token})[0] == 503
    c.release()
    first.join()


def p_connections(c):
    held_open = [hello(c.ws, "/mux")[0] for _ in range(4)]    # --max-connections 4
    assert ws_close(c.ws, "/mux")[0] == 1013
    for ws in held_open:
        ws.end(1000)


def p_streams_per_connection(c):
    ws, _ = hello(c.ws, "/mux")
    mux_answer(ws, {"open": [{"stream": "y1", "new": True}]})
    (entry,) = mux_answer(ws, {"open": [{"stream": "y2", "new": True}]})["opened"]
    ws.end(1000)                            # ends y1
    assert entry["code"] == 1013 and "--max-streams-per-connection" in entry["error"]


def p_no_token(c):
    assert ws_close(c.ws, "/ws/r")[0] == 4401


def p_mux_no_token(c):
    ws, _ = hello(c.ws, "/mux")
    (entry,) = mux_answer(ws, {"open": [{"stream": "r"}]})["opened"]
    ws.end(1000)
    assert entry["code"] == 4401


def p_wrong_token(c):
    assert ws_close(c.ws, "/ws/r?token=%ED%A0%80")[0] == 4403


def p_mux_wrong_token(c):
    ws, _ = hello(c.ws, "/mux")
    (entry,) = mux_answer(ws, {"open": [{"stream": "r", "token": "\ud800"}]})["opened"]
    ws.end(1000)
    assert entry["code"] == 4403


def p_not_found(c):
    assert ws_close(c.ws, "/ws/nobody?token=x")[0] == 4404


def p_conflict(c):
    assert ws_close(c.ws, "/ws/r?new=1")[0] == 4409


def p_held_elsewhere(c):
    ws, _ = hello(c.ws, f"/ws/r?token={c.token}")
    assert ws_close(c.ws, f"/ws/r?token={c.token}")[0] == 4409
    ws.end(1001)


def p_ws_port_404(c):
    assert RawWS(c.ws, "/nope").status == 404


def p_gone(c):
    ws, _ = hello(c.ws, "/mux")
    (entry,) = mux_answer(ws, {"open": [{"stream": "g", "new": True}]})["opened"]
    c.delete("g")
    assert ws.text()["gone"][0]["stream"] == "g"
    ws.send(BINARY, encode([entry["index"]], bytes(4 * I)))
    assert ws.text()["refused"]["code"] == 4410
    ws.end(1000)


def p_http_400(c):
    assert refusal(c.http, "POST", "/streams", b"{")[0] == 400


def p_http_no_token(c):
    assert refusal(c.http, "POST", "/streams/r/step", {"x": X})[0] == 401


def p_no_admin_token(c):
    status, fields, _ = http(c.http, "GET", "/streams")
    assert status == 401 and fields["www-authenticate"] == "Bearer"


def p_no_scheme(c):
    status, fields, content = http(c.http, "GET", "/streams", headers=[("Authorization", ADMIN)])
    assert status == 401 and fields["www-authenticate"] == "Bearer"
    assert "got no scheme" in json.loads(content)["error"]


def p_other_scheme(c):
    status, _, content = http(c.http, "GET", "/streams",
                              headers=[("Authorization", f"Basic {ADMIN}")])
    assert status == 401 and "got the scheme 'Basic'" in json.loads(content)["error"]


def p_http_wrong_token(c):
    assert refusal(c.http, "POST", "/streams/r/step", {"x": X, "token": "\ud800"})[0] == 403


def p_wrong_admin_token(c):
    assert refusal(c.http, "GET", "/streams", token=ADMIN[::-1]) == (
        403, "the admin token is wrong")


def p_http_not_found(c):
    assert refusal(c.http, "DELETE", "/streams/nobody", token=ADMIN)[0] == 404


def p_no_path(c):
    assert refusal(c.http, "GET", "/nope")[0] == 404


def p_no_method(c):
    assert refusal(c.http, "PATCH", "/streams/r/step")[0] == 405


def p_http_conflict(c):
    assert refusal(c.http, "POST", "/streams", {"stream": "r"})[0] == 409


def p_too_long(c):
    assert refusal(c.http, "POST", "/streams", b" " * 70000)[0] == 413


def p_http_422(c):
    assert refusal(c.http, "POST", "/streams/r/step", {"x": [1], "token": c.token})[0] == 422


def p_bad_state(c):
    assert refusal(c.http, "PUT", "/streams/k/state", {"t": 1}, token=ADMIN)[0] == 422


def p_echo_step(e):
    status, _, content = http(e.http, "POST", "/streams", {"stream": "e"})
    token = json.loads(content)["token"]
    assert refusal(e.http, "POST", "/streams/e/step", {"x": X, "token": token})[0] == 409
    e.delete("e")


# the restart rows, on a server that drains (the fixture `draining`)
def p_drain_new(d):
    assert ws_close(d.ws, "/ws/late?new=1")[0] == 1012


def p_drain_mux_open(d):
    (entry,) = mux_answer(d.mux, {"open": [{"stream": "late", "new": True}]})["opened"]
    assert entry["code"] == 1012


def p_drain_mux_frame(d):
    d.mux.send(BINARY, encode([0], bytes(4 * I)))
    assert d.mux.text()["refused"]["code"] == 1012


def p_drain_create(d):
    assert refusal(d.http, "POST", "/streams", {"stream": "late"})[0] == 503


def p_drain_step(d):
    assert refusal(d.http, "POST", "/streams/h/step", {"x": X, "token": d.h_token})[0] == 503


# {(where, answer, reason): [(server, provocation), ...]}: "limits" (the
# fixture of that name), "echo" (an --echo server) or "draining"
PROVOKE = {
    ("WebSocket", "1002", "bad_frame"): [("limits", p_unmasked), ("limits", p_close_one_byte)],
    ("WebSocket", "1003", "bad_frame"): [("limits", p_text), ("limits", p_mux_fragment)],
    ("WebSocket", "1007", "bad_frame"): [("limits", p_short), ("limits", p_mux_short),
                                         ("limits", p_close_reason)],
    ("WebSocket", "1008", "bad_request"): [("limits", p_bad_id), ("limits", p_mux_not_json),
                                           ("limits", p_mux_dtype)],
    ("WebSocket", "1009", "frame_too_large"): [("limits", p_too_big)],
    ("WebSocket", "1012", "draining"): [("draining", p_drain_new),
                                        ("draining", p_drain_mux_open)],
    ("WebSocket", "1013", "table_full"): [("limits", p_table_full_ws),
                                          ("limits", p_table_full_mux)],
    ("WebSocket", "1013", "queue_full"): [("limits", p_queue_full_ws)],
    ("WebSocket", "1013", "too_many_connections"): [("limits", p_connections)],
    ("WebSocket", "1013", "too_many_streams"): [("limits", p_streams_per_connection)],
    ("WebSocket", "4401", "no_token"): [("limits", p_no_token), ("limits", p_mux_no_token)],
    ("WebSocket", "4403", "wrong_token"): [("limits", p_wrong_token),
                                           ("limits", p_mux_wrong_token)],
    ("WebSocket", "4404", "not_found"): [("limits", p_not_found)],
    ("WebSocket", "4409", "conflict"): [("limits", p_conflict), ("limits", p_held_elsewhere)],
    ("WebSocket", "404", "bad_request"): [("limits", p_ws_port_404)],
    ("/mux", "4410", "gone"): [("limits", p_gone)],
    ("/mux", "1012", "draining"): [("draining", p_drain_mux_frame)],
    ("HTTP", "400", "bad_request"): [("limits", p_http_400)],
    ("HTTP", "401", "no_token"): [("limits", p_http_no_token)],
    ("HTTP", "401", "no_admin_token"): [("limits", p_no_admin_token), ("limits", p_no_scheme),
                                        ("limits", p_other_scheme)],
    ("HTTP", "403", "wrong_token"): [("limits", p_http_wrong_token)],
    ("HTTP", "403", "wrong_admin_token"): [("limits", p_wrong_admin_token)],
    ("HTTP", "404", "not_found"): [("limits", p_http_not_found)],
    ("HTTP", "404, 405", "bad_request"): [("limits", p_no_path), ("limits", p_no_method)],
    ("HTTP", "409", "conflict"): [("limits", p_http_conflict)],
    ("HTTP", "409", "bad_request"): [("echo", p_echo_step)],
    ("HTTP", "413", "body_too_large"): [("limits", p_too_long)],
    ("HTTP", "422", "bad_request"): [("limits", p_http_422)],
    ("HTTP", "422", "bad_state"): [("limits", p_bad_state)],
    ("HTTP", "429", "table_full"): [("limits", p_table_full_http)],
    ("HTTP", "503", "queue_full"): [("limits", p_queue_full_http)],
    ("HTTP", "503", "draining"): [("draining", p_drain_create), ("draining", p_drain_step)],
}


def test_every_row_of_the_guide_is_provoked():
    rows = guide_rows()
    assert set(rows) == set(PROVOKE), (sorted(set(rows) - set(PROVOKE)),
                                       sorted(set(PROVOKE) - set(rows)))


@pytest.fixture(scope="module")
def limits(model_file, token_file):
    """A server of small limits where a step of r waits for idle's (Ctx)."""
    with run_server("--model", model_file, "--admin-token-file", token_file, "--capacity", 3,
                    "--max-connections", 4, "--max-streams-per-connection", 1,
                    "--max-frame", 4096, "--max-queue-per-stream", 1, "--max-batch", 2,
                    "--max-delay-ms", 600000) as server:
        yield Ctx(server)


@pytest.fixture(scope="module")
def echo(model_file, token_file):
    with run_server("--model", model_file, "--admin-token-file", token_file,
                    "--echo") as server:
        yield Ctx(server)


@pytest.fixture(scope="module")
def draining(model_file, token_file):
    """A server that drains: SIGTERM came while a step of r that it holds
    (Ctx) is in flight; a stream h for HTTP steps and a /mux connection with
    a stream attached wait."""
    with run_server("--model", model_file, "--admin-token-file", token_file, "--max-batch", 2,
                    "--max-delay-ms", 600000) as server:
        ctx = Ctx(server)
        ctx.h_token = ctx.new("h")
        ctx.mux, _ = hello(server.ws, "/mux")
        assert "index" in mux_answer(ctx.mux, {"open": [{"stream": "m", "new": True}]})[
            "opened"][0]
        holder, _ = hello(server.ws, f"/ws/r?token={ctx.token}")
        holder.send(BINARY, b"\0" * 4 * I)
        held(ctx)
        server.proc.send_signal(signal.SIGTERM)
        until(lambda: gauge(server, "draining") == 1, "the server to drain")
        yield ctx
        server.proc.kill()


def _settled(ctx):
    """The server holds the connections and streams of its set-up alone."""
    return (gauge(ctx.server, "connections") == ctx.connections
            and gauge(ctx.server, "streams") == ctx.streams)


@pytest.mark.parametrize("row", sorted(PROVOKE), ids=" ".join)
def test_a_refusal_moves_its_reason_by_one(row, request):
    reason = row[2]
    for name, provoke in PROVOKE[row]:
        ctx = request.getfixturevalue(name)
        if not hasattr(ctx, "connections"):
            ctx.connections = gauge(ctx.server, "connections")
            ctx.streams = gauge(ctx.server, "streams")
        before = rejections(ctx.server)
        provoke(ctx)
        until(functools.partial(_settled, ctx), "the server to let the connections go")
        after = rejections(ctx.server)
        moved = {r: after[r] - before[r] for r in after if after[r] != before[r]}
        assert moved == {reason: 1}, (provoke.__name__, moved)
