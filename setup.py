"""The native column reader (``koordlet/system/_colread.c``), built where a C compiler is found;
everything else about the package is in pyproject.toml.

It is a plain C library, loaded with ctypes (``koordlet.system.nativeread``), not an extension
module: it uses no Python API. ``optional=True``: without a compiler the build goes on without
it, and the koordlet reads those columns in Python, with the same values.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "koordlet.system._colread",
            sources=["koordlet/system/_colread.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
