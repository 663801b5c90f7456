"""Servers coming and going behind a proxy that routes by stream id: the
streams move to the servers the proxy now routes their ids to.

A stream lives in one server. When the proxy's list of servers changes (a
server joins, or one is taken out to stop it), a consistent hash routes about
1/N of the ids to another server, and those streams move there with export
and import (:func:`fastln.serve.client.move_stream`): each one's client, closed
with 4410, reconnects through the proxy with its resume token and resumes on
the new owner. The proxy itself says who owns an id: ``GET /owner/ID``
through it reaches the owner, which answers with its own addresses
(``--advertise``).

    from fastln.serve.cluster import drain, rebalance

    rebalance("http://proxy", ["http://10.0.0.11:8000", ...], admin_token)  # after a join
    drain("http://proxy", "http://10.0.0.12:8000", admin_token)   # after a removal; then SIGTERM

Server addresses are HTTP ones (``--port``), written as the servers'
``--advertise`` names them (``http://ADDRESS:PORT``), since that is what the
proxy's answers are compared with.
"""
import time
from typing import NamedTuple

from .client import MoveError, move_stream, request


class Move(NamedTuple):
    """One stream moved: its id, the HTTP addresses it left and reached, and
    its step count when it moved."""

    stream: str
    source: str
    target: str
    t: int


def streams(server, admin_token=None):
    """{stream id: steps run} of every stream the server at HTTP address
    server holds (its admin ``GET /streams``); RuntimeError if it does not answer."""
    status, reply = request("GET", f"{server}/streams", admin_token=admin_token)
    if status != 200:
        raise RuntimeError(f"{server} did not list its streams: {status} {reply}")
    return reply["streams"]


def owner(proxy, stream_id):
    """The HTTP address of the server that the proxy at HTTP address proxy
    routes stream_id to: ``GET /owner/ID`` through the proxy reaches that
    server, which names itself. RuntimeError if no server answers."""
    status, reply = request("GET", f"{proxy}/owner/{stream_id}")
    if status != 200 or "http" not in reply:
        raise RuntimeError(f"{proxy} did not name the owner of {stream_id!r}: {status} {reply}")
    return reply["http"]


def _move(stream_id, source, target, admin_token, moves, failed):
    """Moves one stream, appending a Move to moves, or (id, why) to failed;
    a stream that ended since its listing (its export answers 404) is passed over."""
    try:
        t = move_stream(stream_id, source, target, admin_token)
    except MoveError as e:
        if (e.stage, e.status) != ("export", 404):
            failed.append((stream_id, str(e)))
        return
    moves.append(Move(stream_id, source, target, t))


def _raise_failed(failed):
    if failed:
        raise RuntimeError(f"{len(failed)} streams did not move:\n" + "\n".join(
            f"  {sid}: {why}" for sid, why in failed))


def rebalance(proxy, servers, admin_token=None):
    """Moves every stream that a server of servers holds to the server the
    proxy routes its id to, once the proxy's list has changed (and, with
    nginx, the reload has taken effect).

    Parameters
    ----------
    proxy : str
        The proxy's HTTP address, ``http://HOST[:PORT]``; it routes
        ``/owner/ID`` as it routes ``/ws/ID``.
    servers : sequence of str
        The HTTP addresses of the servers that may hold streams, new and old,
        as their ``--advertise`` names them.
    admin_token : str, optional
        The servers' admin token, for listing, export and import.

    Returns
    -------
    list of Move
        The streams moved, in the order they moved. A second call right
        after moves none.

    Raises
    ------
    RuntimeError
        After trying every stream, when some did not move (a target that
        refused one returns it to its source; the message lists each and
        why), or when a server does not list its streams.

    Each move closes the stream's WebSocket with 4410; its client reconnects
    through the proxy and resumes on the new owner. Streams move one at a
    time, so that each waits only for its own export and import.
    """
    moves, failed = [], []
    for server in servers:
        for sid in streams(server, admin_token):
            target = owner(proxy, sid)
            if target != server:
                _move(sid, server, target, admin_token, moves, failed)
    _raise_failed(failed)
    return moves


def drain(proxy, server, admin_token=None, timeout=30.0):
    """Moves every stream of server to the server the proxy routes its id
    to, once the proxy's list no longer holds server. Then the server holds
    nothing, and SIGTERM stops it.

    Parameters
    ----------
    proxy : str
        The proxy's HTTP address, as for :func:`rebalance`.
    server : str
        The HTTP address of the server that leaves, as its ``--advertise``
        names it.
    admin_token : str, optional
        The servers' admin token.
    timeout : float, optional
        Seconds to wait while the proxy still routes ids to server.

    Returns
    -------
    list of Move
        The streams moved, in the order they moved.

    Raises
    ------
    RuntimeError
        When ids still route to server after timeout seconds (the list
        still holds it, or the proxy has not reloaded), or when a stream
        does not move (the message lists each and why).

    Until the proxy's new list takes effect, it still routes some ids to
    server, and new streams may still open there: drain lists the server
    again, moving what it finds, until it holds none.
    """
    deadline = time.monotonic() + timeout
    moves, failed = [], []
    while True:
        tried = {sid for sid, _ in failed}     # returned to server: not tried again
        ids = [sid for sid in streams(server, admin_token) if sid not in tried]
        if not ids:
            break
        stuck = []
        for sid in ids:
            target = owner(proxy, sid)
            if target == server:
                stuck.append(sid)
            else:
                _move(sid, server, target, admin_token, moves, failed)
        if stuck:
            if time.monotonic() > deadline:
                _raise_failed(failed)
                raise RuntimeError(f"{proxy} still routes {len(stuck)} streams to {server} "
                                   f"after {timeout} s (e.g. {stuck[0]!r}): is it out of the "
                                   f"proxy's list, and has the proxy reloaded?")
            time.sleep(0.05)
    _raise_failed(failed)
    return moves
