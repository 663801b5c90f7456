"""Fixtures for the fastln tests.

* ``isa``: every test that takes it runs once per instruction-set path this
  CPU supports (``fastln.supported_isas()``); the path is switched with
  ``fastln._core._set_isa`` and restored afterwards.
* ``torch``: PyTorch, skipped when missing -- unless FASTLN_REQUIRE_TORCH=1
  (set by CI), where a missing torch is a failure.
* ``rng``: a seeded NumPy Generator.
"""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import fastln  # noqa: E402


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
    fastln._core._set_isa(request.param)
    try:
        assert fastln.get_isa() == request.param
        yield request.param
    finally:
        fastln._core._set_isa(previous)
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
