# Staging: a message the pool cannot read in place -- of a derived datatype,
# at MPI.BOTTOM, in a device array -- copied through a temporary buffer,
# and DLPack arrays in host memory read in place (mpi4py's asdlpack.pxi is
# the model).  Entries: `staged_message`, `staged_vector` and
# `host_message`, which messages.pxi's `message` and `vector` call; `fill`
# and `drain` (the copies around a pool call) and `direct` (whether MPI
# may be handed a message as it is), which the family files call.
#
# A rank may describe its message with a derived datatype while its peers
# use a plain buffer of the same elements (MPI matches type signatures, not
# layouts).  Were it to send such a call to MPI on its own, its peers
# would have to follow it there: in one pool they can (the pass mark), but
# not where the pool has not been set up yet (its set-up is collective) nor
# across pool groups (the other groups' leaders wait in the leaders' MPI
# step).  So a message of a derived datatype (or a predefined one with
# gaps, such as MPI.DOUBLE_INT; or at MPI.BOTTOM) is staged instead: the
# call runs on a contiguous temporary buffer of its elements (of the one
# predefined type they all are, else the bytes MPI packs them into), which
# `fill` copies the message into and `drain` copies it back out of --
# through MPI on a private self communicator, by the datatype itself, so
# that the layout is MPI's.  Its peers see a message like theirs, and
# every rank decides alike.  Where the
# call goes to MPI, MPI gets the user's message as given.  Not for the
# reductions: MPICH and Open MPI refuse a predefined op on any derived
# datatype, so such a rank goes to MPI and raises there, as under stock.
#
# A device array (a GPU buffer, read by mpi4py through
# __cuda_array_interface__ or DLPack) is staged alike, reductions included
# where its datatype is a predefined one: the pool cannot read device
# memory, and a rank that passed alone would hang its peers where they
# cannot follow.  MPI copies it (a CUDA-aware library between device and
# host); cxlmpi never touches device memory itself.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


# A duplicate of COMM_SELF for the staging copies, made on first use, and
# the lock its copies take: two threads' Sendrecv pairs on one
# communicator would match each other's halves, and two first uses would
# run one collective (the Dup) on COMM_SELF at once.  A copy to oneself
# completes without a peer: the lock never waits on another rank.
cdef object _self_comm = None
cdef object _self_lock = threading.Lock()


cdef object _one_type(object dtype):
    """The predefined datatype that every element of `dtype` is, or None
    (a struct of several, or one the pool does not know)."""
    base, combiner, params = dtype.decode()
    if combiner == "NAMED":
        return dtype if type_info(dtype) is not None else None
    kids = params["datatypes"] if combiner == "STRUCT" else [base]
    found, alike = None, True
    for kid in kids:
        leaf = _one_type(kid) if alike else None
        if not kid.is_predefined:
            kid.Free()   # (decode's derived datatypes are new handles)
        if leaf is None or (found is not None and leaf.handle != found.handle):
            alike = False
        found = leaf
    return found if alike else None


cdef tuple _derived(object msg, bint vector, bint writable):
    """(its parts as `unpack` reads them, (buffer length, size, extent,
    true lower bound, true extent, buffer address)) of a message of a
    derived datatype whose buffer it may read (`writable`: and write), or
    None.  A message at MPI.BOTTOM (the datatype holds absolute addresses,
    its buffer is all memory: MPI checks it, as under stock) is staged
    alike: a rank that sent it to MPI alone left its peers waiting."""
    parts = unpack(msg, vector, False, True)
    if parts is None:
        return None
    o_buf, _, _, o_type = parts
    if not isinstance(o_type, _DATATYPE) or (
            o_type.is_predefined and type_info(o_type) is not None):
        return None
    if o_buf is _BOTTOM:
        d = _reach(o_type, PY_SSIZE_T_MAX)
        return (parts, d + (0,)) if d is not None else None
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(o_buf, &view, PyBUF_WRITABLE if writable else 0)
    except Exception:
        return None
    cdef Py_ssize_t length = view.len
    cdef uintptr_t address = <uintptr_t>view.buf
    PyBuffer_Release(&view)
    d = _reach(o_type, length)
    return (parts, d + (address,)) if d is not None else None


cdef tuple _reach(object dtype, object length):
    """(buffer length, size, extent, true lower bound, true extent) of
    `dtype` in a buffer of `length` bytes, or None where MPI does not say
    or its elements take no room."""
    try:
        size = dtype.Get_size()
        extent = dtype.Get_extent()[1]
        tlb, textent = dtype.Get_true_extent()
    except MPI.Exception:
        return None
    if size <= 0 or textent < 0:
        return None
    return (length, size, extent, tlb, textent)


cdef extern from *:
    """
    typedef struct {   /* DLPack's DLTensor, up to its dtype */
        void *data;
        int32_t _device_type, device_id;
        int32_t ndim;
        uint8_t code, bits;
        uint16_t lanes;
    } cxl_dltensor;
    """
    ctypedef struct cxl_dltensor:
        unsigned char code, bits
        unsigned short lanes


# DLPack's type codes -> numpy's kinds
cdef dict _DL_KINDS = {0: "i", 1: "u", 2: "f", 5: "c", 6: "b"}


cdef object _device_type(object obj):
    """The MPI datatype of a bare device array's elements (its
    __cuda_array_interface__ typestr, or its DLPack dtype), as `message`
    reads a NumPy array of that type, or None."""
    import numpy

    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
        if cai is not None:
            return format_type(numpy.dtype(cai["typestr"]).char)
        try:
            capsule = obj.__dlpack__()
        except Exception:   # (NumPy exports a read-only array versioned only)
            capsule = None
        if capsule is None or not PyCapsule_IsValid(capsule, "dltensor"):
            # (DLPack 1.0's versioned capsule: NumPy reads it, in host
            # memory.  Not NumPy first: where it cannot read the type, it
            # frees the capsule with its error set, and a producer's
            # destructor written in Python then fails, printed as ignored
            # -- hundreds in mpi4py's own test suite)
            capsule = None
            return format_type(numpy.from_dlpack(obj).dtype.char)
        # (a DLManagedTensor begins with its DLTensor; the capsule, never
        # consumed, hands it back to its producer when it is freed)
        t = <cxl_dltensor *>PyCapsule_GetPointer(capsule, "dltensor")
        kind = _DL_KINDS.get(t.code)
        if t.code == 2 and t.lanes == 2 and t.bits in (32, 64, 128):
            # two float lanes: a complex number, as mpi4py reads them
            return format_type(numpy.dtype(f"c{t.bits // 4}").char)
        if kind is None or t.lanes != 1 or t.bits % 8:
            return None
        return format_type(numpy.dtype(f"{kind}{t.bits // 8}").char)
    except Exception:
        return None


cdef tuple _foreign(object msg, bint vector, bint writable, bint predefined):
    """`_derived` for a message in a device array: its parts, the datatype
    read (a bare array's from its element type: `_device_type`), and its
    reach, its length as mpi4py reads the buffer; None for any other
    message, a read-only array to write, or (`predefined`) a derived
    datatype."""
    parts = unpack(msg, vector, True)
    if parts is None or PyObject_CheckBuffer(parts[0]):
        return None
    o_buf, o_count, o_displ, o_type = parts
    try:
        view = MPI.buffer(o_buf)
    except Exception:
        return None
    if writable and view.readonly:
        return None
    length = view.nbytes
    o_type = _device_type(o_buf) if o_type is None else lookup_type(o_type)
    if o_type is None or (predefined and not o_type.is_predefined):
        return None
    d = _reach(o_type, length)
    return ((o_buf, o_count, o_displ, o_type), d + (view.address,)) if d is not None \
        else None


cdef tuple _extent_of(tuple d, object displ, object count):
    """(first, end): the bytes that `count` (> 0) elements of the datatype
    of `d` (see `_derived`) from element `displ` on reach, from the buffer's
    start (Python ints: nothing wraps around; the extent may be zero or
    negative)."""
    extent, tlb, textent = d[2], d[3], d[4]
    first = displ * extent + tlb
    last = (displ + count - 1) * extent + tlb
    return min(first, last), max(first, last) + textent


cdef tuple _reach_of(tuple d, list parts):
    """[lo, hi): the user's memory that `parts` (see `_temporary`) reach in
    the buffer of `d` (address d[5])."""
    lo, hi = None, None
    for msg, _, _ in parts:
        if msg[1] > 0:
            first, end = _extent_of(d, msg[2], msg[1])
            lo = first if lo is None else min(lo, first)
            hi = end if hi is None else max(hi, end)
    if lo is None or d[5] == 0:
        # (at MPI.BOTTOM: its reach's hull may hold other messages between
        # its parts, and the pool reads and writes only its copy; judged
        # aliased there, a rank went to MPI alone)
        return d[5], d[5]
    return d[5] + lo, d[5] + hi


cdef Message _temporary(tuple d, Py_ssize_t total, list parts):
    """The staged Message of `total` elements of `d`'s datatype, moved as
    `parts` [(user message, element offset, elements)] say: as elements of
    the one predefined type they all are, or else (a struct of several, a
    pair type such as MPI.DOUBLE_INT) as the bytes MPI packs them into,
    which MPI.PACKED moves (data movement only: reductions stage no derived
    datatype)."""
    global _self_comm
    base = _one_type(parts[0][0][3])
    if base is None:
        base = MPI.PACKED
    info = type_info(base)
    cdef Py_ssize_t tsize = info[1], k = d[1] // tsize
    if d[1] % tsize:
        return None
    import numpy
    tmp = numpy.empty(total * d[1], numpy.uint8)
    cdef Message m = Message.__new__(Message)
    PyObject_GetBuffer(tmp, &m.view, PyBUF_WRITABLE)
    m.held = True
    # the user's datatype (compared as mpi4py compares a reduction's two),
    # the predefined one's code and size (the pool's kernels read those)
    m.datatype = parts[0][0][3]
    m.handle = <Py_ssize_t><uintptr_t>m.datatype.handle   # (never handed to MPI)
    m.tcode, m.itemsize = info[0], info[1]
    m.address = <uintptr_t>m.view.buf
    m.lo, m.hi = _reach_of(d, parts)
    m.count = total * k
    m.nbytes = total * d[1]
    m.staged = (tmp, base, [(msg, off * k * tsize, n * k) for msg, off, n in parts])
    with _self_lock:
        if _self_comm is None:
            _self_comm = MPI.COMM_SELF.Dup()
    return m


cdef Message staged_message(object msg, bint writable, int blocks, Py_ssize_t least,
                            bint reducing=False):
    """`message` for a message of a derived datatype or in a device array
    (see above) of at least `least` bytes: a Message of its elements in a
    temporary buffer (`count` per block, as `message` counts), or None.  MPI
    itself copies the elements where the datatype says (`_move`), as it
    would for the call under stock MPI, so a message whose datatype reaches
    past its buffer object (mpi4py does not check a derived datatype's
    reach: a column [A[0, 1:], 1, column] of a matrix A) is staged too; a
    rank that sent it to MPI alone left its peers waiting in the pool's
    set-up, and took their set-up's messages for its own.
    `reducing`: only a device array of a predefined datatype."""
    found = None if reducing else _derived(msg, False, writable)
    if found is None:
        found = _foreign(msg, False, writable, reducing)
    if found is None:
        return None
    (o_buf, o_count, o_displ, o_type), d = found
    cdef Py_ssize_t nblocks = blocks if blocks > 1 else 1, displ = 0, total
    try:
        if o_displ is not None:
            displ = o_displ.__index__()
        if o_count is None:
            if d[2] <= 0 or (d[0] - displ * d[2]) % d[2] or \
                    (d[0] - displ * d[2]) // d[2] % nblocks:
                return None
            total = (d[0] - displ * d[2]) // d[2]
        else:
            total = o_count.__index__() * nblocks
    except (TypeError, AttributeError, OverflowError):
        return None
    if displ < 0 or total < 0 or total > PY_SSIZE_T_MAX // 4 // d[1] or \
            total * d[1] < least:
        return None
    cdef Message m = _temporary(d, total, [([o_buf, total, displ, o_type], 0, total)])
    if m is not None:
        m.count //= nblocks
        m.nbytes //= nblocks
    return m


cdef Vector staged_vector(object msg, int blocks, bint writable=True):
    """`vector` of a vector message of a derived datatype or in a device
    array (see above; `writable`: a receive vector): its blocks one after
    the other in a temporary buffer, or None."""
    found = _derived(msg, True, writable)
    if found is None:
        found = _foreign(msg, True, writable, False)
    if found is None:
        return None
    (o_buf, o_counts, o_displs, o_type), d = found
    if d[2] <= 0 or (o_counts is None and d[0] % d[2]):
        return None   # (receive blocks of no extent overlap; counts split extents)
    cdef Vector v = Vector.__new__(Vector)
    v.alloc(blocks)
    cdef Py_ssize_t total = 0, i
    if not read_layout(v, o_counts, o_displs, d[0] // d[2], blocks):
        return None
    moves = []
    for i in range(blocks):
        if v.counts[i] < 0 or v.displs[i] < 0 \
                or v.counts[i] > PY_SSIZE_T_MAX // 4 // d[1] - total:
            return None
        if v.counts[i]:
            moves.append(([o_buf, v.counts[i], v.displs[i], o_type], total, v.counts[i]))
        total += v.counts[i]
    if not moves:   # (no elements: nothing staged, nothing copied back)
        v.m = no_elements(lookup_type(o_type))
        for i in range(blocks):
            v.displs[i] = 0
        v.largest = 0
        v.ints = True
        return v if v.m is not None else None
    v.m = _temporary(d, total, moves)
    if v.m is None:
        return None
    cdef Py_ssize_t k = v.m.count // total
    total = 0
    v.largest = 0
    v.ints = True
    for i in range(blocks):
        v.displs[i] = total
        v.counts[i] *= k
        total += v.counts[i]
        v.largest = max(v.largest, v.counts[i])
        if v.counts[i] > INT_MAX or v.displs[i] > INT_MAX:
            v.ints = False
        else:
            v.icounts[i], v.idispls[i] = <int>v.counts[i], <int>v.displs[i]
    return v


# DLPack's device types of memory that the host reads as its own: CPU,
# CUDA's pinned host memory, ROCm's
cdef tuple _HOST_DEVICES = (1, 3, 11)


cdef Message host_message(object msg, bint writable, int blocks):
    """`message` of a message in a DLPack array in host memory (a PyTorch CPU
    tensor, say: no buffer protocol), read in place through mpi4py's view
    of its buffer (MPI.buffer, which keeps the array alive) with its
    datatype named; None for any other message."""
    parts = unpack(msg, False, True)
    if parts is None or PyObject_CheckBuffer(parts[0]) or \
            hasattr(parts[0], "__cuda_array_interface__"):
        return None
    o_buf, o_count, o_displ, o_type = parts
    try:
        if o_buf.__dlpack_device__()[0] not in _HOST_DEVICES:
            return None
        view = MPI.buffer(o_buf)
    except Exception:
        return None
    if o_type is None:
        o_type = _device_type(o_buf)
        if o_type is None:
            return None
    return message([view, o_count, o_displ, o_type], writable, blocks, 0, STAGE_NONE)


cdef int fill(Message m) except -1:
    """Copy a staged message's user buffer into its temporary one (before a
    pool call reads it); nothing for others."""
    if m is not None and m.staged is not None:
        tmp, base, moves = m.staged
        with _self_lock:
            for user, off, n in moves:
                _move(user, [tmp[off:], n, base], True)
    return 0


cdef int drain(Message m) except -1:
    """Copy a staged message's temporary buffer back into the user's (after
    a pool call wrote it)."""
    if m is not None and m.staged is not None:
        tmp, base, moves = m.staged
        with _self_lock:
            for user, off, n in moves:
                _move(user, [tmp[off:], n, base], False)
    return 0


cdef int _move(object user, object tmp, bint to_tmp) except -1:
    """One staging copy between the user's message and the temporary one,
    through MPI.  A user message at MPI.BOTTOM from element `displ` on
    goes as one struct of its elements that far on: mpi4py checks a
    displacement against the buffer, and MPI.BOTTOM has no bytes."""
    t = None
    if user[0] is _BOTTOM and user[2]:
        t = MPI.Datatype.Create_struct([user[1]], [user[2] * user[3].Get_extent()[1]],
                                       [user[3]]).Commit()
        user = [_BOTTOM, 1, t]
    try:
        if to_tmp:
            _self_comm.Sendrecv(user, 0, 0, tmp, 0, 0)
        else:
            _self_comm.Sendrecv(tmp, 0, 0, user, 0, 0)
    finally:
        if t is not None:
            t.Free()
    return 0


cdef inline bint direct(Message m) noexcept:
    """Whether MPI may be handed `m` as it is (not a staged message)."""
    return m is not None and m.staged is None


# Messages of no elements at None or MPI.BOTTOM (mpi4py reads no bytes
# there): no bytes to read or stage, alike on every rank that gives them.

cdef Message _empty(object msg):
    """A message of no elements whose buffer the pool cannot read -- None
    or MPI.BOTTOM, count 0 or none given (``[MPI.BOTTOM, 0, MPI.DOUBLE]``,
    ``[None, MPI.INT]``, ``[None, None, MPI.INT]``: mpi4py reads no
    elements there) -- as a Message of no bytes; None for any other.  Such
    a rank had sent the call to MPI alone, its peers waiting in the pool."""
    found = _at_none(msg, False)
    if found is None:
        return None
    o_count, o_type = found
    if o_count is not None and not (_is_integral(o_count) and o_count.__index__() == 0):
        return None
    return no_elements(lookup_type(o_type))


cdef tuple _at_none(object msg, bint vector):
    """(count(s), datatype) of a message at None or MPI.BOTTOM as mpi4py
    unpacks it (``[buf, type]``, ``[buf, count, type]``, ``[buf, (count,
    displ), type]``, ``[buf, count, displ, type]``; `vector`: a tuple
    pairs counts and displacements, a list is counts), else None.  A count
    of None there means none: mpi4py reads a buffer of no bytes."""
    if not (type(msg) is list or type(msg) is tuple) or not 2 <= len(msg) <= 4 or \
            not (msg[0] is None or msg[0] is _BOTTOM) or \
            not isinstance(msg[len(msg) - 1], (str, _DATATYPE)):
        return None
    o_count = None
    if len(msg) == 3:
        o_count = msg[1]
        if isinstance(o_count, tuple if vector else (list, tuple)):
            if len(o_count) != 2:
                return None
            o_count = o_count[0]
    elif len(msg) == 4:
        o_count = msg[1]
    return o_count, msg[len(msg) - 1]


cdef Vector _empty_vector(object msg, int blocks):
    """`vector` of a vector message of no elements at None or MPI.BOTTOM
    (``[None, MPI.INT]``, ``[None, None, None, MPI.INT]``, ``[None, counts,
    displs, MPI.INT]`` whose counts are all 0), else None: every block
    empty, as `_empty`'s message."""
    found = _at_none(msg, True)
    if found is None:
        return None
    o_counts, o_type = found
    cdef Vector v = Vector.__new__(Vector)
    v.alloc(blocks)
    cdef Py_ssize_t i
    if o_counts is not None:
        if not _read_ints(o_counts, blocks, v.counts):
            return None
        for i in range(blocks):
            if v.counts[i] != 0:
                return None
    v.m = no_elements(lookup_type(o_type))
    if v.m is None:
        return None
    for i in range(blocks):
        v.counts[i] = v.displs[i] = v.icounts[i] = v.idispls[i] = 0
    v.largest = 0
    v.ints = True
    return v


cdef Message no_elements(object dtype):
    """A Message of no elements of `dtype` (None: None)."""
    if dtype is None:
        return None
    info = type_info(dtype) if dtype.is_predefined else None
    cdef Message m = Message.__new__(Message)
    m.datatype = dtype
    if info is not None:
        m.tcode, m.itemsize, m.handle = info
    else:   # (a derived datatype: MPI is handed no elements of it)
        m.tcode, m.itemsize, m.handle = MOVE_ONLY, 1, <Py_ssize_t><uintptr_t>dtype.handle
    m.address = m.lo = m.hi = 0
    m.count = m.nbytes = 0
    return m
