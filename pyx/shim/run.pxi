# What every intercepted collective shares once its messages are parsed:
# the block checksums of the v-collectives, the header step that settles
# their path (`settle`, `settle_rooted_v`), running a pool algorithm with a
# pass-through when a peer sent the call to MPI (`run`), and the checks
# common to every reduction (`plan_reduce`).
# (part of cxlmpi._shim: included by pyx/_shim.pyx)


cdef inline uint64_t pairs_sent(int me, Vector v, Py_ssize_t item):
    """This rank's share of the block checksum for the blocks it sends
    (`v.counts[d]` elements of `item` bytes to rank d): see _pool.pair_hash."""
    cdef uint64_t total = 0
    cdef Py_ssize_t d
    for d in range(v.blocks):
        total += <uint64_t>pair_hash(me, d, v.counts[d] * item)
    return total


cdef inline uint64_t pairs_received(int me, Vector v, Py_ssize_t item):
    """The share for the blocks it receives (`v.counts[q]` from rank q)."""
    cdef uint64_t total = 0
    cdef Py_ssize_t q
    for q in range(v.blocks):
        total -= <uint64_t>pair_hash(q, me, v.counts[q] * item)
    return total


# The header value of a rank whose own message was refused (a count or
# displacement outside its buffer): never 1 + a block's bytes, which live in
# memory.  Every rank that sees it raises, so none is left waiting.
cdef uint64_t REFUSED = 0xFFFFFFFFFFFFFFFF


cdef inline bint alone(int which, uint64_t local, int size) noexcept:
    """Whether a rank whose header value would be `local` (1 + its
    largest block, 0: it cannot take the pool path) sends a v-collective
    to MPI on its own: it cannot take the pool, or its largest block puts
    the call past the pool's window, or its blocks are all below it.  The
    last is a rule, not a certainty: a peer's blocks may be larger.  The
    v-collectives take the pool only when no rank's blocks are all small
    (the root of Gatherv and Scatterv knows every count, the others know
    their own), so that a small call costs no header step on any rank."""
    if local == 0:
        return True
    cdef Py_ssize_t nbytes = <Py_ssize_t>(local - 1) * size
    return not within(which, nbytes)


cdef tuple settle(object comm, int which, bint eligible, uint64_t local, int size,
                  int root=-1, uint64_t pairs=0, object refused=None, tuple uniform=None,
                  bint scratched=False):
    """(state, agreed, path code) for a v-collective: in a header step every
    rank publishes 1 + its largest block (0: it cannot take the pool path)
    and its share of the block checksum (`pairs`), and all decide alike
    from the maximum (code 0: MPI, FOLLOW: MPI after a peer passed the
    call, > 0: the pool).  The header carries the selector's report.  A
    rank that refused its message (`refused`: the error) publishes REFUSED
    and raises it; the others raise too.  Where its message is parsed on a
    scratch copy (`scratched`), it goes to MPI as its peers do -- at once
    by the rules below, or following a peer that passed -- and MPI runs
    it on the copy (a rank raising alone there left its peers in MPI).

    A rank that sends the call to MPI by the rule of `alone` does so at
    once (code 0, with a pass mark that its peers in the header step
    follow): small calls cost no header step.  So does one of a call
    whose blocks are all alike (Gather, Scatter: `uniform`, this rank's
    messages) where its class is settled on MPI (`settled_on_mpi`, as
    `take` decides for the other collectives): every rank whose blocks
    are the size its peers' are decides so, and a rank whose are not is
    followed to MPI, where the header step would have sent them all."""
    global learning
    learning = False
    set_run_routes(NULL)   # (as `skip`: a call whose MPI raised lends no mark)
    if not eligible:
        return None, 0, 0
    state = state_of(comm, which)   # (set up alike on every rank, even one that passes)
    if state is None:
        if refused is not None and not scratched:
            raise refused
        return None, 0, 0
    # (not across pool groups: a leader that passes cannot tell the others)
    if (refused is None or scratched) and (alone(which, local, size) or uniform is not None
                                           and state.only is None
                                           and settled_on_mpi(state, which, (local - 1) * size,
                                                              uniform)):
        return None, 0, 0
    cdef uint64_t agreed, most, spent
    cdef Routes r = state.routes
    cdef double t0 = 0.0
    cdef bint going = r is not None and run_goes_on(r, which)
    try:
        if r is None or going:   # (going: no report, the run goes on)
            agreed = state.pool.agree(REFUSED if refused is not None else local,
                                      COLLECTIVES[which], root, pairs)
        else:
            t0 = now()
            report, mine = r.selector.report()
            agreed, most, spent = state.pool.header(
                REFUSED if refused is not None else local, COLLECTIVES[which], root, pairs,
                report, mine, r.spent_ns)
    except PoolFailure as exc:
        if exc.passed:   # a peer sent the call to MPI: follow (or raise)
            if refused is None or scratched:
                return None, 0, FOLLOW
            raise refused from None
        raise run_failed(comm, exc) from None
    if r is not None and not going:
        r.selector.delivered(most, spent)
        r.spent_ns = <uint64_t>((now() - t0) * 1e9)
    if refused is not None:
        raise refused
    if agreed == REFUSED:
        from .errors import CXLMPIMessageError

        raise CXLMPIMessageError(
            f"cxlmpi: {COLLECTIVES[which]}: another rank's message runs outside "
            f"its buffer (that rank raised the details)")
    if agreed == 0 or not within(which, (agreed - 1) * size):
        return None, 0, FOLLOW
    if going and (cxl_size_class((agreed - 1) * size) != r.run_sc or
                  r.where[which][r.run_sc] != r.run_pl):
        r.selector.abandon_run()   # (a call of another class: the run ends untimed)
    code = take_agreed(state, which, (agreed - 1) * size)
    return (state, agreed, code) if code > 0 else (state, agreed, FOLLOW)


cdef bint across_groups(object comm, int which) except -1:
    """Whether `comm`'s pool spans pool groups for `which` (its state set up
    here where it was not, as `settle` would next).  There a root whose
    own block is None (mpi4py: no elements of its own) decides as with
    IN_PLACE, from its whole message as its peers decide: a leader that
    sends a call to MPI alone cannot tell the other groups, whose leaders
    waited for it (mpi4py's test_cco_buf under CXLMPI_POOL_GROUPS=2).  In
    one pool such a root sends the call to MPI at once, and its peers
    follow its pass."""
    state = state_of(comm, which)
    return state is not None and state.only is not None


cdef tuple settle_rooted_v(object comm, int which, object vbuf, bint vwritable,
                           object own, int root, int size, int rank):
    """Gatherv / Scatterv: parse the root's vector message (`vbuf`, its
    counts in elements) and every rank's own block (`own`; at the root it
    may be IN_PLACE), then settle the path as `settle` does.  Returns
    (state, agreed, path code, the root's Vector, own message).  Only the
    root reads `vbuf`.  A message outside its buffer is parsed on a
    scratch copy (refusals.pxi) and the rank decides as its peers do: MPI
    runs the call on the copy, or the header step makes every rank raise."""
    cdef Vector vec = None
    cdef Message mine = None
    cdef uint64_t local = 0
    eligible = not disabled and lo[which] != NEVER and 0 <= root < size
    ok = eligible
    refused = None
    try:
        if ok and rank == root:
            vec = vector(vbuf, vwritable, size)
            ok = vec is not None
        if ok and not (rank == root and (own is _IN_PLACE or
                                         own is None and across_groups(comm, which))):
            mine = message(own, not vwritable, 0, 0, STAGE_NONE)
            ok = mine is not None and (rank != root or
                                       mine.nbytes == vec.counts[rank] * vec.m.itemsize
                                       and not aliased(mine, vec.m))
    except ValueError as exc:   # (counts past what memory holds: raised at once)
        refused, ok = exc, False
    else:
        if eligible:
            refused = take_refusal()
    # (where MPI may run the call on the scratch copy: `pass_vector` hands
    # it the parsed messages, never the user's buffers, where these hold)
    parsed = refused is not None and straight and \
        (rank != root or vector_fits(vec)) and \
        (rank == root if own is _IN_PLACE else count_fits(mine))
    cdef uint64_t pairs = 0
    cdef Py_ssize_t item, i
    if ok:
        local = 1 + (vec.largest * vec.m.itemsize if rank == root else mine.nbytes)
    if ok and not alone(which, local, size):
        # the root's blocks against each rank's own (the root's own block
        # was checked above); Gatherv: ranks send, Scatterv: they receive
        if rank == root:
            # the root's own block is not exchanged: its terms cancel
            item = vec.m.itemsize
            for i in range(size):
                if i != root:
                    if vwritable:
                        pairs -= <uint64_t>pair_hash(i, root, vec.counts[i] * item)
                    else:
                        pairs += <uint64_t>pair_hash(root, i, vec.counts[i] * item)
        elif vwritable:
            pairs = <uint64_t>pair_hash(rank, root, mine.nbytes)
        else:
            pairs = -<uint64_t>pair_hash(root, rank, mine.nbytes)
    state, agreed, code = settle(comm, which, eligible, local, size, root, pairs, refused,
                                 None, parsed)
    return state, agreed, code, vec, mine


cdef tuple settle_rooted(object comm, int which, object sendbuf, object recvbuf,
                         int root, int size, int rank):
    """Gather / Scatter: the path settled as for their v-variants, in a
    header step.  A rank other than the root knows only its own block,
    and MPI lets the receiving side name more than arrives (mpi4py infers
    the count from the buffer; MPICH takes it): a Scatter whose receive
    buffers are twice the block, a Gather root's buffer twice the data.
    Decided from each rank's own block, such a call went to the pool on
    some ranks and to MPI on others (a hang in the pool's set-up) or ran
    with sizes that do not match.  Here every rank publishes 1 + its block
    and its share of the block checksum: where every block is the size
    its receiver expects, the pool runs it; where one is not, every rank
    goes to MPI, which does what stock MPI does.  Returns (state, agreed,
    path code, the root's whole message (Gather: receive, Scatter: send;
    None elsewhere), own block (None: IN_PLACE at the root), parsed)."""
    cdef bint gathering = which == GATHER
    cdef Message whole = None, mine = None
    cdef Py_ssize_t block = -1
    cdef uint64_t local = 0, pairs = 0
    cdef int i
    eligible = not disabled and lo[which] != NEVER and 0 <= root < size
    own = sendbuf if gathering else recvbuf
    refused = None
    if eligible:
        try:
            if rank == root:
                whole = message(recvbuf if gathering else sendbuf, gathering, size, lo[which])
                if whole is not None:
                    block = whole.nbytes
                    if own is not _IN_PLACE and not (own is None and
                                                     across_groups(comm, which)):
                        mine = message(own, not gathering, 0, lo[which] // size)
                        if mine is None or mine.nbytes != block or aliased(mine, whole):
                            block = -1
            else:
                mine = message(own, not gathering, 0, lo[which] // size)
                if mine is not None:
                    block = mine.nbytes
        except ValueError as exc:   # (counts past what memory holds: raised at once)
            refused, block = exc, -1
        else:
            # outside its buffer: parsed on a scratch copy that MPI may run
            refused = take_refusal()
    if block >= 0:
        local = 1 + block
    # (where MPI may run the call on the scratch copy: `pass_move` hands it
    # the parsed messages, never the user's buffers, where these hold)
    scratched = refused is not None and block >= 0 and straight and \
        sendbuf is not _IN_PLACE and recvbuf is not _IN_PLACE and \
        (whole is None or take_fits(whole)) and (mine is None or take_fits(mine))
    if block >= 0 and not alone(which, local, size):
        # Gather: ranks send to the root; Scatter: the root sends to them
        if rank == root:   # (its own block is not exchanged)
            for i in range(size):
                if i != root:
                    if gathering:
                        pairs -= <uint64_t>pair_hash(i, root, block)
                    else:
                        pairs += <uint64_t>pair_hash(root, i, block)
        elif gathering:
            pairs = <uint64_t>pair_hash(rank, root, block)
        else:
            pairs = -<uint64_t>pair_hash(root, rank, block)
    state, agreed, code = settle(comm, which, eligible, local, size, root, pairs, refused,
                                 (whole, mine), scratched)
    return state, agreed, code, whole, mine, eligible


cdef object run_failed(object comm, object exc):
    """The error the user sees for a pool failure `exc`; where a peer may
    have finished the collective (a timeout, a peer judged gone; a refusal
    across pool groups: the other groups may not have needed the refusing
    rank's), the MPI barrier it waits for at the end is posted
    (`abandon_order`)."""
    state = _states.get(comm.handle)
    if not exc.mismatch:
        abandon_order(state)
        if state is not None and state.order is not None:
            state.stuck = True   # (a posted call's late barrier: only MPI holds it)
    err = _fail(comm, state, exc)
    if exc.mismatch and state is not None and state.error is err:
        from .errors import CXLMPIMessageError

        if isinstance(err, CXLMPIMessageError):
            abandon_order(state)   # (a refusal: the pool is closed)
    return err


cdef int run(object comm, int which, int code, object stock, tuple stock_args,
             object method, tuple args) except -9:
    """Run a pool algorithm with the variant of path `code` (1 if it ran
    zero-copy, else 0), turning its failure into the error the user sees (a
    timeout naming the missing ranks, a dead peer, calls that do not
    match); when a peer sent this call to MPI, call `stock(*stock_args)`
    (the stock collective) instead, as every rank does then (-1).  (No
    lambda: a method that makes a closure allocates its scope on every
    call, pass-through or not.)"""
    if _refusals:
        err = take_refusal()
        if err is not None:   # (before the pool touches a byte of it)
            state = comm_state(comm)
            abandon_order(state)
            raise _refuse(comm, state, err)
    try:
        if code > 1:
            res = method(*args, flags=code - 1)
        else:
            res = method(*args)
    except PoolFailure as exc:
        if not exc.passed:
            raise run_failed(comm, exc) from None
    else:
        order(comm, which)
        if res:
            stat_zc[which] += 1
            return 1
        return 0
    stock(*stock_args)
    stat_pass[which] += 1
    return -1


cdef int order(object comm, int which) except -1:
    """End a pool collective (`which`; -1: an object collective) as stock
    MPI's own would end for the rank's earlier MPI traffic
    (CXLMPI_ORDERING): with a barrier through MPI on the state's private
    duplicate of the communicator.  Stock MPI's collective moves its
    messages through the same channels as the program's own, in order, so a
    rank leaves it only after what its peers sent before entering it (an
    eager send, the completion of an RMA access epoch) has reached its MPI,
    and its own earlier sends have left; the pool moves nothing through
    MPI, and mpi4py's own tests (an Iprobe, a Win.Test after a Barrier) saw
    that traffic missing.  The barrier restores the order where MPI has it,
    at the cost of one MPI barrier per pool collective.  It is nonblocking,
    tested until CXLMPI_TIMEOUT: a peer that raised in the pool collective
    after this rank finished it never comes (the error then says so)."""
    state = comm_state(comm)
    probe = None if state is None else state.order
    if probe is None:
        return 0
    cdef uintptr_t at = state.order_at if found else 0
    cdef cxl_h h = cxl_mpi_read(<const void *>at) if at else 0
    cdef int ierr = 0, late
    if h == 0 or h == COMM_NULL_H:
        late = order_through_mpi4py(state)
    else:
        with nogil:
            late = cxl_mpi_order(h, order_timeout_s, &ierr)
        if ierr != 0:
            raise MPI.Exception(ierr)
        state.stuck |= late   # (its request stays with MPI, never waited)
    if late:
        what = COLLECTIVES[which] if which >= 0 else "an object collective"
        raise _order_failed(comm, state, what)
    return 0


cdef int order_through_mpi4py(object state) except -1:
    """`order`'s barrier where the library's functions were not found: the
    same nonblocking barrier through mpi4py, tested with the same pauses
    until CXLMPI_TIMEOUT (1 then, else 0)."""
    request = state.order.Ibarrier()
    cdef cxl_pause pause
    cdef int late = 0
    pause.polls = pause.sleep_ns = 0
    pause.first_s = 0
    while not late and not request.Test():
        with nogil:
            late = cxl_mpi_pause(&pause, order_timeout_s)
    if late:
        state.left.append(request)
        state.stuck = True
    return late


cdef void abandon_order(object state) noexcept:
    """Post the MPI barrier that ends a pool collective without waiting for
    it (see `order`): a rank that failed in the pool (a timeout, a peer
    judged gone) while its peers finished lets them finish, instead of
    leaving them to wait out CXLMPI_TIMEOUT.  The communicator's pool is
    closed after this: nothing else is posted on it.  The request stays
    with the state: the barrier's communicator is freed with the user's
    only where it has completed by then (`_State.free`; Open MPI crashed
    progressing a barrier whose communicator had been freed)."""
    if state is None or state.order is None:
        return
    try:
        state.left.append(state.order.Ibarrier())
    except Exception:  # noqa: BLE001 - already failing: nothing to add
        pass


def order_calls(comm):
    """`order` for the object collectives (cxlmpi.communicator.objects): once at the
    end of each."""
    order(comm, -1)


def run_pool(comm, method, *args):
    """Call a pool method (the object collectives' steps: their paths are
    agreed before, so a peer in MPI here is a mismatch) and return its
    result, or raise the error the user sees."""
    try:
        return method(*args)
    except PoolFailure as exc:
        raise run_failed(comm, exc) from None


cdef inline object plan_reduce(object comm, int which, object sendbuf, object recvbuf,
                               object op, bint receiving):
    """(send, recv, op code, whether the pool can take it) when the
    messages are parsed (they go straight to MPI where the pool does not
    take the call), None otherwise; `send` stands for the receive buffer
    when sendbuf is IN_PLACE."""
    cdef Message send, recv = None
    if disabled or skip(comm, which, recvbuf if receiving and sendbuf is _IN_PLACE
                        else sendbuf):
        return None
    opc = op_code(op)
    if opc is None:
        return None
    if receiving:
        recv = message(recvbuf, True, 0, 0, STAGE_DEVICE)
        if recv is None:
            return None
        if sendbuf is _IN_PLACE:
            send = recv
        else:
            send = message(sendbuf, False, 0, 0, STAGE_DEVICE)
            if (send is None or send.count != recv.count
                    or send.handle != recv.handle
                    or aliased(send, recv)):
                return None
    else:
        send = message(sendbuf, False, 0, 0, STAGE_DEVICE)
        if send is None:
            return None
    return send, recv, opc, within(which, send.nbytes) and send.tcode >= 0 \
        and reducer_defined(opc, send.tcode)
