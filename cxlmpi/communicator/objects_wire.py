"""The wire of the nonblocking object collectives (`objects_progress`):
the private duplicate of a communicator their messages travel on, with the
tags of each call, and what a frame becomes on it -- a header message,
with the frame inside when it is small, followed by the frame when it is
large, or alone when the frame lies in the node heap (`objects_heap`)."""

from __future__ import annotations

import struct
import threading
from typing import Any, Callable

from mpi4py import MPI

from .objects import _Block
from .objects_heap import HeapFrame

__all__ = ["_Channel", "_Frame", "_Outgoing", "_EAGER_NBYTES", "_PREFIX", "_HEAD", "_ACK"]

#: Bytes of a header message: a frame that fits after the 64-byte prefix
#: travels inside it (one message), a larger one follows it.
_EAGER_NBYTES = 4096
_PREFIX = 64            # u64 frame bytes, then padding to the frames' alignment
# A header: the frame's bytes; 1 + its offset in the node heap, or 0; which heap.
_HEAD = struct.Struct("<QQQ")
_ACK = bytes(1)                 # a receiver's answer to a frame it took from the heap


class _Channel:
    """The private duplicate of one communicator that its calls talk on,
    with the sequence numbers of the calls posted on it.  Posting is local:
    the duplicate comes from MPI_Comm_idup, and calls posted before it is
    ready wait in `queued` (in issue order) until someone's progress finds
    it ready and posts them."""

    __slots__ = ("comm", "dup", "queued", "seq", "live", "closing", "lock", "tag_ub",
                 "stopping")

    def __init__(self, comm: MPI.Intracomm, tag_ub: int,
                 stopping: Callable[[], bool]) -> None:
        self.tag_ub = tag_ub        # (MPI's TAG_UB)
        self.stopping = stopping    # (whether this process is shutting the calls down)
        self.comm, self.dup = MPI.Intracomm(comm).Idup()
        self.queued: list[Any] = []   # (objects_progress._Op: calls waiting for it)
        self.seq = 0
        self.live = 0          # calls posted and not yet complete
        self.closing = False   # the user's communicator was freed
        self.lock = threading.Lock()

    def tag(self) -> int:
        """The header tag of the next call: its large frames go on tag + 1,
        the answers to frames taken from the node heap on tag + 2 (between
        the same two ranks, in the other direction, a frame on tag + 1 would
        match the receive of an answer posted before it)."""
        tag = 3 * (self.seq % ((self.tag_ub + 1) // 3))
        self.seq += 1
        return tag

    def post(self, op: Any) -> None:
        with self.lock:
            self.live += 1
            if self.dup is None:
                op.post(self.comm)
            else:
                self.queued.append(op)

    def ready(self, block: bool) -> bool:
        """Whether the duplicate is ready (then every queued call is posted)."""
        if self.dup is None:
            return True
        if not self.lock.acquire(blocking=block):
            return False
        try:
            if self.dup is not None:
                if block:
                    self.dup.Wait()
                elif not self.dup.Test():
                    return False
                for op in self.queued:
                    op.post(self.comm)
                self.queued = []
                self.dup = None
            return True
        finally:
            self.lock.release()

    def ended(self) -> None:
        """One of its calls is complete (received all its messages)."""
        with self.lock:
            self.live -= 1
            if self.closing and self.live == 0:
                self._free()

    def close(self) -> None:
        """The user's communicator is being freed: free the duplicate once
        no call in flight can post another receive on it (now, or when the
        last one ends).  Called inside MPI_Comm_free: the lock is waited for
        a bounded time, never for good, should the MPI library hold a lock
        of its own there that a thread holding this one waits for."""
        self.closing = True
        if not self.lock.acquire(timeout=1.0):
            return   # (a duplicate left to the end of the job at worst)
        try:
            if self.live == 0 and self.dup is None:
                self._free()
        finally:
            self.lock.release()

    def _free(self) -> None:
        if not MPI.Is_finalized() and not self.stopping() and self.comm != MPI.COMM_NULL:
            self.comm.Free()


class _Frame:
    """A frame inside a header message (what objects._load reads)."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view


class _Outgoing:
    """What one frame becomes on the wire: the header message (with the
    frame inside when it fits) and the frame itself when it does not --
    or, for a frame in the node heap (`objects_heap`), the header alone,
    which carries its offset."""

    __slots__ = ("head", "frame", "in_heap")

    def __init__(self, frame: Any) -> None:
        nbytes = len(frame.view)
        self.frame: _Block | None = None
        self.in_heap: HeapFrame | None = None
        at = key = 0
        if _PREFIX + nbytes <= _EAGER_NBYTES:
            self.head = _Block(_PREFIX + nbytes)
            self.head.view[_PREFIX:] = frame.view
        else:
            self.head = _Block(_HEAD.size)
            if isinstance(frame, HeapFrame):
                self.in_heap, at, key = frame, frame.offset + 1, frame.key
            else:
                self.frame = frame
        _HEAD.pack_into(self.head.view, 0, nbytes, at, key)
