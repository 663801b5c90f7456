"""A fastln-serve server in a subprocess, for tests and measurements:
:func:`run_server` starts it on free ports and learns them from the
``--ports-file`` it writes; :class:`Server` holds its URLs and process."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import fastln

from .admin import request


class Server:
    """A fastln-serve process that :func:`run_server` started: its URLs and process."""

    def __init__(self, proc, log, http, ws):
        self.proc, self.log, self.http, self.ws = proc, log, http, ws

    def health(self):
        """The server's GET /health, as a dict."""
        return request("GET", self.http + "/health", timeout=10)[1]

    def output(self):
        """What the server printed so far."""
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def stop(self, timeout=30.0):
        """SIGTERM, then waits for the exit (kills it past timeout); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def run_server(*args, timeout=60.0):
    """Runs ``python -m fastln.serve *args`` (free ports unless args name them) until the
    block ends, then stops it; yields a :class:`Server` once it serves, with the
    ports of its ``--ports-file``. The server imports the fastln that this
    process imported. A server that exits or does not serve within timeout
    raises RuntimeError with the end of its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (
        os.path.dirname(os.path.dirname(os.path.abspath(fastln.__file__))),
        env.get("PYTHONPATH"))))
    args = [str(a) for a in args]
    for flag in ("--port", "--ws-port"):
        if flag not in args:
            args += [flag, "0"]
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile() as log:
        ports_file = os.path.join(folder, "ports.json")
        proc = subprocess.Popen([sys.executable, "-m", "fastln.serve", *args,
                                 "--ports-file", ports_file],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        server = Server(proc, log, None, None)
        try:
            deadline = time.monotonic() + timeout
            while not os.path.exists(ports_file):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fastln-serve {' '.join(args)} did not start:\n"
                                       f"{server.output()[-3000:]}")
                time.sleep(0.05)
            with open(ports_file, encoding="utf-8") as f:
                ports = json.load(f)
            server.http = f"http://{ports['host']}:{ports['port']}"
            server.ws = f"ws://{ports['host']}:{ports['ws_port']}"
            yield server
        finally:
            server.stop()
