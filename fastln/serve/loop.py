"""The event loop of the server, the clients and the load generator:
uvloop's where it is installed (the serve extra installs it, but for
Windows), else asyncio's."""
import asyncio

try:
    import uvloop
except ImportError:   # plain asyncio
    uvloop = None  # type: ignore[assignment]

NAME = "uvloop" if uvloop is not None else "asyncio"   # the loop that run() runs


def run(main):
    """Runs the coroutine main on uvloop's event loop, or asyncio's without uvloop."""
    if uvloop is None:
        return asyncio.run(main)
    return uvloop.run(main)
