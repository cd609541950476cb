"""The nonblocking object collectives in flight (`objects_nb`): how their
messages move, how their requests complete, and who moves them on (the
private duplicate and the messages themselves: `objects_wire`).

- **Post.**  Every message of a call is posted at once as MPI
  point-to-point on a private duplicate of the communicator (made by
  ``MPI_Comm_idup`` on its first such call, so it never matches the
  program's own messages, and posting stays local: calls posted before the
  duplicate is ready wait for it in issue order).  Every call takes the
  next sequence number of that duplicate, the same on every rank because
  every rank posts the calls in the same order; its messages carry tags
  made of it, so calls in flight together never match each other's
  messages, and calls interleave freely with blocking ones.
- **Messages.**  One message per pair of ranks that exchange an object: a
  header of _EAGER_NBYTES at most that carries the frame's size and, when
  it fits, the frame itself (the frame format of `objects`); a larger frame
  follows as a second message, received into a buffer of its exact size
  once its header has come.  A call completes when the messages a rank
  receives have come.  Sends are not part of it: their frames stay alive
  until MPI has sent them (a rank's call may complete before a peer has
  received what it sent).
- **Completion.**  The request the caller holds is a receive that this
  process posts to itself (on a private duplicate of COMM_SELF) into a
  buffer of a few bytes; once the call's messages have come, whoever
  noticed sends it the pickle of a small token, which completes it as MPI
  sees it.  mpi4py then unpickles the token -- in the request's ``wait``,
  ``test`` or ``MPI.Request.waitall`` -- and the token unpickles the frames
  that came, folding a reduction (`objects_nb`): a real MPI request, which
  stock ``waitall``, ``waitany``, ``testall`` & co. complete in lists mixed
  with any other requests, and which returns its object there too.
- **Progress.**  Receiving a large frame needs this module's code to post
  its receive once the header has come.  The request's own ``wait``/
  ``test`` do it, and under MPI_THREAD_MULTIPLE (mpi4py's default) a
  progress thread does it for requests completed by stock calls
  (``MPI.Request.waitall``) or left alone while the program computes: it
  sleeps on a condition variable while no call is in flight, and polls with
  a backoff (0.5 ms doubling to 5 ms) while one is, unless a request's own
  ``wait`` is moving the calls on (each time it wakes it takes the GIL,
  which stalls a thread coming back from an MPI call: on a busy core that
  costs more than the poll itself, so it polls seldom).  Below THREAD_MULTIPLE
  there is no thread: complete the requests with their own methods or
  `ObjectRequest.waitall`; stock ``MPI.Request.waitall`` on them would wait
  forever.

Messages go through MPI, but for large frames under CXLMPI_OBJECTS=1,
which only their header does: the frame itself lies in the node heap
(`objects_heap`).  ``cxlmpi.stats()`` counts a call as a pool call of
``"ibcast(obj)"``, ``"iallreduce(obj)"``, ... where this rank wrote a
frame to the heap or took one from it (with those frames' bytes), else as a
pass-through call, once its messages have all come.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any, Callable

from mpi4py import MPI

from .. import config
from .objects import _Block
from .objects_heap import fetch, find_heap, heaps_of
from .objects_wire import _ACK, _EAGER_NBYTES, _HEAD, _PREFIX, _Channel, _Frame, _Outgoing

__all__ = ["ObjectRequest", "post", "figures", "reset_figures"]

_METHODS = ("ibcast", "igather", "iscatter", "iallgather", "ialltoall", "ireduce",
            "iallreduce")

_MIN_DELAY_S = 500e-6   # the progress thread's polling backoff
_MAX_DELAY_S = 5e-3

# Per method: [pool calls, pass-through calls, bytes through the pool,
# seconds] as objects._FIGURES (a pool call moved a frame of this rank's
# through the node heap, its bytes; seconds only with CXLMPI_STATS=1:
# posting, and the requests' own wait/test).
_FIGURES: dict[str, list[float]] = {name: [0, 0, 0, 0.0] for name in _METHODS}


def figures() -> dict[str, tuple[int, int, int, float]]:
    """{method: (pool_calls, passthrough_calls, nbytes, seconds)} of every
    nonblocking object collective of this process, called or not."""
    return {name: (int(f[0]), int(f[1]), int(f[2]), f[3]) for name, f in _FIGURES.items()}


def reset_figures() -> None:
    """Forget every count."""
    for name in _METHODS:
        _FIGURES[name][:] = [0, 0, 0, 0.0]


def _timed(name: str, t0: float) -> None:
    if config.get().stats:
        _FIGURES[name][3] += time.perf_counter() - t0


# ------------------------------------------------------------ state

_LOCK = threading.Lock()              # _LIVE, the thread's start and stop
_WAKE = threading.Condition(_LOCK)    # work for the progress thread
_LIVE: dict[int, _Op] = {}            # posted calls whose messages have not all come
# Calls whose messages have all come, until the program has taken the
# result: each is kept alive by its token's buffer (the request's).
_RELEASED: weakref.WeakValueDictionary[int, _Op] = weakref.WeakValueDictionary()
_SENDS_LOCK = threading.Lock()
_SENDS: list[tuple[MPI.Request, Any]] = []   # sends in flight, with their buffers
_keys = iter(range(1 << 62))          # (next(): atomic under the GIL)
_self: list[MPI.Intracomm] = []       # the private duplicate of COMM_SELF
_thread: list[threading.Thread] = []
_stop = threading.Event()
_waiting = [0]                        # requests' own waits in progress (they move calls on)
_TAG_UB = 32767                       # (MPI's least; read on first use)


def _self_comm() -> MPI.Intracomm:
    global _TAG_UB
    if not _self:
        with _LOCK:
            if not _self:
                _TAG_UB = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
                _self.append(MPI.COMM_SELF.Dup())
                # Before MPI_Finalize: atexit runs before mpi4py's own, and a
                # program's explicit MPI.Finalize() deletes COMM_SELF's
                # attributes first.
                atexit.register(_shut_down)
                MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(
                    delete_fn=lambda *args: _shut_down()), True)
    return _self[0]


def _on_free(comm: MPI.Comm, keyval: int, channel: _Channel) -> None:
    channel.close()


_CHANNEL = MPI.Comm.Create_keyval(delete_fn=_on_free)


def _channel(comm: MPI.Intracomm) -> _Channel:
    channel = comm.Get_attr(_CHANNEL)
    if channel is None:
        _self_comm()
        channel = _Channel(comm, _TAG_UB, _stop.is_set)
        comm.Set_attr(_CHANNEL, channel)
    return channel


# ------------------------------------------------------------ one call

class _TokenBuffer(bytearray):
    """The buffer of a request's receive from this process: what mpi4py
    unpickles when the request completes.  Keeps its call alive."""

    op: _Op | None = None


class _Token:
    """Unpickles to the result of call `key` (`_result`)."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _result, (self.key,)


def _result(key: int) -> Any:
    """The result of call `key`: what its token unpickles to."""
    op = _RELEASED.get(key)
    if op is None:
        raise RuntimeError("cxlmpi: the result of a nonblocking object collective was "
                           "taken already")
    return op.take()


class _Op:
    """One posted call: the messages it sends and receives, the frames
    that came, and how they become the result (`finish`)."""

    __slots__ = ("key", "name", "channel", "tag", "lock", "outgoing", "sources", "frames",
                 "requests", "arrivals", "pending", "posted", "released", "error", "finish",
                 "token", "token_buffer", "comm", "heaps", "heap_nbytes", "deferred",
                 "__weakref__")

    def __init__(self, name: str, channel: _Channel | None,
                 outgoing: list[tuple[int, _Outgoing]], sources: list[int],
                 frames: dict[int, Any], finish: Callable[[dict[int, Any]], Any],
                 comm: MPI.Intracomm) -> None:
        self.key = next(_keys)
        self.name, self.channel, self.finish = name, channel, finish
        self.comm = comm   # (the program's: which node heaps peers' frames may lie in)
        self.heaps = heaps_of(comm) if sources and config.get().objects else []
        # frames in a heap this rank does not map yet: (source, bytes, offset + 1, heap)
        self.deferred: list[tuple[int, int, int, int]] = []
        # bytes of the frames this rank wrote to or took from the heap
        self.heap_nbytes = sum(len(out.in_heap.view) for out in
                               {id(o): o for _, o in outgoing if o.in_heap}.values())
        self.tag = channel.tag() if channel is not None else 0
        self.lock = threading.Lock()
        self.outgoing, self.sources, self.frames = outgoing, sources, frames
        self.requests: list[MPI.Request] = []
        self.arrivals: list[tuple[int, _Block, bool]] = []   # (source, buffer, header?)
        self.pending = len(sources)
        self.posted = self.released = False
        self.error: Exception | None = None
        self.token = MPI.pickle.dumps(_Token(self.key))
        self.token_buffer: _TokenBuffer | None = _TokenBuffer(len(self.token))
        self.token_buffer.op = self

    def request(self) -> ObjectRequest:
        """The request the caller holds: a receive of the token."""
        receive = _self_comm().irecv(self.token_buffer, 0, self.key % (_TAG_UB + 1))
        req = ObjectRequest(receive)
        req._op = self
        return req

    def post(self, comm: MPI.Intracomm) -> None:
        """Post every receive, then every send (the caller holds the
        channel's lock: once, when the duplicate is ready)."""
        for source in self.sources:
            head = _Block(_EAGER_NBYTES)
            self.requests.append(comm.Irecv([head.view, MPI.BYTE], source, self.tag))
            self.arrivals.append((source, head, True))
        sends = []
        for dest, out in self.outgoing:
            sends.append((comm.Isend([out.head.view, MPI.BYTE], dest, self.tag), out.head))
            if out.in_heap is not None:   # (the frame stays until the receiver answers)
                answer = bytearray(1)
                sends.append((comm.Irecv([answer, MPI.BYTE], dest, self.tag + 2),
                              (out.in_heap, answer)))
            if out.frame is not None:
                sends.append((comm.Isend([out.frame.view, MPI.BYTE], dest, self.tag + 1),
                              out.frame))
        self.outgoing = []
        with _SENDS_LOCK:
            _SENDS.extend(sends)
        self.posted = True

    def advance(self, block: bool) -> bool:
        """Move the call on (the caller holds its lock); whether anything
        moved.  `block`: until its messages have all come."""
        if self.released:
            return False
        moved = False
        if not self.posted:
            if self.channel is not None and not self.channel.ready(block):
                return False
            moved = True
        while self.pending:
            if self.deferred:
                deferred, self.deferred = self.deferred, []
                for args in deferred:
                    moved = self._from_heap(*args, block) or moved
                if not self.pending:
                    break
            done = (MPI.Request.Waitsome if block else MPI.Request.Testsome)(self.requests)
            if not done:
                return moved
            moved = True
            for i in done:
                self._arrived(i, block)
        self.release()
        return True

    def _from_heap(self, source: int, nbytes: int, at: int, key: int, block: bool) -> bool:
        """Take the frame `source` put at offset `at` - 1 of node heap `key`,
        and answer it; False where this rank does not map that heap yet and
        `block` is false: tried again on the next move.  (A peer may set up
        COMM_WORLD's pool and post before this rank's own set-up has
        returned; a rank that waits for the call can set nothing up any
        more, and fails it.)  A failure fails the call once its other
        messages have come; the sender's block goes back whatever happens."""
        try:
            heap = find_heap(self.comm, key, self.heaps)
        except ValueError as exc:
            if not block:
                self.deferred.append((source, nbytes, at, key))
                return False
            heap, self.error = None, self.error or exc
        self.pending -= 1
        try:
            if heap is not None:
                frame = _Block(nbytes)
                fetch(heap, at - 1, nbytes, frame)
                self.frames[source] = frame
                self.heap_nbytes += nbytes
        except Exception as exc:
            self.error = self.error or exc
        finally:
            answer = self.channel.comm.Isend([_ACK, MPI.BYTE], source, self.tag + 2)
            with _SENDS_LOCK:
                _SENDS.append((answer, None))
        return True

    def _arrived(self, i: int, block: bool) -> None:
        source, block, header = self.arrivals[i]
        if not header:
            self.frames[source] = block
            self.pending -= 1
            return
        nbytes, at, key = _HEAD.unpack_from(block.view, 0)
        if _PREFIX + nbytes <= _EAGER_NBYTES:
            self.frames[source] = _Frame(block.view[_PREFIX:_PREFIX + nbytes])
            self.pending -= 1
            return
        if at:
            self._from_heap(source, nbytes, at, key, block)
            return
        frame = _Block(nbytes)
        self.requests.append(self.channel.comm.Irecv([frame.view, MPI.BYTE], source,
                                                     self.tag + 1))
        self.arrivals.append((source, frame, False))

    def release(self) -> None:
        """Every message came (or the call failed): complete the request."""
        self.released = True
        self.requests = self.arrivals = []
        with _LOCK:
            figures = _FIGURES[self.name]
            if self.heap_nbytes:
                figures[0] += 1
                figures[2] += self.heap_nbytes
            else:
                figures[1] += 1
            _LIVE.pop(self.key, None)
            _RELEASED[self.key] = self
        if self.channel is not None:
            self.channel.ended()
        _self_comm().Send([self.token, MPI.BYTE], 0, self.key % (_TAG_UB + 1))
        self.token_buffer = None   # (the request's buffer keeps the call now)

    def fail(self, exc: Exception) -> None:
        self.error = exc
        if not self.released:
            self.release()

    def take(self) -> Any:
        """The result (once): unpickle what came, fold a reduction."""
        if self.error is not None:
            raise self.error
        frames, self.frames = self.frames, None
        if frames is None:
            raise RuntimeError("cxlmpi: the result of a nonblocking object collective "
                               "was taken already")
        return self.finish(frames)


def _advance(op: _Op, block: bool) -> bool:
    """Move `op` on under its lock (`block`: wait for the lock too);
    an MPI error fails the call: its request raises it."""
    if not op.lock.acquire(blocking=block):
        return False
    try:
        return op.advance(block)
    except Exception as exc:
        op.fail(exc)
        return True
    finally:
        op.lock.release()


def _reap_sends(block: bool) -> bool:
    """Let go of the sends MPI has completed; whether any had."""
    if not _SENDS or not _SENDS_LOCK.acquire(blocking=block):
        return False
    try:
        done = MPI.Request.Testsome([req for req, _ in _SENDS]) if _SENDS else None
        if not done:
            return False
        finished = set(done)
        _SENDS[:] = [s for i, s in enumerate(_SENDS) if i not in finished]
        return True
    finally:
        _SENDS_LOCK.release()


# ------------------------------------------------------------ progress

def _progress_loop() -> None:
    delay = _MIN_DELAY_S
    while True:
        with _WAKE:
            while not _stop.is_set() and not _LIVE and not _SENDS:
                _WAKE.wait()
            if _stop.is_set():
                return
            ops = list(_LIVE.values())
        moved = False
        try:
            if not _waiting[0]:
                for op in ops:
                    moved = _advance(op, False) or moved
                moved = _reap_sends(False) or moved
        except Exception:   # (an MPI error of a send: its peer's call reports it)
            moved = True
        delay = _MIN_DELAY_S if moved else min(2 * delay, _MAX_DELAY_S)
        if not moved:
            _stop.wait(delay)


def _start(op: _Op) -> None:
    """Hand `op` to the progress thread (started on first use, under
    MPI_THREAD_MULTIPLE only)."""
    with _WAKE:
        _LIVE[op.key] = op
        if not _thread and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            thread = threading.Thread(target=_progress_loop, daemon=True,
                                      name="cxlmpi-objects-progress")
            _thread.append(thread)
            thread.start()
        _WAKE.notify()


def _shut_down() -> None:
    """Before MPI_Finalize (atexit runs before mpi4py's): stop the thread,
    then give the sends still in flight the time their receivers take (a
    correct program's peers receive them all), CXLMPI_TIMEOUT at most."""
    with _WAKE:
        _stop.set()
        _WAKE.notify()
    for thread in _thread:
        thread.join()
    if MPI.Is_finalized():
        return
    timeout_s = config.get().timeout or 300.0
    deadline = time.monotonic() + timeout_s
    delay = _MIN_DELAY_S
    while _SENDS and time.monotonic() < deadline:
        if not _reap_sends(True):
            time.sleep(delay)
            delay = min(2 * delay, _MAX_DELAY_S)


# ------------------------------------------------------------ the request

class ObjectRequest(MPI.Request):
    """The request of a nonblocking object collective (``comm.ibcast`` &
    co.): ``wait()`` returns what the blocking method returns, ``test()``
    returns ``(flag, obj)``.  A real MPI request: stock
    ``MPI.Request.waitall`` & co. complete it in lists with any other
    requests and return its object (under MPI_THREAD_MULTIPLE)."""

    __slots__ = ("_op",)

    def _progress(self, block: bool) -> str:
        op = getattr(self, "_op", None)
        if op is None:
            return ""
        if not op.released:
            _waiting[0] += block
            try:
                _advance(op, block)
            finally:
                _waiting[0] -= block
        _reap_sends(False)
        return op.name

    def wait(self, status: MPI.Status | None = None) -> Any:
        """Wait for the call to complete; its result."""
        t0 = time.perf_counter()
        name = self._progress(True)
        try:
            return MPI.Request.wait(self, status)
        finally:
            self._op = None
            if name:
                _timed(name, t0)

    def test(self, status: MPI.Status | None = None) -> tuple[bool, Any]:
        """Move the call on; (True, its result) once complete, else (False, None)."""
        t0 = time.perf_counter()
        name = self._progress(False)
        flag, obj = MPI.Request.test(self, status)
        if flag:
            self._op = None
        if name:
            _timed(name, t0)
        return flag, obj

    def Wait(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Wait for the call to complete (its result is dropped)."""
        self._progress(True)
        self._op = None
        return MPI.Request.Wait(self, status)

    def Test(self, status: MPI.Status | None = None) -> bool:  # noqa: N802
        """Move the call on; whether it is complete (its result is dropped)."""
        self._progress(False)
        return MPI.Request.Test(self, status)

    @classmethod
    def waitall(cls, requests: list[MPI.Request],
                statuses: list[MPI.Status] | None = None) -> list[Any]:
        """``MPI.Request.waitall`` that moves the object collectives of the
        list on itself first: works at any thread level."""
        for req in requests:
            if isinstance(req, ObjectRequest):
                req._progress(True)
        return MPI.Request.waitall(requests, statuses)


# ------------------------------------------------------------ posting

def post(name: str, comm: MPI.Intracomm, mine: _Block | None,
         sends: dict[int, _Block], sources: list[int], own: int | None,
         finish: Callable[[dict[int, Any]], Any], t0: float) -> ObjectRequest:
    """Post call `name`: `sends` {dest: frame} (one _Outgoing per distinct
    frame; in the node heap or private), receives from `sources`, `mine`
    this rank's own frame (stored under rank `own`)."""
    outgoing: dict[int, _Outgoing] = {}
    for frame in sends.values():
        if id(frame) not in outgoing:
            outgoing[id(frame)] = _Outgoing(frame)
    wire = [(dest, outgoing[id(frame)]) for dest, frame in sends.items()]
    frames: dict[int, Any] = {} if mine is None else {own: mine}
    channel = _channel(comm) if comm.Get_size() > 1 else None
    op = _Op(name, channel, wire, sources, frames, finish, comm)
    req = op.request()
    if channel is None:
        op.posted = True
        op.release()
    else:
        channel.post(op)
        _start(op)
        _advance(op, False)   # (also posts calls queued before the duplicate was ready)
    _timed(name, t0)
    return req
