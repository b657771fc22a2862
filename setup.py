"""Builds the Cython extensions.

FASTLIMIT_DEBUG=1 builds the debug variant: C assertions and Cython's
bounds checks on, line tracing compiled in, no optimisation.  The test
suite runs against both variants (see scripts/test.sh).
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("FASTLIMIT_DEBUG", "") not in ("", "0")
MODULES = [m for m in ["_core", "_resp", "_rules", "_protocol", "_cluster", "_http"] if os.path.exists(f"src/fastlimit/{m}.pyx")]

if DEBUG:
    compile_args = ["-O0", "-g3", "-UNDEBUG"]
    macros = [("CYTHON_TRACE_NOGIL", "1"), ("FL_DEBUG", "1")]
    directives = {"boundscheck": True, "wraparound": False, "linetrace": True,
                  "initializedcheck": True}
else:
    compile_args = ["-O3", "-DNDEBUG"]
    macros = [("CYTHON_WITHOUT_ASSERTIONS", "1")]
    directives = {"boundscheck": False, "wraparound": False,
                  "initializedcheck": False}
# C division everywhere: the engine never divides negative numbers, and
# Cython's Python-semantics helpers would truncate its 128-bit values.
directives.update(language_level=3, embedsignature=True, cdivision=True)

extensions = [
    Extension(
        f"fastlimit.{name}",
        [f"src/fastlimit/{name}.pyx"],
        include_dirs=["src/fastlimit"],
        extra_compile_args=compile_args,
        define_macros=macros,
    )
    for name in MODULES
]

# Each variant builds in its own tree (generated C, objects, libraries),
# so neither ever reuses the other's output as "up to date".
VARIANT_DIR = "build/debug" if DEBUG else "build/release"
# The modules are independent: translate and compile them side by side.
JOBS = os.cpu_count() or 1
setup(ext_modules=cythonize(extensions, compiler_directives=directives, nthreads=JOBS,
                            include_path=["src"], build_dir=f"{VARIANT_DIR}/cython"),
      options={"build": {"build_base": VARIANT_DIR}, "build_ext": {"parallel": JOBS}})
