"""The native column reader (``koordlet/system/_colread.c``), built where a C compiler is found;
everything else about the package is in pyproject.toml.

It is a plain C library loaded with ctypes (``koordlet.system.nativeread``), not an extension
module: it uses no Python API, and its file is named ``_colread.so.1`` so that nothing takes it
for a module to import (walking the package imports every module). ``optional=True``: without a
compiler the build goes on without it, and the koordlet reads those columns in Python, with the
same values. ``-g0``: no debug information, so no build folder's path in the file, and a rebuild
is the same bytes (the image's rebuild from its cache is checked to be the same image).
"""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "koordlet.system._colread"
NATIVE_FILE = "_colread.so.1"  # koordlet.system.nativeread.LIBRARY_FILE


class BuildExt(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        # asked with the dotted name (setuptools) or with its last part only (distutils)
        if fullname == NATIVE:
            return os.path.join(*NATIVE.split(".")[:-1], NATIVE_FILE)
        if fullname == NATIVE.rpartition(".")[2]:
            return NATIVE_FILE
        return str(super().get_ext_filename(fullname))


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            NATIVE,
            sources=["koordlet/system/_colread.c"],
            extra_compile_args=["-O2", "-g0", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        )
    ],
)
