# Message parsing: every message form mpi4py accepts, read by mpi4py's own
# rules (mpi4py/MPI.src/msgbuffer.pxi, message_simple and message_vector;
# the model of this file), so that a message means here exactly what it
# means to stock mpi4py.  One entry per kind of message:
#
#   message(msg, writable, blocks, least, stage)   a plain message:
#       buf                                 (a buffer: its format names the type)
#       [buf, datatype]       [buf, count]  [buf, count, datatype]
#       [buf, (count, displ), datatype]     [buf, count, displ, datatype]
#       [None or MPI.BOTTOM, 0, datatype]   (a rank that moves nothing)
#     a datatype is an MPI.Datatype or a typecode string; with `blocks` (the
#     buffer holds one block per rank, as a Gather's receive buffer does)
#     `count` is one block's.  Where the pool cannot read it in place (a
#     derived datatype, MPI.BOTTOM, a device array: `stage` says which) it
#     is staged (staging.pxi); a DLPack array in host memory is read in
#     place.
#   vector(msg, writable, blocks, staged)           a vector message:
#       buf   [buf, counts]   [buf, (counts, displs)]   [buf, counts, datatype]
#       [buf, (counts, displs), datatype]   [buf, counts, displs, datatype]
#     counts: one int for every block, or one per block (none: the elements
#     split evenly); displs: one per block, one int (the stride), or none
#     (the blocks one after the other); `staged`: a receive vector of a
#     derived datatype or in a device array is staged.
#   read_counts(value, blocks)                      Reduce_scatter's counts
#
# Where stock mpi4py would raise on a message, the entries return None, so
# that the call passes through and the user sees mpi4py's own exception.
# The one case where stock would go on and corrupt memory (an explicit
# count larger than the buffer, a block outside it, receive blocks that
# overlap) is parsed as its counts say and refused (refusals.pxi).
# `aliased` tells whether a call's two messages share memory.  unpack,
# lookup_type, format_type and read_layout are shared with staging.pxi,
# format_entry and BYTE_FORMAT with direct.pxi (which reads a bare buffer's
# type as `message` does); the other helpers, whose names begin with _, are
# this file's own.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


@cython.no_gc   # (it refers to no object that could refer back to it)
cdef class Message:
    """A parsed message; holds the buffer while it lives."""
    cdef Py_buffer view
    cdef bint held
    cdef readonly uintptr_t address
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t itemsize
    cdef readonly Py_ssize_t nbytes  # count x itemsize
    cdef readonly int tcode
    cdef readonly object datatype
    cdef readonly Py_ssize_t handle   # the datatype's MPI handle
    # A staged message (see `staged_message`): (temporary buffer, its datatype,
    # [(the user's message, byte offset, elements), ...]); None otherwise.
    cdef object staged
    # The user's memory the message reaches, [lo, hi) (a staged message's,
    # not the temporary's; a vector's from its first block to its last):
    # a call's two messages must not share any (`aliased`).
    cdef uintptr_t lo, hi
    # A refused message (see above): its scratch copy, which reaches as far
    # as its counts say, and the user's bytes as they were (a receive
    # message's: what a call that wrote the scratch copies back).
    cdef object scratch, before
    cdef uintptr_t scratch_at

    def __dealloc__(self):
        if self.scratch is not None and self.before is not None:
            copy_back(self)
        if self.held:
            PyBuffer_Release(&self.view)


cdef inline object lookup_type(object o_type):
    if isinstance(o_type, str):
        return TYPE_DICT.get(o_type)
    if isinstance(o_type, _DATATYPE):
        return o_type
    return None


cdef tuple unpack(object msg, bint vector, bint device=False, bint bottom=False):
    """(buf, count(s), displ(s), datatype) of a message, as mpi4py reads
    it, or None for a form it rejects or the pool cannot take (`device`:
    a device array's may be taken, see staging.pxi; `bottom`: MPI.BOTTOM's
    or None's with a count, see staging.pxi and `_empty`)."""
    cdef object o_buf = None, o_count = None, o_displ = None, o_type = None
    cdef Py_ssize_t nargs
    if PyObject_CheckBuffer(msg) or (device and _device_array(msg)):
        return (msg, None, None, None)
    if not isinstance(msg, (list, tuple)):
        return None
    nargs = len(msg)
    # the vector form reads a tuple as (counts, displs), a list as counts
    pair = tuple if vector else (list, tuple)
    if nargs == 2:
        o_buf, o_count = msg
        if isinstance(o_count, (str, _DATATYPE)):
            o_count, o_type = None, o_count
        elif isinstance(o_count, pair):
            if len(o_count) != 2:
                return None
            o_count, o_displ = o_count
    elif nargs == 3:
        o_buf, o_count, o_type = msg
        if isinstance(o_count, pair):
            if len(o_count) != 2:
                return None
            o_count, o_displ = o_count
    elif nargs == 4:
        o_buf, o_count, o_displ, o_type = msg
    else:
        return None
    if (o_buf is _BOTTOM or o_buf is None) and bottom and o_count is not None:
        return (o_buf, o_count, o_displ, o_type)
    if o_buf is None or o_buf is _BOTTOM or not (
            PyObject_CheckBuffer(o_buf) or (device and _device_array(o_buf))):
        return None
    return (o_buf, o_count, o_displ, o_type)


cdef inline bint _device_array(object obj):
    """Whether mpi4py reads `obj` as a device array (no buffer protocol:
    __cuda_array_interface__ or DLPack), memory the pool cannot read."""
    return not PyObject_CheckBuffer(obj) and (
        hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__"))


cdef object format_type(str fmt):
    """The MPI datatype mpi4py reads from a buffer format, or None (uint8,
    "B", is MPI_UNSIGNED_CHAR, every op defined on it: not MPI_BYTE)."""
    if fmt[:1] in ("<", "@", "="):
        fmt = fmt[1:]
    return TYPE_DICT.get(fmt)


# Buffer format -> the datatype mpi4py reads from it (`format_type`): its
# handle, size and type code, and the datatype object (one of mpi4py's
# predefined ones, alive as long as mpi4py); size 0: not a type the shim
# takes.  A few formats ever occur; looked up without building a string.
DEF NFMT = 16
cdef struct fmt_entry:
    char fmt[8]
    Py_ssize_t handle
    Py_ssize_t size
    int tcode
    PyObject *dtype
cdef fmt_entry _fmts[NFMT]
cdef int _nfmts = 0
cdef const char *BYTE_FORMAT = "B"   # a buffer without a format holds bytes


cdef fmt_entry *format_entry(const char *fmt):
    """The entry of format `fmt`, made on its first sight; NULL when the
    table is full or the format long (then the caller reads it itself)."""
    global _nfmts
    cdef int i
    for i in range(_nfmts):
        if strcmp(_fmts[i].fmt, fmt) == 0:
            return &_fmts[i]
    if strlen(fmt) >= 8 or _nfmts == NFMT:
        return NULL
    dtype = format_type(fmt.decode())
    info = type_info(dtype) if dtype is not None else None
    cdef fmt_entry *e = &_fmts[_nfmts]
    strcpy(e.fmt, fmt)
    e.size = 0
    if info is not None:
        _TYPE_OBJECTS.append(dtype)   # (kept alive: the entry borrows it)
        e.tcode, e.size, e.handle = info
        e.dtype = <PyObject *>dtype
    _nfmts += 1
    return e


cdef Message _get_buffer(object o_buf, object o_type, bint writable):
    """The buffer and element type of a message, or None."""
    cdef Message m = Message.__new__(Message)
    cdef int flags = PyBUF_ANY_CONTIGUOUS | PyBUF_FORMAT
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(o_buf, &m.view, flags)
    except Exception:
        return None
    m.held = True
    m.lo = <uintptr_t>m.view.buf
    m.hi = m.lo + <size_t>m.view.len
    cdef object dtype
    cdef fmt_entry *e
    if o_type is None:
        e = format_entry(<const char *>m.view.format if m.view.format != NULL
                         else BYTE_FORMAT)
        if e != NULL:
            if e.size == 0:
                return None
            m.datatype = <object>e.dtype
            m.tcode, m.itemsize, m.handle = e.tcode, e.size, e.handle
            m.address = <uintptr_t>m.view.buf
            return m
        dtype = format_type(m.view.format.decode() if m.view.format != NULL else "B")
    else:
        dtype = lookup_type(o_type)
    if dtype is None:
        return None
    info = type_info(dtype)
    if info is None:
        return None
    m.datatype = dtype
    m.tcode, m.itemsize, m.handle = info
    m.address = <uintptr_t>m.view.buf
    return m


cdef Message _parse_typed(object o_buf, object dtype, tuple info, bint writable, int blocks):
    """`_parse` of the commonest list form, ``[buf, MPI.DOUBLE]`` (a
    predefined datatype object, `info` its type_info): no format to read,
    the count inferred from the length, as mpi4py infers it."""
    if o_buf is None or o_buf is _BOTTOM or not PyObject_CheckBuffer(o_buf):
        return None
    cdef Message m = Message.__new__(Message)
    try:
        PyObject_GetBuffer(o_buf, &m.view,
                           PyBUF_ANY_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0))
    except Exception:
        return None
    m.held = True
    m.lo = <uintptr_t>m.view.buf
    m.hi = m.lo + <size_t>m.view.len
    m.datatype = dtype
    m.tcode, m.itemsize, m.handle = info
    cdef Py_ssize_t n = m.view.len // m.itemsize, nblocks = blocks if blocks > 1 else 1
    if m.view.len % m.itemsize or n % nblocks:
        return None   # stock reports it (cannot infer the count)
    m.address = <uintptr_t>m.view.buf
    m.count = n // nblocks
    m.nbytes = m.count * m.itemsize
    return m


cdef Message _parse(object msg, bint writable, int blocks=0):
    """A `Message` for `msg`, or None when the pool cannot take it (an
    unsupported datatype, a GPU buffer, MPI.BOTTOM, or a message that stock
    mpi4py rejects).  With `blocks` (the buffer holds one block per rank, as
    a Gather's receive buffer does), `count` is the count of one block."""
    if (type(msg) is list or type(msg) is tuple) and len(msg) == 2:
        info = TYPE_OF.get(<Py_ssize_t><void *>msg[1])
        if info is not None:
            return _parse_typed(msg[0], msg[1], info, writable, blocks)
    parts = unpack(msg, False)
    if parts is None:
        return None
    o_buf, o_count, o_displ, o_type = parts
    cdef Message m = _get_buffer(o_buf, o_type, writable)
    if m is None:
        return None
    cdef Py_ssize_t length = m.view.len, offset = 0, count, displ
    cdef Py_ssize_t nblocks = blocks if blocks > 1 else 1
    try:
        if o_displ is not None:
            displ = o_displ.__index__()
            if displ < 0:
                return None
            # Compared in elements: displ x itemsize may wrap around.
            if displ > length // m.itemsize:
                if displ <= PY_SSIZE_T_MAX // m.itemsize:
                    return None  # stock reports it (displacement out of bounds)
                # stock's own check wraps around here: refuse it
                raise outside_error(f"displacement {displ} of {m.datatype.Get_name()}",
                                    int(displ) * m.itemsize, length)
            offset = displ * m.itemsize
            length -= offset
        if o_count is not None:
            count = o_count.__index__()
            if count < 0:
                return None
        else:
            if length % m.itemsize or (length // m.itemsize) % nblocks:
                return None
            count = length // m.itemsize // nblocks
    except (TypeError, AttributeError, OverflowError):
        return None
    # In elements, never in bytes: count x nblocks x itemsize may wrap around
    # (2**61 + 1024 doubles "need" 8 KiB in 64 bits).
    if count > length // m.itemsize // nblocks:
        err = outside_error(f"{nblocks} x {count} of {m.datatype.Get_name()}",
                            int(nblocks) * int(count) * m.itemsize, length)
        if count > (PY_SSIZE_T_MAX - offset) // m.itemsize // nblocks:
            raise err   # (more bytes than memory holds)
        to_scratch(m, offset + count * nblocks * m.itemsize, err, writable)
    m.address += offset
    m.count = count
    m.nbytes = count * m.itemsize
    m.lo = m.address
    m.hi = m.lo + <size_t>(count * nblocks * m.itemsize)
    return m


DEF VECTOR_INLINE = 8   # blocks a Vector holds without an allocation


@cython.no_gc   # (as Message)
cdef class Vector:
    """A parsed vector message (``[buf, counts, displs, type]`` and the
    shorter forms, as mpi4py reads them): its buffer (`m`, whose count is
    the sum of the counts) and the counts and displacements in elements, as
    C arrays -- `ints` when every one fits a C int, as MPI's functions take
    them.  Holds the buffer while it lives."""
    cdef readonly Message m
    cdef Py_ssize_t blocks
    cdef Py_ssize_t *counts
    cdef Py_ssize_t *displs
    cdef int *icounts
    cdef int *idispls
    cdef Py_ssize_t largest   # the largest count
    cdef bint ints
    cdef char *block          # the four arrays: `inline`, or allocated
    cdef Py_ssize_t inline[VECTOR_INLINE * 3]   # (2 Py_ssize_t and 2 ints a block)

    def __dealloc__(self):
        if self.block != <char *>self.inline:
            PyMem_Free(self.block)

    cdef int alloc(self, Py_ssize_t blocks) except -1:
        cdef char *block = <char *>self.inline
        if blocks > VECTOR_INLINE:
            block = <char *>PyMem_Malloc(blocks * (2 * sizeof(Py_ssize_t) + 2 * sizeof(int)))
            if block == NULL:
                raise MemoryError()
        self.block = block
        self.blocks = blocks
        self.counts = <Py_ssize_t *>block
        self.displs = self.counts + blocks
        self.icounts = <int *>(self.displs + blocks)
        self.idispls = self.icounts + blocks
        return 0

    cdef list count_list(self):
        return [self.counts[i] for i in range(self.blocks)]

    cdef list displ_list(self):
        return [self.displs[i] for i in range(self.blocks)]


cdef int _read_ints(object value, Py_ssize_t blocks, Py_ssize_t *out,
                    bint scalar=True) except -1:
    """`blocks` ints from an int (where `scalar` allows one) or a sequence
    of them into `out`: 1, or 0 when `value` is not that (mpi4py reports
    it); ValueError on a length that is not `blocks`.  Read as mpi4py reads
    it, by len() and [i] (a dict {0: 1, 1: 2} is [1, 2]; a generator has no
    length)."""
    cdef Py_ssize_t i, n
    cdef object item
    try:
        if type(value) is not list and type(value) is not tuple:
            if scalar and _is_integral(value):
                n = value.__index__()
                for i in range(blocks):
                    out[i] = n
                return 1
        n = len(value)
        if n != blocks:
            raise ValueError(f"message: expecting {blocks} items, got {n}")
        for i in range(n):
            item = value[i]
            out[i] = PyLong_AsSsize_t(item) if type(item) is int else item.__index__()
    except (TypeError, AttributeError, OverflowError):
        return 0
    return 1


cdef inline bint _is_integral(object value):
    """An int-like count or displacement (mpi4py's test), not a sequence."""
    return type(value) is int or (hasattr(value, "__index__") and
                                  not hasattr(value, "__len__"))


cdef Vector _read_vector(object msg, bint writable, int blocks):
    """`vector`, without staging."""
    parts = unpack(msg, True)
    if parts is None:
        return None
    o_buf, o_counts, o_displs, o_type = parts
    cdef Message m = _get_buffer(o_buf, o_type, writable)
    if m is None:
        return None
    cdef Vector v = Vector.__new__(Vector)
    v.m = m
    v.alloc(blocks)
    cdef Py_ssize_t length = m.view.len // m.itemsize, total, acc, i, c, d
    if (o_counts is None and m.view.len % m.itemsize) or \
            not read_layout(v, o_counts, o_displs, length, blocks):
        return None
    # Compared in elements, never summed beyond `length`: nothing wraps around.
    cdef bint ordered = True
    cdef Py_ssize_t first = length, end = 0   # the blocks' reach
    total = acc = 0
    v.largest = 0
    v.ints = True
    outside = None
    for i in range(blocks):
        c, d = v.counts[i], v.displs[i]
        if c < 0 or d < 0 or d > length or c > length - d:
            from .errors import CXLMPIMessageError

            err = CXLMPIMessageError(
                f"message: block {i} (displacement {d}, count {c}) runs outside "
                f"a buffer of {length} elements")
            if c < 0 or d < 0 or c > PY_SSIZE_T_MAX // m.itemsize - d:
                raise err
            outside = outside or err
        if c > v.largest:
            v.largest = c
        if c > INT_MAX or d > INT_MAX:
            v.ints = False
        else:
            v.icounts[i], v.idispls[i] = <int>c, <int>d
        if total > PY_SSIZE_T_MAX // m.itemsize - c:
            from .errors import CXLMPIMessageError

            raise CXLMPIMessageError(
                f"message: more than {total} elements of {m.datatype.Get_name()} "
                f"in all: more bytes than a buffer can hold")
        total += c
        if c and d < acc:
            ordered = False
        if c:
            acc = d + c
            first = min(first, d)
            end = max(end, d + c)
    if outside is not None:
        to_scratch(m, end * m.itemsize, outside, writable)
    if writable and not ordered:
        spans = []   # (a loop, not a generator: no closure scope on every call)
        for i in range(blocks):
            if v.counts[i] > 0:
                spans.append((v.displs[i], v.displs[i] + v.counts[i]))
        spans.sort()
        for i in range(1, len(spans)):
            if spans[i][0] < spans[i - 1][1]:
                from .errors import CXLMPIMessageError

                note_refusal(CXLMPIMessageError(
                    f"message: receive blocks overlap at element {spans[i][0]}"))
                break
    m.count = total   # (blocks of a send buffer may overlap: up to blocks x length)
    m.nbytes = total * m.itemsize
    m.lo = m.address + <size_t>(min(first, end) * m.itemsize)
    m.hi = m.address + <size_t>(end * m.itemsize)
    return v


cdef int read_layout(Vector v, object o_counts, object o_displs, Py_ssize_t length,
                     Py_ssize_t blocks) except -1:
    """A vector message's counts and displacements into `v`, as mpi4py
    reads them from a buffer of `length` elements: none given, the elements
    split evenly, one after the other; a displacement given as one int,
    the stride between blocks.  1, or 0 for what mpi4py would refuse."""
    cdef Py_ssize_t i, acc, d
    if o_counts is None:
        for i in range(blocks):
            v.counts[i] = length // blocks + (length % blocks > i)
    elif not _read_ints(o_counts, blocks, v.counts):
        return 0
    if o_displs is None:
        acc = 0
        for i in range(blocks):
            v.displs[i] = acc
            if v.counts[i] > 0:
                acc += v.counts[i]   # (bounded by the callers' checks)
            if acc > length:
                acc = length + 1     # (no sum wraps around)
    elif type(o_displs) is not list and type(o_displs) is not tuple and \
            _is_integral(o_displs):
        try:
            d = o_displs.__index__()
        except OverflowError:
            return 0
        if d < 0 or (blocks > 1 and d > PY_SSIZE_T_MAX // (blocks - 1)):
            return 0
        for i in range(blocks):
            v.displs[i] = d * i
    elif not _read_ints(o_displs, blocks, v.displs):
        return 0
    return 1


cdef Vector read_counts(object value, int blocks):
    """Reduce_scatter's recvcounts as a Vector without a message (`largest`
    and `m` unset), or None when they are not non-negative ints."""
    cdef Vector v = Vector.__new__(Vector)
    v.alloc(blocks)
    if not _read_ints(value, blocks, v.counts, False):   # (mpi4py takes no int here)
        return None
    v.ints = True
    cdef Py_ssize_t i
    for i in range(blocks):
        if v.counts[i] < 0:
            return None
        if v.counts[i] > INT_MAX:
            v.ints = False
        else:
            v.icounts[i] = <int>v.counts[i]
    return v


# What `message` stages where the pool cannot read a message in place.
DEF STAGE_NONE = 0     # nothing: the buffer forms only
DEF STAGE_DEVICE = 1   # a reduction's: a device array of a predefined datatype
DEF STAGE_ANY = 2      # a derived datatype, MPI.BOTTOM, a device array


cdef Message message(object msg, bint writable, int blocks=0, Py_ssize_t least=0,
                     int stage=STAGE_ANY):
    """A `Message` of a plain message (the forms above), or None when the
    pool cannot take it (an unsupported datatype, a form stock mpi4py
    rejects).  `blocks`: the buffer holds that many blocks, `count` is
    one's.  `stage` (STAGE_NONE, STAGE_DEVICE, STAGE_ANY): what is staged
    through a temporary buffer (staging.pxi), of at least `least` bytes;
    except with STAGE_NONE, a DLPack array in host memory is read in place
    and a message of nothing at None or MPI.BOTTOM is one of no bytes."""
    cdef Message m = _parse(msg, writable, blocks)
    if m is not None or stage == STAGE_NONE:
        return m
    m = host_message(msg, writable, blocks)
    if m is None:
        m = staged_message(msg, writable, blocks, least, stage == STAGE_DEVICE)
    return m if m is not None else _empty(msg)


cdef Vector vector(object msg, bint writable, int blocks, bint staged=False):
    """A `Vector` of a vector message (the forms above), or None when
    neither the pool nor a straight call can take it (mpi4py's method then
    reports what it finds wrong); `staged`: one of a derived datatype or
    in a device array, staged.  A block that runs
    outside the buffer, or two blocks of a receive buffer (`writable`) that
    overlap, are noted as refused (see above): MPI would write out of
    bounds there."""
    cdef Vector v = _read_vector(msg, writable, blocks)
    if v is None and staged:
        v = staged_vector(msg, blocks, writable)
        if v is None:
            v = _empty_vector(msg, blocks)
    return v


cdef inline bint aliased(Message a, Message b):
    """Whether the buffers of a call's send and receive messages share
    memory, which MPI forbids (IN_PLACE says it): such a call goes to MPI,
    to be refused or not as stock MPI decides (MPICH refuses it, Open MPI
    runs some), never through the pool, which reads one while it writes the
    other."""
    return a.lo < b.hi and b.lo < a.hi
