"""Builds the one compiled module: the PJRT C API boundary."""
from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("jax_ipu.pjrt._capi", ["src/jax_ipu/pjrt/_capi.pyx"], include_dirs=["src/jax_ipu/pjrt"],
               extra_compile_args=["-O2"])],
    compiler_directives={"language_level": 3},
))
