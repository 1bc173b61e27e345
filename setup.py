"""Builds the native data plane, `rlsync._engine` (csrc/), alongside the pure-Python package.

Everything else about the package lives in pyproject.toml; this file only exists because the
extension is C++. The extension is optional: if the compiler or headers are missing the install
still succeeds and the `tcp` transport reports itself unavailable, so readers use `tcp-py`.
Why pybind11 under setuptools (not nanobind/scikit-build-core or torch's cpp_extension): see
docs/transports.md. Rebuild after editing csrc/: `scripts/run pip install -e . --no-deps -q`.
The build records a digest of its sources (`rlsync._engine.SOURCES`; rlsync.hub.dataplane.native), so a
checkout whose csrc/ moved on since its build says so instead of silently running the old engine.
"""
import hashlib
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

SOURCES = ["csrc/engine.cpp", "csrc/xxh3_dispatch.cpp"]  # the digest's order: rlsync.hub.dataplane.native
digest = hashlib.sha256(b"".join((Path(__file__).parent / f).read_bytes() for f in SOURCES)).hexdigest()[:16]

engine = Pybind11Extension(
    "rlsync._engine",
    SOURCES,
    include_dirs=["csrc"],
    define_macros=[("RLSYNC_ENGINE_SOURCES", f'"{digest}"')],
    cxx_std=17,
    extra_compile_args=["-O3"],
    optional=True,
)

setup(ext_modules=[engine], cmdclass={"build_ext": build_ext})
