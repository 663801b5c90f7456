"""Runs the serving guide's first example as a user of the installed package
does: in a folder outside the checkout, with the ``python`` and
``fastln-serve`` of one environment and no PYTHONPATH.

    python tests/_serve_guide.py WORKDIR      # exit code 0 when it worked

The guide (docs/guide/serving.md) opens with two ``console`` blocks: the
first installs the extra (skipped here: the environment has it), writes a
model and starts the server; the second, "from another shell", creates a
stream, steps it and asks for the health over HTTP with curl. This script
runs them as written, each line through bash with the environment's bin
folder first on PATH, then stops the server with SIGTERM and checks that it
saved the stream. Standard library only, so that it runs in an environment
that holds only ``fastln[serve]``.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guide", "serving.md")


def console_blocks(path=GUIDE):
    """The commands of each ```console block of path: a list per block, each
    command one string (continuation lines, ending in |, joined)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for body in re.findall(r"^```console\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        commands, pending = [], ""
        for line in body.splitlines():
            pending += line.strip() + " "
            if not line.rstrip().endswith("|"):
                commands.append(pending.strip())
                pending = ""
        blocks.append([c for c in commands if c])
    return blocks


def user_env(python):
    """A user's environment: python's bin folder first on PATH, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    return env


def run_guide(python, workdir, timeout=120.0):
    """Runs the guide's first example in workdir; returns (the server's
    output, the second block's outputs). AssertionError says what failed."""
    start, requests = console_blocks()[:2]
    env = user_env(python)
    bash = ["bash", "-c"]
    setup = [c for c in start if not c.startswith("pip ")]
    server_cmd = setup.pop()                       # the last line starts the server
    assert server_cmd.startswith("fastln-serve "), server_cmd
    for cmd in setup:
        r = subprocess.run(bash + [cmd], cwd=workdir, env=env, capture_output=True,
                           text=True, timeout=timeout, check=False)
        assert r.returncode == 0, f"{cmd}: {r.stdout}{r.stderr}"
    log = open(os.path.join(workdir, "server.log"), "w+")
    server = subprocess.Popen(bash + ["exec " + server_cmd], cwd=workdir, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    outputs = []
    try:
        deadline = time.monotonic() + timeout
        while "serving " not in _read(log):
            assert server.poll() is None, f"{server_cmd} exited: {_read(log)}"
            assert time.monotonic() < deadline, f"{server_cmd} did not start: {_read(log)}"
            time.sleep(0.1)
        for cmd in requests:
            r = subprocess.run(bash + ["set -o pipefail; " + cmd], cwd=workdir, env=env,
                               capture_output=True, text=True, timeout=timeout, check=False)
            assert r.returncode == 0, f"{cmd}: {r.stdout}{r.stderr}"
            outputs.append(json.loads(r.stdout))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    out = _read(log)
    assert server.returncode == 0, f"{server_cmd} exited with {server.returncode}: {out}"
    return out, outputs


def _read(log):
    log.seek(0)
    return log.read()


def main(argv):
    workdir = argv[1]
    os.makedirs(workdir, exist_ok=True)
    out, outputs = run_guide(sys.executable, workdir)
    print(out, *map(json.dumps, outputs), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
