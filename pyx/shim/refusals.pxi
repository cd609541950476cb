# Messages whose counts run past their buffer (an explicit count larger
# than the buffer, a block outside it; receive blocks that overlap): stock
# MPI would read or write past it.  messages.pxi parses such a message as
# its counts say, backed by a scratch copy that reaches that far
# (`to_scratch`), and notes it as refused for its call (settings.pxi's
# `note_refusal`).  The call then decides its path as its peers do -- one
# rank raising alone left its peers waiting in the pool, or following its
# next call's pass into MPI -- and where that is the pool, `run` (or a
# posted call's `planned`) refuses it before the pool touches a byte: the
# rank marks its control line (Pool.refuse), its peers raise too, naming
# it, and the communicator's pool closes; where it is MPI, MPI runs it on
# the scratch copy, and the part inside the buffer is copied back
# (`copy_back`, when the Message goes).  A count whose bytes exceed what
# memory holds, or a scratch copy over SCRATCH_MAX, raises at once.
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


# The largest scratch copy a refused message gets; one that reaches further
# raises at once (every rank's own arguments would have to be absurd).
DEF SCRATCH_MAX = 1 << 30


cdef int to_scratch(Message m, Py_ssize_t reach, object err, bint writable) except -1:
    """Note `m` as refused (`err`) and move it to a scratch copy of the
    user's buffer that reaches `reach` bytes past the buffer's start: a
    call that MPI runs reads and writes the copy, never past the buffer,
    and the part inside the buffer is copied back (`copy_back`); a call
    that would take the pool is refused before it touches either."""
    if reach > SCRATCH_MAX:
        raise err
    import numpy
    import warnings

    tmp = numpy.zeros(reach, numpy.uint8)
    cdef uintptr_t base = <uintptr_t>tmp.ctypes.data
    memcpy(<void *>base, m.view.buf, m.view.len)
    m.address = base + (m.address - <uintptr_t>m.view.buf)
    m.scratch, m.scratch_at = tmp, base
    if writable:
        m.before = PyBytes_FromStringAndSize(<char *>m.view.buf, m.view.len)
    note_refusal(err)
    warnings.warn(f"cxlmpi: {err} (where the call takes the pool, every rank raises; "
                  f"where it goes to MPI, it runs on a scratch copy: MPI would read or "
                  f"write past the buffer)", RuntimeWarning)
    return 0


cdef void copy_back(Message m) noexcept:
    """A refused receive message's scratch copy, back into the user's
    buffer -- only where a call wrote it (a nonblocking call that MPI runs
    on the user's message as given writes the buffer itself)."""
    cdef const char *before = <const char *>m.before
    if memcmp(<void *>m.scratch_at, before, m.view.len) != 0:
        memcpy(m.view.buf, <void *>m.scratch_at, m.view.len)


cdef object outside_error(str what, object nbytes, Py_ssize_t length):
    """The error for a message whose `what` reaches `nbytes` bytes (a Python
    int: it cannot wrap around) into a buffer of `length` bytes."""
    from .errors import CXLMPIMessageError

    return CXLMPIMessageError(
        f"message: {what} reaches {nbytes} bytes but the buffer holds {length}; "
        f"pass counts and displacements that fit the buffer")
