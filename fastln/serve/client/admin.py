"""The HTTP side of a client: one JSON request, and moving a stream from one
server to another (export, then import) with the servers' admin token."""
import json
import urllib.error
import urllib.request


def request(method, url, body=None, timeout=30.0, admin_token=None):
    """(status, JSON reply) of one HTTP request; body is JSON-ready values,
    or bytes sent as they are; admin_token goes in an ``Authorization:
    Bearer`` header."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if admin_token is not None:
        headers["Authorization"] = f"Bearer {admin_token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:        # not JSON: a proxy's page, or a server's crash
            return e.code, {"error": text.decode("utf-8", "replace")}


class MoveError(RuntimeError):
    """A move that failed: ``stage`` "export" (the source did not give the
    stream up) or "import" (the target refused it), and the HTTP ``status``
    of that request."""

    def __init__(self, message, stage, status):
        super().__init__(message)
        self.stage, self.status = stage, status


def move_stream(stream_id, source, target, admin_token=None):
    """Moves a stream from the server at HTTP address source to the one at
    target (``http://host:port`` each): export, then put, with the servers'
    admin token. Its client's WebSocket on source closes with 4410; it
    reconnects to target with the same resume token and resumes. If target
    refuses it, the stream goes back to source and :class:`MoveError` says
    why. Returns the stream's step count."""
    status, exported = request("POST", f"{source}/streams/{stream_id}/export",
                               admin_token=admin_token)
    if status != 200:
        raise MoveError(f"{source} did not export {stream_id!r}: {status} {exported}",
                        "export", status)
    status, reply = request("PUT", f"{target}/streams/{stream_id}/state", exported,
                            admin_token=admin_token)
    if status != 201:
        back, _ = request("PUT", f"{source}/streams/{stream_id}/state", exported,
                          admin_token=admin_token)
        raise MoveError(f"{target} refused {stream_id!r}: {status} {reply}; "
                        f"{'returned to' if back == 201 else 'and could not return it to'} "
                        f"{source}", "import", status)
    return reply["t"]
