"""The lock of a partition table (cxlmpi.memory.partitions): a file lock among this
host's processes, and among hosts Fischer's timed protocol on plain stores
-- no atomic read-modify-write across hosts, which CXL 2.0 multi-host
sharing does not promise (see cxlmpi.memory.backends).

`TableLock` is the half of `cxlmpi.memory.partitions.Device` that takes and gives
back that lock; it works on the table words of the Device it is part of
(`_load`, `_store`, `_address`) and on its `fd`, `spec`, `_thread_lock`,
`_lock_depth` and `fischer_retries`."""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

from .. import _pool, config
from ..errors import CXLMPIPoolError
from .liveness import DEAD, HOST, Watch, pid_verdict, start_time

__all__ = ["TableLock", "LINE", "LOCK_AT", "L_TOKEN", "L_HOST", "L_PID", "L_START",
           "L_BEAT", "L_PERIOD", "L_INSIDE", "L_WORDS", "LOCK_WAIT_S"]

LINE = 128                       # one writer per 128-byte line
LOCK_AT = LINE                   # the lock line (L_* words)
FISCHER_DELAY_S = 0.005          # > the longest read-then-write of a claimer
FISCHER_GRACE_S = 0.1            # after a late write: time for a holder to show
LOCK_WAIT_S = 60.0               # give up waiting for a live holder after this
UNNAMED_LOCK_S = 10.0            # a token without a holder's name: dead after this
# Lock words: the token (Fischer's word, which any claimer writes) alone in
# the first 64 bytes; in the second, written only by the holder once it holds
# the lock: host, pid, start time, heartbeat, period, and its token again
# ("inside": who is in; a late writer's check that nobody got in meanwhile).
# One writer per cache line: hosts without coherence write back whole lines.
L_TOKEN = 0
L_HOST, L_PID, L_START, L_BEAT, L_PERIOD, L_INSIDE = range(8, 14)
L_WORDS = 14


class TableLock:
    """Taking and giving back a partition table's lock (a part of Device)."""

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table lock: a file lock among this host's processes, and
        Fischer's protocol on the lock line among hosts.  Re-entrant in the
        holding thread: a pool whose last array a garbage collection frees
        in the middle of claim() releases its partition right there."""
        with self._thread_lock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            fcntl.lockf(self.fd, fcntl.LOCK_EX, 8, 0)
            try:
                token = self._acquire()
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0
                    self._release_lock(token)
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 0)

    def _acquire(self) -> int:
        """Fischer's protocol: read the lock word; when free (or its holder
        is shown gone), write a token, wait FISCHER_DELAY_S, read it back.
        It is safe only if no claimer takes longer than that delay from its
        read to its write, so the gap is measured: a claimer that was
        paused there (preempted, a garbage collection) may have overwritten
        a holder that got in meanwhile; it waits FISCHER_GRACE_S for such a
        holder to show itself (L_INSIDE), hands its token back if one did,
        and tries again.  A holder names itself, then reads the word once
        more: overwritten by a late writer meanwhile, it steps back.  Any
        exception leaves nothing of this claimer in the lock line."""
        token = secrets.randbits(63) | 1
        try:
            return self._fischer(token)
        except BaseException:
            self._release_lock(token)
            raise

    def _fischer(self, token: int) -> int:
        word = LOCK_AT // 8
        watch = Watch()
        deadline = time.monotonic() + LOCK_WAIT_S
        pid = os.getpid()
        me = [HOST, pid, start_time(pid), 0, _pool.heartbeat()[0], token]  # ready to name
        while True:
            t0 = time.monotonic()
            held = self._load(word)[L_TOKEN]
            name = self._load(word + L_HOST, L_WORDS - L_HOST)
            inside = name[L_INSIDE - L_HOST]
            if held not in (0, token):
                if self._lock_verdict(held, name, watch) != DEAD:
                    if time.monotonic() > deadline:
                        raise CXLMPIPoolError(
                            f"{self.spec}: the partition table lock is held by pid "
                            f"{name[L_PID - L_HOST]} on host {name[0]:#x}, alive as far "
                            f"as can be told; `--pool-reset` clears it once it is gone")
                    time.sleep(FISCHER_DELAY_S)
                    continue
                if any(name):
                    self._store(word + L_HOST, [0] * (L_WORDS - L_HOST))  # the dead one's
            elif inside not in (0, token):
                # someone got in and named itself after this claimer's (late)
                # write: the lock is theirs
                self._store(word, [inside])
                time.sleep(FISCHER_DELAY_S)
                continue
            self._store(word, [token])
            if time.monotonic() - t0 > FISCHER_DELAY_S:
                self.fischer_retries += 1
                time.sleep(FISCHER_GRACE_S)
                inside = self._load(word + L_INSIDE)[0]
                if inside and inside != token and self._load(word)[0] == token:
                    self._store(word, [inside])        # not ours: give it back
                continue
            time.sleep(FISCHER_DELAY_S)
            if self._load(word)[0] != token:
                continue
            self._store(word + L_INSIDE, [token])
            _pool.beat_add(self._address + 8 * (word + L_BEAT),
                           self._address + 8 * (word + L_INSIDE), token)
            self._store(word + L_HOST, me)
            if self._load(word)[0] == token:
                return token
            self._unname(token)                        # a late writer came between

    def _unname(self, token: int) -> None:
        """Stop beating the lock word and clear the holder's name, if it is
        this claimer's (never another holder's)."""
        word = LOCK_AT // 8
        _pool.beat_remove(self._address + 8 * (word + L_BEAT))
        if self._load(word + L_INSIDE)[0] == token:
            self._store(word + L_HOST, [0] * (L_WORDS - L_HOST))

    def _release_lock(self, token: int) -> None:
        word = LOCK_AT // 8
        self._unname(token)
        if self._load(word)[0] == token:
            self._store(word, [0])

    def _lock_verdict(self, held: int, name: list[int], watch: Watch) -> str:
        """Whether the holder of token `held` lives (`name`: the words from
        L_HOST on).  A name counts only while it is that token's (L_INSIDE);
        before its holder has written it (between its write and its
        read-back, a few ms) the token is judged by standing still for
        UNNAMED_LOCK_S."""
        host, pid, start, beat, period, inside = name
        if inside != held:
            return watch.verdict(("token", held), 0,
                                 int(UNNAMED_LOCK_S * 1e9 / config.get().lease_beats))
        if host == HOST:
            return pid_verdict(pid, start)
        return watch.verdict(("lock", held), beat, period)

