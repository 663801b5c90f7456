"""fastln.serve as a user of the installed package meets it: the serving
guide's first example (docs/guide/serving.md: write a model, start
``fastln-serve``, then curl a stream's step and the health) run as written,
in a folder outside the checkout, with this environment's ``python`` and
``fastln-serve`` and no PYTHONPATH (tests/_serve_guide.py, which CI also runs
in a fresh environment that holds only ``fastln[serve]``).

Where fastln is not installed in this environment (a checkout built in
place), or curl is missing, the test skips; under CI, which installs both,
it fails instead.
"""
import os
import shutil
import subprocess
import sys

import pytest
from _serve_guide import console_blocks, run_guide, user_env


def _installed_or_skip(tmp_path):
    env = user_env(sys.executable)
    r = subprocess.run([sys.executable, "-c", "import fastln.serve"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    bin_dir = os.path.dirname(sys.executable)
    why = None
    if r.returncode != 0:
        why = f"fastln is not installed in this environment: {r.stderr.strip()[-300:]}"
    elif not os.path.exists(os.path.join(bin_dir, "fastln-serve")):
        why = f"no fastln-serve in {bin_dir}"
    elif shutil.which("curl") is None:
        why = "the guide's example uses curl, which is not installed"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def test_guide_blocks_are_what_the_runner_expects():
    start, requests = console_blocks()[:2]
    assert start[0].startswith("pip install") and "fastln[serve]" in start[0]
    assert start[-1].startswith("fastln-serve --model ")
    assert [c.split()[0] for c in requests] == ["curl", "python", "curl"]


def test_guide_runs_from_the_installed_package(tmp_path):
    _installed_or_skip(tmp_path)
    help_ = subprocess.run(["fastln-serve", "--help"], cwd=tmp_path, env=user_env(sys.executable),
                           capture_output=True, text=True, check=False)
    assert help_.returncode == 0 and help_.stdout.startswith("usage: fastln-serve"), help_.stderr
    out, (created, step, health) = run_guide(sys.executable, str(tmp_path))
    assert created["stream"] == "demo" and len(created["token"]) == 32
    assert step["t"] == 0 and len(step["y"]) == 256
    assert health["status"] == "ok" and health["streams"] == 1
    assert "saved 1 streams to streams.npz" in out
    assert (tmp_path / "streams.npz").exists() and (tmp_path / "model.npz").exists()


def test_the_lazy_names_are_the_exported_ones():
    import fastln.serve

    assert sorted(fastln.serve.__all__) == sorted(fastln.serve._EXPORTS)
