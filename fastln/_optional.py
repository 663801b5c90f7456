"""The optional packages behind some features, and the error that names them.

``import fastln`` needs only NumPy. A feature that needs more
imports its package when it is used, and where the package is missing it
raises the ImportError of :func:`missing`, which names the package and the
extra of ``pyproject.toml`` that installs it.
"""
from __future__ import annotations

# the package an import names -> the fastln extra that installs it
EXTRAS = {
    "ml_dtypes": "bfloat16",
    "onnx": "onnx",
    "dask": "dask",
    "distributed": "dask",
    "picows": "serve",
    "starlette": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "redis": "serve",
    "torch": "torch",
}


def missing(package: str, feature: str) -> ImportError:
    """The error for ``feature`` used without ``package``."""
    return ImportError(f"{feature} needs the {package} package, which is not installed: "
                       f"pip install \"fastln[{EXTRAS[package]}]\"", name=package)
