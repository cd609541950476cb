# The step protocol every algorithm is built from: publish a step (with the
# call's signature at its first), wait for every rank (keeping MPI
# progressing, sleeping where the kernel can wake the waiter), header steps
# that agree on a value or on where buffers live.
# (part of cxlmpi._pool: included by pyx/_pool.pyx)
#
# Sleeping on a peer's sequence number (ranks of one host, coherent memory).
# A waiter that has spun long enough announces in its own control line whom
# it sleeps on (`asleep`: the peer -- a peer is only ever awaited at its
# next step, so the step need not be said), makes that store visible to
# every CPU before it looks again (a full fence), reads the peer's seq once
# more, and only then sleeps: FUTEX_WAIT on that word with the value it just
# read, for a bounded time.  A publisher stores its seq, fences, reads every
# peer's `asleep`, and when one names it makes one FUTEX_WAKE on its seq
# word.  Store, fence, load on both sides: either the waiter's second read
# sees the new seq (it does not sleep) or the publisher's read sees the
# announcement (it wakes the word); a wake that comes before the waiter is
# in the kernel finds the word changed, and FUTEX_WAIT returns at once.  So
# no wake-up of a published step is lost, and a publisher pays a fence and
# p - 1 loads per step, a system call only when a peer sleeps on it.  (A
# peer that sends the call to MPI instead stores `passed`, not a new seq: it
# wakes its sleepers too, but one that was about to sleep then sleeps out
# its bound, at most 1 ms.)
#
# Each waiter also notes the CPU it waits on (`cpu`); a rank about to spin
# for a peer that last waited on its own CPU yields to it instead.  Both
# words only change how long a rank spins, yields or sleeps, never what it
# does: every rank decides alone.


cdef inline void publish(state_t *st) noexcept nogil:
    """Make this rank's writes of the next step visible, then announce it
    (with the call's signature when the step is the call's first).  In sw
    mode line 1 (the signature) is written back before the sequence number
    is stored, line 0 (seq, values) after."""
    cdef cxl_ctrl *line = ctrl(st, st.rank)
    cdef int k
    st.step += 1
    if st.sig_pending:
        for k in range(3):
            line.sig[k][st.step & 1] = st.sig[k]
        if st.sw:
            cxl_flush(line.sig, LINE_NBYTES, 0)
    cxl_store_release(&line.seq, st.step)
    if st.sw:
        cxl_flush(line, LINE_NBYTES, 0)
    else:
        wake_sleepers(st)


cdef inline void wake_sleepers(state_t *st) noexcept nogil:
    """After this rank stored its seq (or passed): wake the peers that
    announced they sleep on its seq word -- one system call, and only when
    one did (see the top of this file)."""
    cdef int q
    cdef uint32_t me = <uint32_t>st.rank + 1
    cxl_fence()
    for q in range(st.size):
        if q != st.rank and cxl_load32(&ctrl(st, q).asleep) == me:
            cxl_futex_wake(&ctrl(st, st.rank).seq)
            return


cdef inline bint may_sleep_on(state_t *st, cxl_ctrl *line) noexcept nogil:
    """Whether this rank may sleep on peer `line`'s seq word: both on one
    host (a futex is a kernel object of its host; the pool knows each
    rank's host), coherent memory (sw mode is memory shared across hosts),
    and futexes work on this mapping (they failed here once: no_futex)."""
    return not st.sw and not st.no_futex and line.host == ctrl(st, st.rank).host


cdef int passed_on(state_t *st, cxl_ctrl *line, bint ahead) noexcept nogil:
    """At this call's first step: has peer `line` sent this call to MPI?
    (1: yes, follow it; 0: no; 2: its step is of an earlier call, which this
    rank sent to MPI: not arrived yet; -1: the calls are out of step.)
    Calls are numbered alike on every rank (pool calls and passed ones).
    A peer that has not published this step yet (`ahead` false) passed it
    when its last passed call is this one or later and it still has not
    published this step (it made no pool step since).  One that has
    (`ahead`) passed it when that step belongs to a later call of its own
    (it went on after an MPI call that completed without this rank, an
    eager send): the signature carries the call's number (its low 16 bits:
    a peer cannot run that far ahead).  Then this rank takes its step back,
    marks the call passed too, and goes to MPI as well (1).  A later call
    of a peer that did not pass this one means the ranks' calls are out of
    step: a mismatch (-1), never a silent detour; so does a peer that found
    them out of step itself (`broken`: it raised, and makes no step of
    this call).  A step of an earlier call of the peer's is one this rank
    sent to MPI (2) when that call is among those it passed since its last
    call that ran in the pool -- passed on its own or followed: a rank
    slow to publish its step of a call the others followed may show it
    while they are several passed calls further (mpi4py's test_cco_buf at
    3 oversubscribed ranks)."""
    if st.sw:
        cxl_flush(line.sig, LINE_NBYTES, 1)
    if cxl_load_acquire(&line.broken):
        return -1   # it found the calls out of step (with this rank's or another's)
    if not ahead:
        if cxl_load_acquire(&line.passed) < st.ops:
            return 0
        # It passed this call or a later one -- a later one only after
        # publishing its step of this one, which the seq read first may
        # have missed: look again (seq is stored before passed).
        if st.sw:
            cxl_flush(line, LINE_NBYTES, 1)
        ahead = cxl_load_acquire(&line.seq) >= st.step
    cdef uint64_t theirs, behind
    if ahead:
        theirs = (line.sig[0][st.step & 1] >> 32) & 0xFFFF
        if theirs == st.ops & 0xFFFF:
            return 0
        behind = (st.ops - theirs) & 0xFFFF
        if behind < 0x8000 and ((ctrl(st, st.rank).passed & 0xFFFF) == theirs or
                                behind <= st.ops - st.passed_from):
            # An earlier call of the peer's, which this rank sent to MPI
            # (the last it passed, or one of those it passed on its own
            # since its last pool call: an MPI call that completed without
            # the peer -- a root's eager sends -- lets it run ahead of a
            # peer by many calls): the peer is about to see that, take its
            # step back and follow; keep waiting for its step of this call.
            return 2
        if line.passed < st.ops:
            return -1   # a later call that did not pass this one: out of step
    cdef cxl_ctrl *mine = ctrl(st, st.rank)
    st.step -= 1
    mine.passed = st.ops
    # This call is one of the passed ones now: a peer slow to publish its
    # step of it (or of one passed before it) may show that step while this
    # rank is calls ahead, past more calls it passed on its own.
    st.pool_ops = st.passed_from - 1
    if st.sw:
        cxl_flush(mine.sig, LINE_NBYTES, 0)
    cxl_store_release(&mine.seq, st.step)
    if st.sw:
        cxl_flush(mine, LINE_NBYTES, 0)
    else:
        wake_sleepers(st)
    return 1


cdef void mark_broken(state_t *st) noexcept nogil:
    """This rank found the ranks' calls out of step at this call's first
    step (`passed_on`: a peer's step of a call this rank made no step of):
    say so in its control line, so that peers waiting for its step of their
    call raise the mismatch too (they see only that this rank made no step
    of their call, and would wait, or follow its later passes to MPI)."""
    cdef cxl_ctrl *mine = ctrl(st, st.rank)
    cxl_store_release(&mine.broken, st.ops)
    if st.sw:
        cxl_flush(mine.sig, LINE_NBYTES, 0)
    else:
        wake_sleepers(st)


cdef void mark_passed(void *state) noexcept nogil:
    """Pool.note_pass: count the call, store its number as this rank's last
    call sent to MPI (nothing once unmapped or another job's), wake a peer
    asleep in the pool on this call (else it slept out up to 1 ms per passed
    call: 1000 follows at 3 oversubscribed ranks took 120 s on Open MPI)."""
    cdef state_t *st = <state_t *>state
    if st.base == NULL or revoked(st):
        return
    st.ops += 1
    cdef cxl_ctrl *line = ctrl(st, st.rank)
    cxl_store_release(&line.passed, st.ops)
    if st.sw:
        cxl_flush(line.sig, LINE_NBYTES, 0)
    else:
        wake_sleepers(st)


cdef inline void copy_in(state_t *st, void *slot, const void *src, size_t n) noexcept nogil:
    """Copy what this rank publishes into its half (in sw mode, or when the
    call's variant says so, with streaming stores straight to memory: no
    write-back pass afterwards, no dirty lines for the readers to snoop)."""
    if st.sw or st.stream:
        cxl_copy_out(slot, src, n)
    else:
        cxl_copy(slot, src, n)


cdef inline void wrote(state_t *st, const void *addr, size_t n) noexcept nogil:
    """Data this rank just stored in the pool (flushed in sw mode)."""
    if st.sw:
        cxl_flush(addr, n, 0)


cdef inline void will_read(state_t *st, const void *addr, size_t n) noexcept nogil:
    """Data this rank is about to load from a peer (invalidated in sw mode)."""
    if st.sw:
        cxl_flush(addr, n, 1)


cdef bint peer_gone(state_t *st, cxl_ctrl *line, uint64_t *seen,
                    double *since) noexcept nogil:
    """Whether the peer of control line `line` is gone.  In this pid
    namespace its pid says so; on this kernel, its lock (liveness.pxi: a
    stopped peer is not gone).  On another host its heartbeat (cxl_beat.h),
    judged by this process's monotonic clock: gone once the counter has
    stood still for its lease (CXLMPI_LEASE_BEATS of its periods; how long:
    st.still_s), which a peer that is merely late -- busy, descheduled, in
    a long GIL-holding call -- never reaches (its beat thread needs
    neither).  A peer that does not beat is waited for, up to the timeout.
    `seen`, `since`: the count last seen and when (0: not yet looked)."""
    cdef uint64_t beat, period
    cdef double now
    cdef int by_lock
    if line.host == host_id:
        return cxl_pid_gone(line.pid)
    by_lock = lock_gone(st, line)
    if by_lock >= 0:
        return by_lock
    if st.sw:
        cxl_flush_meta(&line.beat, 16, 1)
    beat = cxl_load_acquire(&line.beat)
    period = cxl_load_acquire(&line.beat_period_ns)
    if period == 0:
        return False
    now = cxl_now_s()
    if since[0] == 0 or beat != seen[0]:
        seen[0] = beat
        since[0] = now
        return False
    if not cxl_beat_expired(since[0], now, period, lease_beats):
        return False
    st.still_s = now - since[0]
    st.lease_s = <double>period * 1e-9 * <double>lease_beats
    return True


cdef inline bint peer_left(state_t *st, cxl_ctrl *line) noexcept nogil:
    """Whether the peer of control line `line`, alive, let go of the pool
    without publishing the step this rank waits for: it closed the pool
    after a call of its own failed there (a timeout, a peer it judged
    gone: cxlmpi.pools.state closes the communicator's pool then), and its
    step never comes -- waiting out CXLMPI_TIMEOUT for it (300 s) made a
    slow rank that arrived after its peer had timed out wait that long
    before it raised.  Its line says so (leave_line, a release store after
    every step it published: the seq read again here then shows each)."""
    if st.sw:
        cxl_flush(line, 8, 1)
    return cxl_load_acquire(&line.attached) == 0 and \
        cxl_load_acquire(&line.seq) < st.step


cdef inline void will_lend(state_t *st, const void *addr, size_t n) noexcept nogil:
    """A pool buffer of this rank that peers will read in place, or write
    into, at the next step (software coherence: written back first).  Its
    contents may come from anywhere -- NumPy code, MPI, an earlier call --
    so no kernel flushed them; and a receive buffer's own dirty lines,
    written back later, would land over what a peer pushed into it."""
    if st.sw and addr != NULL and n:
        cxl_flush(addr, n, 0)


cdef inline void will_write_into(state_t *st, char *dst, size_t n) noexcept nogil:
    """Before this rank writes [dst, dst + n) of a peer's pool buffer
    (software coherence): the partial lines at either end also hold bytes
    of the owner's, which it wrote back before lending the buffer; load
    them now, or their write-back would put back what this rank's cache
    held of them."""
    cdef uintptr_t head = <uintptr_t>dst & (LINE_NBYTES - 1)
    cdef uintptr_t tail = (<uintptr_t>dst + n) & (LINE_NBYTES - 1)
    if not st.sw or n == 0:
        return
    if head:
        cxl_flush(dst, 1, 1)
    if tail and (head == 0 or (<uintptr_t>dst + n - 1) // LINE_NBYTES
                 != <uintptr_t>dst // LINE_NBYTES):
        cxl_flush(dst + n - 1, 1, 1)


cdef inline size_t arena_room(state_t *st, uint64_t at1) noexcept nogil:
    """Bytes from a peer's offset + 1 `at1` to the end of the heap's arenas
    when it lies in them, else 0: a table a peer never wrote back (a
    protocol error, or the emulator's fault hooks) must not send this rank
    outside the pool."""
    if at1 == 0 or at1 - 1 < st.heap_lo or at1 - 1 >= st.heap_hi:
        return 0
    return st.heap_hi - (at1 - 1)


cdef inline bint line_aligned(uint64_t at1, size_t nbytes) noexcept nogil:
    """Whether the block at offset + 1 `at1` of `nbytes` (0 bytes: any)
    starts and ends on cache-line boundaries: blocks that several ranks
    write into one buffer must share no line (software coherence writes
    back whole lines)."""
    return nbytes == 0 or ((at1 - 1) % LINE_NBYTES == 0 and nbytes % LINE_NBYTES == 0)


cdef int wait_all(state_t *st) noexcept nogil:
    """Wait until every rank has published the current step, keeping MPI
    progressing meanwhile: spin briefly (or yield to the awaited peer when
    it last waited on this CPU), then sleep on its seq word (may_sleep_on)
    or back off.  At a call's first step, also: a peer that sent this call
    to MPI sends every rank there (ERR_PASSED), and the ranks' calls must
    match (ERR_MISMATCH).  A peer that closed its pool meanwhile (it failed
    and raised) ends the wait (ERR_LEFT), as one gone does (ERR_PEER_GONE)."""
    cdef int q, due, passed, rc = OK
    cdef cxl_ctrl *line
    cdef cxl_ctrl *mine = ctrl(st, st.rank)
    cdef cxl_waiter w
    cdef bint first = st.sig_pending
    cdef bint sleeps, announced
    cdef uint64_t seen
    cdef uint32_t cpu = 0
    cdef uint64_t beat_seen = 0
    cdef double beat_since = 0
    st.sig_pending = 0
    cxl_waiter_init(&w, st.timeout_s, st.spin)
    if not st.sw:
        cpu = cxl_this_cpu()
        if cxl_load32(&mine.cpu) != cpu:
            cxl_store32(&mine.cpu, cpu)
    for q in range(st.size):
        if q == st.rank:
            continue
        line = ctrl(st, q)
        sleeps = may_sleep_on(st, line)
        if sleeps and cpu != 0 and cxl_load32(&line.cpu) == cpu and w.polls < w.spin_polls:
            # q last waited on this very CPU, so it is likely queued behind
            # this rank: spinning would keep it off its core; yield to it
            w.polls = w.spin_polls
            w.yielding = True
        announced = False
        beat_since = 0
        while True:
            if st.sw:
                cxl_flush(line, 8, 1)
            passed = 0
            seen = cxl_load_acquire(&line.seq)
            if seen >= st.step:
                # (a step from another call: q passed this one, then went
                # on; or an earlier call of q's that this rank passed)
                if first:
                    passed = passed_on(st, line, True)
                if passed == 0:
                    break
            elif first:
                passed = passed_on(st, line, False)
            if passed == 1:
                rc = ERR_PASSED
                break
            if passed < 0:
                st.failed_rank = q
                st.failed_code = rc = ERR_MISMATCH
                mark_broken(st)
                break
            due = 0
            if sleeps and w.polls >= w.spin_polls and not w.yielding:
                if not announced:
                    # say whom this rank sleeps on, then look once more
                    cxl_store32(&mine.asleep, q + 1)
                    cxl_fence()
                    announced = True
                    continue
                if st.progress.iprobe != NULL and cxl_progress_poke(&st.progress):
                    # MPI had work: a peer moves traffic through this rank
                    # (passive-target RMA, a rendezvous message), packet by
                    # packet, each waiting for this rank's next progress
                    # call -- one per sleep of up to 1 ms made a 1 MiB
                    # Accumulate take 0.14 s.  Keep progressing it, yielding
                    # the core between calls, for a while before sleeping.
                    w.yielding = True
                    w.yield_end_s = 0.0
                    continue
                due = cxl_futex_sleep(&w, &line.seq, seen)
                if due < 0:
                    st.no_futex = 1   # this mapping takes no futex: back off
                    sleeps = False
                    due = 0
            else:
                if st.progress.iprobe != NULL and cxl_progress_due(w.polls, w.spin_polls) \
                        and cxl_progress_poke(&st.progress):
                    # still work: yield (and progress) longer; backing off,
                    # go back from naps to yields
                    w.yield_end_s = 0.0
                    if not sleeps and w.polls > w.spin_polls:
                        w.polls = w.spin_polls
                if sleeps and w.yielding and w.polls >= w.spin_polls:
                    due = cxl_hand_over(&w)
                elif sleeps:
                    cxl_spun(&w)
                else:
                    due = cxl_backoff(&w)
            if due:
                if st.quit:
                    st.failed_rank = st.rank
                    st.failed_code = rc = ERR_CLOSED
                    break
                if revoked(st):
                    st.failed_rank = st.rank
                    st.failed_code = rc = ERR_REVOKED
                    break
                if peer_gone(st, line, &beat_seen, &beat_since):
                    st.failed_rank = q
                    st.failed_code = rc = ERR_PEER_GONE
                    break
                if peer_left(st, line):
                    st.failed_rank = q
                    st.failed_code = rc = ERR_LEFT
                    break
                if w.deadline_s > 0 and cxl_now_s() > w.deadline_s:
                    st.failed_rank = q
                    st.failed_code = rc = ERR_TIMEOUT
                    break
        if announced:
            cxl_store32(&mine.asleep, 0)
        if rc != OK:
            return rc
    if revoked(st):
        st.failed_rank = st.rank
        st.failed_code = ERR_REVOKED
        return ERR_REVOKED
    if first:
        return check_signatures(st)
    return OK


def wait_counts():
    """This process's waits so far: ``futex_sleeps`` (sleeps on a peer's
    word), ``futex_timeouts`` (those that ended by their bound, not by a
    wake-up), ``futex_wakes`` (wake-ups this process made: a peer was
    asleep on it), ``hand_overs`` (yields to the ranks sharing the CPU),
    ``backoff_rounds`` (yields and naps where no futex applies)."""
    return {"futex_sleeps": cxl_futex_sleeps, "futex_timeouts": cxl_futex_timeouts,
            "futex_wakes": cxl_futex_wakes, "hand_overs": cxl_hand_overs,
            "backoff_rounds": cxl_backoff_rounds}


def set_sleep_bounds(double first_s, double max_s):
    """Bounds of one futex sleep: the first of a wait (default 50 us), and
    the most it grows to, doubling (default 1 ms).  MPI progress, the
    deadline and peer liveness are looked at after each sleep.  Tests set
    both to an hour, so that a lost wake-up hangs the job."""
    global cxl_sleep_first_ns, cxl_sleep_max_ns
    cxl_sleep_first_ns = max(<long>(first_s * 1e9), 1000)
    cxl_sleep_max_ns = max(<long>(max_s * 1e9), cxl_sleep_first_ns)


cdef inline int step_all(state_t *st) noexcept nogil:
    publish(st)
    return wait_all(st)


cdef int agree_max(state_t *st, uint64_t mine, uint64_t pairs, const uint64_t *extra,
                   uint64_t *result, uint64_t *extra_max) noexcept nogil:
    """A header step: every rank publishes `mine`; all learn the maximum
    (0 from any rank, meaning "not mine", makes the result 0).  `pairs`:
    this rank's share of the block checksum (see check_signatures), checked
    only when every rank takes the pool path (a rank that declines may not
    know its blocks): where it does not add up (a block is not the size its
    receiver names: MPICH takes a receive count above what arrives), the
    result is 0 too, and every rank hands the call to MPI, which does what
    stock MPI does with it.  `extra[0..1]` (the first two words of its
    half): all learn the maximum of each too (timings, for cxlmpi.select)."""
    cdef int q, rc
    cdef uint64_t v, best = 0, total = 0, most0 = 0, most1 = 0
    cdef bint any_zero = mine == 0
    cdef uint64_t *word
    value_ptr(st, st.rank, st.step + 1)[0] = mine
    value2_ptr(st, st.rank, st.step + 1)[0] = pairs
    word = <uint64_t *>half_ptr(st, st.rank, st.step + 1)
    word[0] = extra[0]
    word[1] = extra[1]
    wrote(st, word, 16)
    rc = step_all(st)
    if rc != OK:
        return rc
    for q in range(st.size):
        if st.sw and q != st.rank:
            cxl_flush(value_ptr(st, q, st.step), 8, 1)
        word = <uint64_t *>half_ptr(st, q, st.step)
        if q != st.rank:
            will_read(st, word, 16)
        if word[0] > most0:
            most0 = word[0]
        if word[1] > most1:
            most1 = word[1]
        v = value_ptr(st, q, st.step)[0]
        total += value2_ptr(st, q, st.step)[0]
        if v == 0:
            any_zero = True
        if v > best:
            best = v
    # (a rank that refused its message publishes all ones: it raises anyway)
    if total != 0 and best != <uint64_t>0xFFFFFFFFFFFFFFFF:
        any_zero = True
    result[0] = 0 if any_zero else best
    extra_max[0] = most0
    extra_max[1] = most1
    return OK


#
# Buffers that live in the pool (cxlmpi.empty & co.) are read and written in
# place by their peers, by offset.  A large collective first runs a header
# step in which every rank publishes where its buffers are (offset + 1, or
# 0 for private memory); all ranks see the same values, so all pick the same
# path, and a rank whose buffer is read or written by peers returns only
# after a completion step, when every peer is done with it.


cdef int publish_offsets(state_t *st, uint64_t send1, uint64_t recv1,
                         uint64_t *sends, uint64_t *recvs) noexcept nogil:
    """Header step: every rank's (send offset + 1, recv offset + 1).  It is
    the call's first step, so every rank's message size is checked to be
    the same (check_signatures) before anyone writes into a peer's buffer.
    (The caller writes back the pool buffers it lends: will_lend.)"""
    cdef int q, rc
    value_ptr(st, st.rank, st.step + 1)[0] = send1
    value2_ptr(st, st.rank, st.step + 1)[0] = recv1
    rc = step_all(st)
    if rc != OK:
        return rc
    for q in range(st.size):
        if st.sw and q != st.rank:
            cxl_flush(ctrl(st, q), LINE_NBYTES, 1)
        sends[q] = value_ptr(st, q, st.step)[0]
        recvs[q] = value2_ptr(st, q, st.step)[0]
    return OK


cdef bint all_fit(state_t *st, const uint64_t *v, int n, size_t nbytes) noexcept nogil:
    """Every value is an offset + 1 with `nbytes` after it inside the
    arenas (arena_room: a stale table must not send a copy into the
    control lines or the halves; the heap's arenas lie at the same offsets
    on every rank, so all decide alike)."""
    cdef int q
    for q in range(n):
        if v[q] == 0 or arena_room(st, v[q]) < nbytes:
            return False
    return True


cdef int publish_block_offsets(state_t *st, const char **send_addr,
                               const size_t *send_nbytes, char **recv_addr,
                               const size_t *recv_nbytes,
                               bint *pull, bint *push) noexcept nogil:
    """Header step of the personalized collectives.  Every rank writes, in
    its half, three tables of p words: where its block for each rank lives
    (offset + 1, or 0: private), where the block from each rank goes in its
    receive buffer, and that block's size (an empty block counts as in the
    pool).  Every rank reads every table, so all decide alike: `pull` when
    every send block is in the pool (readers copy from the owners), else
    `push` when every receive block is (writers copy into the receivers).
    In place (a block both sent and received) neither: one rank's reading
    would race another's writing."""
    cdef uint64_t *mine = <uint64_t *>half_ptr(st, st.rank, st.step + 1)
    cdef const uint64_t *theirs
    cdef int q, d, rc, p = st.size
    cdef bint inplace = False
    for d in range(p):
        if d != st.rank and send_nbytes[d] and <const char *>recv_addr[d] == send_addr[d]:
            inplace = True
    for d in range(p):
        mine[d] = 1 if send_nbytes[d] == 0 else \
            resident(st, send_addr[d], send_nbytes[d])
        mine[p + d] = 1 if recv_nbytes[d] == 0 else \
            resident(st, recv_addr[d], recv_nbytes[d])
        mine[2 * p + d] = recv_nbytes[d]
        if inplace:
            mine[d] = 0
            mine[p + d] = 0
        # lent to the peers from the next step on: written back first
        if mine[d] > 1:
            will_lend(st, send_addr[d], send_nbytes[d])
        if mine[p + d] > 1:
            will_lend(st, recv_addr[d], recv_nbytes[d])
    wrote(st, mine, 3 * p * 8)
    rc = step_all(st)
    if rc != OK:
        return rc
    pull[0] = True
    push[0] = True
    for q in range(p):
        theirs = <const uint64_t *>half_ptr(st, q, st.step)
        will_read(st, theirs, 3 * p * 8)
        for d in range(p):
            if theirs[d] == 0:
                pull[0] = False
            if theirs[p + d] == 0:
                push[0] = False
            elif st.sw and not line_aligned(theirs[p + d], theirs[2 * p + d]):
                push[0] = False   # several writers into one line: not in sw mode
    return OK
