# cython: language_level=3
"""Message parsing: every mpi4py buffer-message form turned into what the
pool needs (address, count, element type) or `None` for "not mine".

Mirrors mpi4py's own rules (mpi4py/MPI.src/msgbuffer.pxi, message_simple) so
that a message means here exactly what it means to stock mpi4py: a buffer
alone; ``[buf, datatype]``; ``[buf, count]``; ``[buf, count, datatype]``;
``[buf, (count, displ), datatype]``; ``[buf, count, displ, datatype]``; a
datatype may be an MPI.Datatype or a typecode string.  Where stock mpi4py
would raise on a message, `parse` returns `None` so that the caller passes
the call to mpi4py and the user sees mpi4py's own exception.  The one case
where stock would go on and corrupt memory (an explicit count larger than the
buffer) raises `ValueError` here before any memory is touched.
"""

from cpython.buffer cimport (PyObject_CheckBuffer, PyObject_GetBuffer,
                             PyBuffer_Release, PyBUF_ANY_CONTIGUOUS,
                             PyBUF_WRITABLE, PyBUF_FORMAT)
from libc.stdint cimport uintptr_t

# Filled by cxlmpi.dispatch at import: MPI datatype handle -> (tcode, size),
# typecode string -> MPI datatype, and the MPI objects we compare against.
cdef dict TYPE_INFO = {}
cdef dict TYPE_DICT = {}
cdef object DATATYPE = None
cdef object BYTE = None
cdef object BOTTOM = None


def configure(type_info, type_dict, datatype_class, byte, bottom):
    """Install the datatype tables (called once by cxlmpi.dispatch)."""
    global TYPE_INFO, TYPE_DICT, DATATYPE, BYTE, BOTTOM
    TYPE_INFO = dict(type_info)
    TYPE_DICT = dict(type_dict)
    DATATYPE = datatype_class
    BYTE = byte
    BOTTOM = bottom


cdef class Message:
    """A parsed message; holds the buffer until `release()` (or deletion)."""
    cdef Py_buffer view
    cdef bint held
    cdef readonly uintptr_t address
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t itemsize
    cdef readonly int tcode
    cdef readonly object datatype

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)

    def release(self):
        """Give the buffer back to its owner."""
        if self.held:
            PyBuffer_Release(&self.view)
            self.held = False

    @property
    def nbytes(self):
        """Bytes of the message (count x element size)."""
        return self.count * self.itemsize

    @property
    def buffer_nbytes(self):
        """Bytes of the whole underlying buffer from `address` on."""
        return self.view.len - (self.address - <uintptr_t>self.view.buf)

    @property
    def readonly(self):
        return bool(self.view.readonly)


cdef inline object lookup_type(object o_type):
    if isinstance(o_type, str):
        return TYPE_DICT.get(o_type)
    if isinstance(o_type, DATATYPE):
        return o_type
    return None


def parse(object msg, bint writable):
    """Return a `Message` for `msg`, or None when the pool cannot take it
    (an unsupported datatype, a GPU buffer, MPI.BOTTOM, or a message stock
    mpi4py rejects)."""
    cdef object o_buf = None, o_count = None, o_displ = None, o_type = None
    cdef Py_ssize_t nargs
    if PyObject_CheckBuffer(msg):
        o_buf = msg
    elif isinstance(msg, (list, tuple)):
        nargs = len(msg)
        if nargs == 2:
            o_buf, o_count = msg
            if isinstance(o_count, (str, DATATYPE)):
                o_count, o_type = None, o_count
            elif isinstance(o_count, (list, tuple)):
                if len(o_count) != 2:
                    return None
                o_count, o_displ = o_count
        elif nargs == 3:
            o_buf, o_count, o_type = msg
            if isinstance(o_count, (list, tuple)):
                if len(o_count) != 2:
                    return None
                o_count, o_displ = o_count
        elif nargs == 4:
            o_buf, o_count, o_displ, o_type = msg
        else:
            return None
    else:
        return None
    if o_buf is None or o_buf is BOTTOM or not PyObject_CheckBuffer(o_buf):
        return None

    cdef Message m = Message.__new__(Message)
    cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(o_buf, &m.view, flags)
    except Exception:
        return None
    m.held = True

    cdef object dtype
    if o_type is None:
        fmt = m.view.format.decode() if m.view.format != NULL else "B"
        if fmt == "B":
            dtype = BYTE
        else:
            if fmt[:1] in ("<", "@", "="):
                fmt = fmt[1:]
            dtype = TYPE_DICT.get(fmt)
    else:
        dtype = lookup_type(o_type)
    if dtype is None:
        return None
    info = TYPE_INFO.get(dtype.handle)
    if info is None:
        return None
    m.datatype = dtype
    m.tcode, m.itemsize = info

    cdef Py_ssize_t length = m.view.len, offset = 0, count, displ
    try:
        if o_displ is not None:
            displ = o_displ.__index__()
            if displ < 0 or displ * m.itemsize > length:
                return None
            offset = displ * m.itemsize
            length -= offset
        if o_count is not None:
            count = o_count.__index__()
            if count < 0:
                return None
        else:
            if length % m.itemsize:
                return None
            count = length // m.itemsize
    except (TypeError, AttributeError, OverflowError):
        return None
    if count * m.itemsize > length:
        raise ValueError(
            f"message: count {count} of {dtype.Get_name()} needs "
            f"{count * m.itemsize} bytes but the buffer holds {length}")
    m.address = <uintptr_t>m.view.buf + offset
    m.count = count
    return m
