"""Online path selection: each communicator measures its own paths and keeps
the fastest (CXLMPI_TUNING=adaptive, the default).

A *class* is one collective, one power-of-two size class (bytes of all
blocks together, as the dispatcher counts them) and one buffer placement
(``private``: the pool path copies through the ranks' halves; ``pool``: it
ran zero-copy, every rank's buffers in the arenas).  Its *candidates* are
stock MPI and the pool variants that can matter for it: regular or
streaming stores into the halves, CXLMPI_CHUNK_SIZE steps or whole halves,
every-rank-reduces or reduce-scatter + allgather (`candidates`).

Every rank must take the same path for the same call, so a `Learner`
changes only on data that every rank holds identically:

- the calls that learn (exploration and re-checks) open with a header step
  in the pool (``Pool.header``), which every rank of the pool takes or none
  does (a rank that sends the call to MPI sends them all there: the call
  teaches nothing then, on every rank);
- the time of a learning call is this rank's; the next header step carries
  it, and every rank learns the largest (the slowest rank's time) -- one
  report in flight per communicator, checked to be the same report on every
  rank (its id rides in the header's signature);
- when a class learns next is counted in the pool's call counter, which
  every rank advances alike (pool calls and passed ones).

The first calls of a class try its candidates in turn (MPI first, the
reference); each path's first call (MPI's, the pool's) is a warm-up, not a
sample; a candidate far slower than the best so far is dropped after one
try.  Exploring may cost EXPLORE_BUDGET calls' worth of the best path at
once, then EXPLORE_SHARE of the communicator's calls: a try that does not
fit waits, the fastest path so far running meanwhile, so that classes
whose calls cost little against a learning call's own cost explore in
steps spread over their calls.  Then the fastest in typical time is kept
(`typical`: the mean of its looks, each capped at OUTLIER times their
median -- not its fastest look, which on a busy machine may be a lucky
one; stock MPI's at most the median of its looks); a small, bounded
share of later calls re-times it back to back against the runner-up,
and every other time against stock MPI or another candidate in turn
(more often when they are close, rarely when far behind; a path that
just took over is timed against the one it displaced once more before
the spacing grows), so a change of load is followed.  What
was learned is remembered per machine in a cache file (CXLMPI_CACHE,
cxlmpi.select.cache), read when a communicator's pool is set up.

The package, one room of two (the other, compiled: pyx/shim/routes.pxi):

- `interface`: what the compiled route table and the policy call of each
  other, and the codes they exchange -- the only place they meet;
- `classes`: a class's candidates and path codes, its timed runs' lengths;
- `learner`: what one class learned and tries next (`Learner`);
- `selector`: one communicator's learners and report in flight (`Selector`);
- `cache`: the cache file, checked before it is trusted.

A communicator's selection is set up from the cache and written back by its
pool state, which holds it (cxlmpi.pools.selection: `attach`, `remember`);
this package imports nothing from cxlmpi.pools.
"""

from __future__ import annotations

# The policy's vocabulary, read from here; its tunables are set where they
# live (cxlmpi.select.learner, .classes), which is where they are read.
from .classes import (
    BIGCHUNK,
    CUT_SHORT,
    FLAT,
    MAX_RUN,
    MPI_PATH,
    NCLASSES,
    NEW,
    PLACEMENTS,
    RSAG,
    SLOW,
    STREAM,
    candidates,
    class_floor,
    code_name,
    code_of,
    first_run,
    first_skip,
    run_length,
    size_class,
    untimed_half,
)
from .interface import Policy, RouteTable
from .learner import LEARN_OVERHEAD_S, MAX_INTERVAL, MIN_INTERVAL, Learner, typical, weighed
from .selector import OVERHEAD_FIGURES, Selector, decision, learned_overhead

__all__ = ["MPI_PATH", "STREAM", "BIGCHUNK", "RSAG", "FLAT", "SLOW", "NEW", "CUT_SHORT",
           "PLACEMENTS", "NCLASSES", "MAX_RUN", "LEARN_OVERHEAD_S", "MIN_INTERVAL",
           "MAX_INTERVAL", "OVERHEAD_FIGURES", "code_name", "code_of", "size_class",
           "class_floor", "candidates", "run_length", "first_run", "first_skip",
           "untimed_half", "typical", "weighed", "Learner", "Selector", "Policy",
           "RouteTable", "decision", "learned_overhead"]
