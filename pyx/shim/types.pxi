# Type tables: MPI datatypes and ops as the pool's kernels know them (type
# and op codes of cxlmpi._pool), found by object address before any handle
# is read; predefined datatypes without a kernel moved as their bytes.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


# MPI datatype handle -> (type code, size, handle); code -1: data movement only.
cdef dict TYPE_INFO = {}
# The same, keyed by the address of mpi4py's predefined datatype objects
# (MPI.DOUBLE; the typecode table's are the same objects), kept alive here:
# a message's type found without reading its .handle (a Python property).
cdef dict TYPE_OF = {}
cdef list _TYPE_OBJECTS = []
# typecode string -> MPI datatype (mpi4py's own table)
cdef dict TYPE_DICT = dict(MPI._typedict)
# MPI op handle -> op code; by the address of mpi4py's predefined op objects
# (MPI.SUM, kept alive in OP_CODES' names) -> (op code, handle).
cdef dict OPS = {getattr(MPI, name).handle: code for name, code in OP_CODES.items()}
cdef dict OPS_OF = {}


def _add_ops():
    for name, code in OP_CODES.items():
        op = getattr(MPI, name)   # (a module constant: it lives as long as mpi4py)
        OPS_OF[<Py_ssize_t><void *>op] = (code, op.handle)


_add_ops()

MOVE_ONLY = -1
_SIGNED = ("SIGNED_CHAR", "SHORT", "INT", "LONG", "LONG_LONG", "INT8_T",
           "INT16_T", "INT32_T", "INT64_T", "AINT", "OFFSET", "COUNT")
_UNSIGNED = ("UNSIGNED_CHAR", "UNSIGNED_SHORT", "UNSIGNED", "UNSIGNED_LONG",
             "UNSIGNED_LONG_LONG", "UINT8_T", "UINT16_T", "UINT32_T",
             "UINT64_T")
_FLOAT = ("FLOAT", "DOUBLE")
_COMPLEX = ("C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX")
_OPAQUE = ("CHAR", "WCHAR")  # text: no reduction is defined on it


def _add_types(names, prefix):
    for name in names:
        dtype = getattr(MPI, name, None)
        if dtype is None or dtype == MPI.DATATYPE_NULL:
            continue
        size = dtype.Get_size()
        if prefix is None:
            code = MOVE_ONLY
        else:
            code = TYPE_CODES.get(f"{prefix}{size * 8}", MOVE_ONLY)
        _add_type(dtype, code, size)


def _add_type(dtype, code, size):
    # (the handle as the C field holds it: MPICH's handles of some
    # predefined types, MPI.FLOAT_INT's, are beyond a Py_ssize_t)
    info = (code, size, <Py_ssize_t><uintptr_t>dtype.handle)
    TYPE_INFO[dtype.handle] = TYPE_OF[<Py_ssize_t><void *>dtype] = info
    _TYPE_OBJECTS.append(dtype)


_add_types(_SIGNED, "i")
_add_types(_UNSIGNED, "u")
_add_types(_FLOAT, "f")
_add_types(_COMPLEX, "c")
_add_types(_OPAQUE, None)
if MPI.C_BOOL.Get_size() == 1:
    _add_type(MPI.C_BOOL, TYPE_CODES["bool"], 1)
_add_type(MPI.BYTE, TYPE_CODES["byte"], 1)


cdef inline tuple type_info(object dtype):
    """(type code, size, handle) of an MPI datatype the pool knows, or None."""
    info = TYPE_OF.get(<Py_ssize_t><void *>dtype)
    if info is None:
        info = TYPE_INFO.get(dtype.handle)
        if info is None and dtype.handle not in NOT_MOVED:
            info = moved_as_bytes(dtype)
    return info


# Handles of datatypes `moved_as_bytes` turned down.
cdef set NOT_MOVED = set()


cdef tuple moved_as_bytes(object dtype):
    """type_info of a predefined datatype without a kernel (MPI.PACKED,
    long double, Fortran's, pairs of no padding): moved as its bytes, as
    MPI moves a contiguous run of them, where its elements are exactly
    their size apart; None for any other (remembered).  A rank that sent
    such a message to MPI alone left its peers in the pool's set-up, or
    across pool groups in the leaders' MPI step, for ever."""
    info = None
    try:
        if isinstance(dtype, _DATATYPE) and dtype.is_predefined:
            size = dtype.Get_size()
            if size > 0 and dtype.Get_extent() == (0, size) and \
                    dtype.Get_true_extent() == (0, size):
                _add_type(dtype, MOVE_ONLY, size)
                info = TYPE_INFO[dtype.handle]
    except MPI.Exception:
        pass
    if info is None:
        NOT_MOVED.add(dtype.handle)
    return info


cpdef object op_code(object op):
    """Kernel op code of a predefined MPI op, or None (user-defined ops,
    MINLOC/MAXLOC, REPLACE and NO_OP pass through)."""
    info = op_info(op)
    return None if info is None else info[0]


cdef inline tuple op_info(object op):
    """(op code, handle) of a predefined MPI op, or None."""
    info = OPS_OF.get(<Py_ssize_t><void *>op)
    if info is None and isinstance(op, _OP):
        code = OPS.get(op.handle)
        if code is not None:
            info = (code, op.handle)
    return info
