"""Builds fastln._lib, the Cython wrapper together with the C kernels in src_c/,
and the Cython modules that call those kernels (kernel_user below).

Flags are portable (-O3, no -march=native): the AVX2 and AVX-512 kernels are
compiled through target attributes and chosen at run time. OpenMP is probed
with a test compile; without it the build is serial, with a warning.
No debug information (-g0, over Python's -g): the kernels compile much
faster without it, and the module is far smaller.
The C sources compile in parallel (parallel_compile), the slowest first.

A second build where no source and no flag changed compiles nothing: it
reuses the extensions in build/ (see current_translation and
BuildExt.build_extensions), `pip install .` too, though pip makes a new
build environment each time.

A build that is not in place (`pip install .`) also copies the extensions into
the checkout's fastln/ folder: the README's commands (`pip install . &&
python -m fastln`, `python -m pytest`) run from the checkout, where ./fastln
shadows the installed package, so the checkout needs the extensions too.

What a build leaves in the checkout (all ignored by git): build/ is
setuptools' work folder (build/temp.*: the object files; build/lib.*: the
package staged for installing; build/temp.*/flags.txt: the compile and link
flags of the last build); fastln.egg-info/ is setuptools' metadata of
the package, written as pip builds it; fastln/*.c and fastln/rnn/_engine.c
are Cython's output, the C translations of the .pyx files that the compiler
builds (regenerated after a change to a .pyx or .pxd); fastln/*.so
(or .pyd) and fastln/rnn/_engine.*.so are the extensions, copied there as
above; fastln/include/ holds copies of the public headers (see
copy_public_headers). `git clean -fdX` removes them all. The installed
package keeps its own copy of the extensions, but Python started in the
checkout imports ./fastln, which then lacks them: run from another folder, or
rebuild.

Environment: FASTLN_NO_OPENMP=1 skips OpenMP; FASTLN_NATIVE=1 adds
-march=native (local experiments only); FASTLN_DEBUG=1 keeps -g.
"""
import filecmp
import glob
import os
import shutil
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# every C source under src_c/, the slowest to compile first (parallel_compile
# starts them in this order): the list CMakeLists.txt builds too
C_SOURCES_LIST = "src_c/sources.txt"
with open(C_SOURCES_LIST, encoding="utf-8") as f:
    C_SOURCES = ["src_c/" + line.strip() for line in f
                 if line.strip() and not line.startswith("#")]

assert sorted(C_SOURCES) == sorted(glob.glob("src_c/**/*.c", recursive=True)), \
    "src_c/sources.txt and the .c files under src_c/ differ"
C_HEADERS = sorted(glob.glob("src_c/**/*.h", recursive=True))
# the package's Cython sources: a change to any of them translates every .pyx again
CYTHON_SOURCES = sorted(glob.glob("fastln/**/*.pyx", recursive=True)
                        + glob.glob("fastln/**/*.pxd", recursive=True))

# the public C headers: copied into fastln/include/, which fastln.get_include()
# names and the package installs, for extensions that cimport fastln.kernels
PUBLIC_HEADERS = ["src_c/api/fastln.h", "src_c/api/fastln_rnn.h"]

# The C sources name the headers they include from src_c/ ("isa/simd.h"); the
# Cython modules name theirs by file name alone ("fastln.h", "pool.h"), from
# the folders of the public and the Python package's internal headers
# (src_c/api/) and of the run-time ones (src_c/runtime/).
C_INCLUDE_DIRS = ["src_c", "src_c/api", "src_c/runtime"]


def copy_public_headers():
    """Copies PUBLIC_HEADERS into fastln/include/ where they differ."""
    os.makedirs("fastln/include", exist_ok=True)
    for header in PUBLIC_HEADERS:
        target = os.path.join("fastln/include", os.path.basename(header))
        if not (os.path.exists(target) and filecmp.cmp(header, target, shallow=False)):
            shutil.copyfile(header, target)


def openmp_flags(compiler):
    """(compile, link) flags for OpenMP, or None when a test program fails to build."""
    if os.environ.get("FASTLN_NO_OPENMP") == "1":
        return None
    if sys.platform == "darwin":
        candidates = [(["-Xpreprocessor", "-fopenmp"], ["-lomp"]), (["-fopenmp"], ["-fopenmp"])]
    else:
        candidates = [(["-fopenmp"], ["-fopenmp"])]
    src = "#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n"
    for cflags, lflags in candidates:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "omp_probe.c")
            with open(path, "w") as f:
                f.write(src)
            try:
                objs = compiler.compile([path], output_dir=tmp, extra_postargs=cflags)
                compiler.link_executable(objs, "omp_probe", output_dir=tmp,
                                         extra_postargs=lflags)
                return cflags, lflags
            except Exception:
                continue
    return None


def parallel_compile(compiler, jobs):
    """Makes compiler.compile build its sources `jobs` at a time, in the order
    given. setuptools compiles the sources of one extension one after another;
    here the AVX-512 kernels compile beside the Cython module and the other C
    files. It drives the compiler's own _setup_compile and _compile,
    as numpy.distutils did."""
    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def one(obj):
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(one, objects))   # list(): a failed compile raises here
        return objects

    compiler.compile = compile


def current_translation(extension):
    """extension, its .pyx replaced by the C file that Cython wrote from it
    where that file is newer than every one of CYTHON_SOURCES. cythonize
    translates again whenever a .pxd of Cython's or NumPy's is newer than
    the C file, and pip installs those anew in the build environment of each
    `pip install .`; the new C file then has setuptools compile the extension
    again. Without a change to the package's own sources the C file is the
    same but for the paths of that environment."""
    newest = max(os.path.getmtime(path) for path in CYTHON_SOURCES)
    c_files = [src[:-len(".pyx")] + ".c" if src.endswith(".pyx") else src
               for src in extension.sources]
    if all(os.path.exists(c) and os.path.getmtime(c) > newest
           for c, src in zip(c_files, extension.sources) if c != src):
        extension.sources = c_files
    return extension


class BuildExt(build_ext):
    def build_extensions(self):
        # GCC or clang: the kernels use target attributes and __atomic builtins
        cflags = ["-O3", "-fopenmp-simd", "-Wall", "-Wextra"]
        if os.environ.get("FASTLN_DEBUG") != "1":
            cflags.append("-g0")   # after Python's own flags, so it overrides their -g
        if os.environ.get("FASTLN_NATIVE") == "1":
            cflags.append("-march=native")
        omp = openmp_flags(self.compiler)
        if omp is None:
            warnings.warn("fastln: OpenMP was not found; building serial kernels "
                          "(correct, but one thread only)", stacklevel=2)
            lflags = []
        else:
            cflags += omp[0]
            lflags = omp[1]
        for ext in self.extensions:
            ext.extra_compile_args = cflags
            ext.extra_link_args = lflags
        # setuptools compiles an extension again only where a source is newer than it; a
        # build with other flags (the variables above, another compiler) compiles them all
        flags = "\n".join(" ".join(args) for args in
                          (getattr(self.compiler, "compiler_so", []), cflags, lflags))
        stamp, last = os.path.join(self.build_temp, "flags.txt"), None
        if os.path.exists(stamp):
            with open(stamp, encoding="utf-8") as f:
                last = f.read()
        self.force = self.force or last != flags
        jobs = self.parallel if isinstance(self.parallel, int) and self.parallel > 0 \
            else os.cpu_count() or 1
        private = ("_setup_compile", "_get_cc_args", "_compile")   # else: one at a time
        if (jobs > 1 and self.compiler.compiler_type == "unix"      # GCC or clang
                and all(hasattr(self.compiler, name) for name in private)):
            parallel_compile(self.compiler, jobs)
        super().build_extensions()
        os.makedirs(self.build_temp, exist_ok=True)
        with open(stamp, "w", encoding="utf-8") as f:
            f.write(flags)
        if not self.inplace:
            self._copy_into_source_tree()

    def _copy_into_source_tree(self):
        """Also put the built extension in the checkout's package folder, so that
        `python -m fastln` and `python -m pytest` run from the checkout (where
        ./fastln shadows the installed package) import this same build."""
        here = os.path.dirname(os.path.abspath(__file__))
        for ext in self.extensions:
            built = self.get_ext_fullpath(ext.name)
            target = os.path.join(here, *ext.name.split(".")[:-1], os.path.basename(built))
            if os.path.abspath(built) != target and os.access(os.path.dirname(target), os.W_OK):
                self.copy_file(built, target)


ext = Extension(
    "fastln._lib",
    sources=["fastln/_lib.pyx"] + C_SOURCES,
    include_dirs=C_INCLUDE_DIRS + [np.get_include()],
    # NumPy >= 1.22's C API: the allocator interface (PyDataMem_SetHandler)
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                   ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
    depends=C_HEADERS + [C_SOURCES_LIST],   # also puts the list in an sdist
)


def kernel_user(name, depends=()):
    """An extension that compiles no C of its own: it calls the kernels of
    fastln._lib through the functions that fastln/_lib.pxd declares."""
    return Extension(
        name,
        sources=[name.replace(".", "/") + ".pyx"],
        include_dirs=C_INCLUDE_DIRS + [np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                       ("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
        depends=["fastln/_lib.pxd", "fastln/_ndarray.pxd", *depends],
    )


# the kernels on canonical arrays, the public functions over them, and the
# recurrent engine's binding
users = [kernel_user("fastln._rows"),
         kernel_user("fastln._norms", ["fastln/_rows.pxd"]),
         kernel_user("fastln._add_norms", ["fastln/_rows.pxd", "fastln/_norms.pxd"]),
         kernel_user("fastln.rnn._engine", PUBLIC_HEADERS)]

copy_public_headers()
setup(
    ext_modules=cythonize([current_translation(e) for e in (ext, *users)], language_level=3),
    cmdclass={"build_ext": BuildExt},
    # PEP 561: the stubs of the compiled module and the marker that the package is typed
    # the Cython declarations (cimport fastln.kernels) and the C headers they need
    package_data={"fastln": ["py.typed", "*.pyi", "*.pxd", "include/*.h"],
                  "fastln.rnn": ["*.pyi"]},
)
