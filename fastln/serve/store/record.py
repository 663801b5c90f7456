"""One stream's checkpoint, :class:`Record`, and its bytes.

A record holds what restores a stream on any server: its id, the steps it
has run, the SHA-256 of its resume token (never the token itself) and its
state arrays. :func:`encode` writes it in a small versioned layout, every
number little-endian:

====================  ======================================================
magic                 ``b"FLNC"``
version               u16 (1)
t                     i64, the steps the stream has run
token hash            32 bytes
id                    u16 length, then the id's UTF-8 bytes
parts                 u8, the number of state arrays
state                 each array's raw bytes, in C order
====================  ======================================================

The layout names no dtype or shape: every record of one model has the
same, which the reader gives :func:`decode`, and which it checks against
the record's length.
"""
from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple, Sequence

import numpy as np

MAGIC = b"FLNC"
VERSION = 1
_HEAD = struct.Struct("<4sHq32sH")   # magic, version, t, token hash, id length
HASH_SIZE = hashlib.sha256().digest_size


class Record(NamedTuple):
    """One stream's checkpoint.

    Attributes
    ----------
    stream : str
        The stream's id.
    t : int
        The steps the stream has run; ``state`` is its state after them.
    token_hash : bytes
        ``hashlib.sha256(token.encode()).digest()`` of the stream's resume
        token (32 bytes).
    state : list of numpy.ndarray
        The stream's state arrays, each ``(num_layers, 1, H)``, in the
        server's state dtypes.
    """

    stream: str
    t: int
    token_hash: bytes
    state: list[np.ndarray]


def encode(record: Record) -> bytes:
    """The bytes of ``record`` (see the module's layout).

    Parameters
    ----------
    record : Record
        The checkpoint to write.

    Returns
    -------
    bytes

    Raises
    ------
    TypeError
        ``record`` is not a Record, or its fields have the wrong types.
    ValueError
        ``t`` is negative, ``token_hash`` is not 32 bytes, the id is longer
        than 65535 UTF-8 bytes, or ``state`` has more than 255 arrays.
    """
    if not isinstance(record, Record):
        raise TypeError(f"record must be a Record, got {type(record).__name__}")
    stream, t, token_hash, state = record
    if not isinstance(stream, str):
        raise TypeError(f"record.stream must be a str, got {type(stream).__name__}")
    sid = stream.encode("utf-8")
    if len(sid) > 0xFFFF:
        raise ValueError(f"record.stream is {len(sid)} UTF-8 bytes; at most 65535 fit")
    if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
        raise TypeError(f"record.t must be an int, got {type(t).__name__}")
    if not 0 <= t < 2**63:
        raise ValueError(f"record.t must be in [0, 2**63), got {t}")
    if not isinstance(token_hash, bytes) or len(token_hash) != HASH_SIZE:
        raise ValueError(f"record.token_hash must be {HASH_SIZE} bytes (a SHA-256 digest), "
                         f"got {_describe(token_hash)}")
    if len(state) > 0xFF:
        raise ValueError(f"record.state has {len(state)} arrays; at most 255 fit")
    parts = []
    for i, a in enumerate(state):
        if not isinstance(a, np.ndarray) or a.dtype.hasobject:
            raise TypeError(f"record.state[{i}] must be a numeric numpy array, got "
                            f"{_describe(a)}")
        little = a.dtype.newbyteorder("<")
        if a.dtype != little or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a, little)
        parts.append(a.data)   # joined below without a copy of its own
    head = _HEAD.pack(MAGIC, VERSION, int(t), token_hash, len(sid))
    return b"".join([head, sid, bytes([len(parts)]), *parts])


def decode(blob: bytes, dtypes: Sequence, shape: Sequence[int]) -> Record:
    """The Record that ``blob`` holds, its state arrays of ``dtypes`` and
    ``shape``.

    Parameters
    ----------
    blob : bytes-like
        Bytes written by :func:`encode`.
    dtypes : sequence of numpy dtypes
        The dtype of each state array, one per array.
    shape : sequence of int
        The shape of every state array, ``(num_layers, 1, H)``.

    Returns
    -------
    Record
        Its state arrays are new, writable and in native byte order.

    Raises
    ------
    TypeError
        ``blob`` is not bytes-like, or ``dtypes`` or ``shape`` are not
        sequences of dtypes and ints.
    ValueError
        The blob is short, its magic or version is not this module's, its id
        is not UTF-8, or its number of state arrays or their size is not what
        ``dtypes`` and ``shape`` make.
    """
    try:
        view = memoryview(blob).cast("B")
    except TypeError:
        raise TypeError(f"blob must be bytes-like, got {type(blob).__name__}") from None
    dtypes = [np.dtype(d) for d in _sequence(dtypes, "dtypes")]
    shape = tuple(_sequence(shape, "shape"))
    if not all(isinstance(n, (int, np.integer)) and n >= 0 for n in shape):
        raise TypeError(f"shape must be a sequence of non-negative ints, got {shape}")
    if len(view) < _HEAD.size + 1:
        raise ValueError(f"a checkpoint record is at least {_HEAD.size + 1} bytes, "
                         f"got {len(view)}")
    magic, version, t, token_hash, id_size = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise ValueError(f"not a checkpoint record: its magic is {magic!r}, not {MAGIC!r}")
    if version != VERSION:
        raise ValueError(f"checkpoint record version {version}; this fastln reads "
                         f"version {VERSION}")
    if t < 0:
        raise ValueError(f"checkpoint record's t is negative ({t})")
    at = _HEAD.size + id_size
    if len(view) < at + 1:
        raise ValueError(f"checkpoint record of {len(view)} bytes ends within its "
                         f"{id_size}-byte id")
    try:
        stream = bytes(view[_HEAD.size:at]).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("checkpoint record's stream id is not UTF-8") from None
    count = view[at]
    at += 1
    if count != len(dtypes):
        raise ValueError(f"checkpoint record of stream {stream!r} has {count} state arrays, "
                         f"expected {len(dtypes)} (dtypes)")
    size = int(np.prod(shape, dtype=np.int64))
    need = sum(size * d.itemsize for d in dtypes)
    if len(view) - at != need:
        raise ValueError(f"checkpoint record of stream {stream!r} holds {len(view) - at} "
                         f"bytes of state, where {count} arrays of shape {shape} in "
                         f"{[d.name for d in dtypes]} take {need}")
    state = []
    for d in dtypes:
        a = np.frombuffer(view, d.newbyteorder("<"), size, at)
        state.append(a.astype(d.newbyteorder("="), copy=True).reshape(shape))
        at += size * d.itemsize
    return Record(stream, t, token_hash, state)


def _sequence(value, name):
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence, got {type(value).__name__}")
    return value


def _describe(value):
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype}"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return f"a {type(value).__name__}"
