"""Build the compiled parts of cxlmpi (pyx/ -> cxlmpi._pool, cxlmpi._shim).

The extensions use no MPI header and link no MPI library: MPI calls go through
mpi4py, or for small calls that pass through, to the functions of the library
mpi4py loaded, found at run time (pyx/cxl_mpi.h); one build works with MPICH,
Open MPI or any other MPI.
"""

import glob

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

COMPILE_ARGS = ["-O3", "-fno-strict-aliasing", "-Wno-unused-function"]

extensions = [
    Extension("cxlmpi._pool", ["pyx/_pool.pyx"], include_dirs=["pyx"],
              extra_compile_args=COMPILE_ARGS,
              depends=["pyx/cxl_kernels.h", "pyx/cxl_emulate.h", "pyx/cxl_alloc.h",
                       "pyx/cxl_alloc.pxd", "pyx/cxl_layout.h", "pyx/cxl_lock.h",
                       "pyx/cxl_codes.h", "pyx/codes.pxi", *glob.glob("pyx/pool/*.pxi")]),
    Extension("cxlmpi._shim", ["pyx/_shim.pyx"], include_dirs=["pyx"],
              extra_compile_args=COMPILE_ARGS,
              depends=["pyx/cxl_mpi.h", "pyx/cxl_codes.h", "pyx/codes.pxi",
                       *glob.glob("pyx/shim/*.pxi")]),
    # The NumPy allocation hook (NEP 49): the only part built against NumPy.
    Extension("cxlmpi._alloc", ["pyx/_alloc.pyx"], include_dirs=["pyx", numpy.get_include()],
              define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
              extra_compile_args=COMPILE_ARGS, depends=["pyx/cxl_alloc.h", "pyx/cxl_alloc.pxd"]),
]

setup(ext_modules=cythonize(extensions, language_level=3, include_path=["pyx"],
                            compiler_directives={"embedsignature": True}))
