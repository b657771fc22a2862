"""Builds the Cython extensions.

FASTLIMIT_DEBUG=1 builds the debug variant: C assertions and Cython's
bounds checks on, line tracing compiled in, no optimisation.  The test
suite runs against both variants (see scripts/test.sh).

FASTLIMIT_FUZZ=1 builds the fuzzing variant: the debug variant compiled
by clang (CC=clang-14, LDSHARED="clang-14 -shared", set by
scripts/bootstrap.sh --fuzz) with AddressSanitizer and libFuzzer's edge
counters, so that atheris sees the C code's coverage (tests/fuzz/).
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

FUZZ = os.environ.get("FASTLIMIT_FUZZ", "") not in ("", "0")
DEBUG = FUZZ or os.environ.get("FASTLIMIT_DEBUG", "") not in ("", "0")
MODULES = [m for m in ["_core", "_hotkeys", "_load", "_resp", "_rules", "_rls", "_protocol", "_cluster", "_http", "_grpc", "_windows", "_tls"] if os.path.exists(f"src/fastlimit/{m}.pyx")]

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
# The objects and the link: the runtime (ASan with libFuzzer linked in) is
# atheris's asan_with_fuzzer.so, which tests/fuzz/harness.py preloads.
SANITIZE = ["-fsanitize=address,fuzzer-no-link"] if FUZZ else []
# -O1 after the debug flags' -O0: what ASan is meant to run at, some seven times
# faster here than -O0 (the protocol target), with the same assertions and checks.
FUZZ_OPT = ["-O1"] if FUZZ else []
# The C libraries an extension links besides Python's: the gRPC front's
# HTTP/2 is libnghttp2 (Debian's libnghttp2-dev).
LIBRARIES = {"_grpc": ["nghttp2"], "_tls": ["ssl", "crypto"]}
# C division everywhere: the engine never divides negative numbers, and
# Cython's Python-semantics helpers would truncate its 128-bit values.
directives.update(language_level=3, embedsignature=True, cdivision=True)

extensions = [
    Extension(
        f"fastlimit.{name}",
        [f"src/fastlimit/{name}.pyx"],
        include_dirs=["src/fastlimit"],
        extra_compile_args=compile_args + SANITIZE + FUZZ_OPT,
        extra_link_args=SANITIZE,
        define_macros=macros,
        libraries=LIBRARIES.get(name, []),
    )
    for name in MODULES
]

# Each variant builds in its own tree (generated C, objects, libraries),
# so neither ever reuses the other's output as "up to date".
VARIANT_DIR = "build/fuzz" if FUZZ else "build/debug" if DEBUG else "build/release"
# The modules are independent: translate and compile them side by side.
JOBS = os.cpu_count() or 1
setup(ext_modules=cythonize(extensions, compiler_directives=directives, nthreads=JOBS,
                            include_path=["src"], build_dir=f"{VARIANT_DIR}/cython"),
      options={"build": {"build_base": VARIANT_DIR}, "build_ext": {"parallel": JOBS}})
