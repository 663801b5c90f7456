"""Fixtures for the fastln tests.

* ``isa``: every test that takes it runs once per instruction-set path this
  CPU supports (``fastln.supported_isas()``); the path is switched with
  ``fastln._lib._set_isa`` and restored afterwards.
* ``torch``: PyTorch, skipped when missing -- unless FASTLN_REQUIRE_TORCH=1
  (set by CI), where a missing torch is a failure.
* ``rng``: a seeded NumPy Generator.
* ``dask_client``: a dask.distributed client of a LocalCluster of two worker
  processes, one per test module.

Once the tests are collected, the C builds of tests/test_c.py and
tests/test_cross.py start in the background when any of their tests is
selected (see their start_builds), and their tests move to the end of the run:
the other tests run while the builds compile (each compiles the whole C core),
where a test waiting on a build would leave a core idle.

With FASTLN_SKIPPED_LOG=PATH, the node id of every skipped test (or module,
where a whole module skips) is appended to PATH, one a line: .ci/run runs the
suite as a user's environment has it, then runs those again once torch and
the cross tools are installed (``python -m pytest @PATH``).
"""
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import fastln  # noqa: E402

C_BUILD_MODULES = ("test_c", "test_cross")   # modules with start_builds / stop_builds
_c_builds = []   # (module, build folder) of the builds started


@pytest.hookimpl(trylast=True)   # after -m and -k have deselected: only the builds needed
def pytest_collection_modifyitems(config, items):
    mods = {getattr(item, "module", None) for item in items}
    builders = [m for m in mods if getattr(m, "__name__", "") in C_BUILD_MODULES]
    if builders and not _c_builds:
        for mod in sorted(builders, key=lambda m: m.__name__):
            folder = tempfile.mkdtemp(prefix=f"fastln_{mod.__name__}_")
            _c_builds.append((mod, folder))
            mod.start_builds(folder, {item.name for item in items if item.module is mod})
        items.sort(key=lambda item: getattr(item, "module", None) in builders)   # stable


def _log_skip(report):
    path = os.environ.get("FASTLN_SKIPPED_LOG")
    if path and report.skipped:
        with open(path, "a", encoding="utf-8") as f:
            f.write(report.nodeid + "\n")


def pytest_runtest_logreport(report):
    _log_skip(report)


def pytest_collectreport(report):
    _log_skip(report)


def pytest_sessionfinish(session):
    for mod, folder in _c_builds:
        mod.stop_builds()
        shutil.rmtree(folder, ignore_errors=True)


def _isas():
    isas = list(fastln.supported_isas())
    assert isas, "fastln.supported_isas() returned nothing"
    return isas


def pytest_generate_tests(metafunc):
    if "isa" in metafunc.fixturenames:
        metafunc.parametrize("isa", _isas(), indirect=True)


@pytest.fixture
def isa(request):
    """Run the test on ISA path ``request.param``; restore the previous path."""
    previous = fastln.get_isa()
    fastln._lib._set_isa(request.param)
    try:
        assert fastln.get_isa() == request.param
        yield request.param
    finally:
        fastln._lib._set_isa(previous)
    assert fastln.get_isa() == previous


@pytest.fixture(scope="session")
def torch():
    if os.environ.get("FASTLN_REQUIRE_TORCH") == "1":
        try:
            import torch as _torch
        except Exception as exc:  # ImportError, or a broken install
            pytest.fail("FASTLN_REQUIRE_TORCH=1 but torch cannot be imported: %r" % (exc,))
        return _torch
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def dask_client():
    from _util import require

    distributed = require("distributed")
    # distributed writes its workers' OMP_NUM_THREADS=1 (and MKL_..., ...) into
    # this process's os.environ too; a torch imported later would take it and
    # cap OpenMP, fastln included, at one thread for the rest of the test run
    environ = dict(os.environ)
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()
        os.environ.clear()
        os.environ.update(environ)


@pytest.fixture
def rng():
    return np.random.default_rng(20240607)


@pytest.fixture
def restore_threads():
    """Restore fastln's thread count after a test that changes it."""
    before = fastln.get_num_threads()
    yield before
    fastln.set_num_threads(before)
    assert fastln.get_num_threads() == before
