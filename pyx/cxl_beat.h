/* Heartbeats: how a process shows it is alive to observers that cannot
 * look it up by pid (another host, another pid namespace).
 *
 * One thread per process advances, every period, each registered 64-bit
 * counter in shared memory (a control line's beat, a partition-table
 * entry's, the table lock's while held) and writes the line back for
 * observers on hosts without coherent caches.  An observer judges a beat
 * by its own monotonic clock: a counter that has not moved for its
 * owner's period times CXLMPI_LEASE_BEATS belongs to a process that is
 * gone (or stopped for that long).  Pure C, no Python: it beats while the
 * interpreter holds the GIL for minutes.
 *
 * Words are unregistered before their memory is unmapped (under the lock
 * the thread holds while it writes).  A child made by fork() has no such
 * thread and inherits no registration: it owns none of the parent's words. */
#ifndef CXL_BEAT_H
#define CXL_BEAT_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>

#include "cxl_kernels.h"

#define CXL_BEAT_MAX 1024

typedef struct {
    uint64_t *word;      /* the counter */
    int flush;           /* write its line back after each beat */
    const uint64_t *owner;  /* a word that holds `token` while the counter is
                             * this process's (NULL: always) */
    uint64_t token;
} cxl_beat_entry;

static pthread_mutex_t cxl_beat_lock = PTHREAD_MUTEX_INITIALIZER;
static cxl_beat_entry cxl_beats[CXL_BEAT_MAX];
static int cxl_beat_n = 0;
static int cxl_beat_running = 0;
static uint64_t cxl_beat_period_ns = 100000000ull;   /* 100 ms */
static uint64_t cxl_beat_rounds = 0;                 /* beats made (stats, tests) */

/* One beat of every counter still this process's: memory whose owner
 * word no longer holds the token has changed hands (the process was judged
 * gone while stopped, or an operator reset the table) -- its counter is
 * dropped, never written into the new owner's memory. */
static void cxl_beat_once(void)
{
    for (int i = 0; i < cxl_beat_n;) {
        cxl_beat_entry *e = &cxl_beats[i];
        if (e->owner) {
            if (e->flush) cxl_flush_meta(e->owner, sizeof *e->owner, 1);
            if (__atomic_load_n(e->owner, __ATOMIC_ACQUIRE) != e->token) {
                cxl_beats[i] = cxl_beats[--cxl_beat_n];
                continue;
            }
        }
        uint64_t *w = e->word;
        __atomic_store_n(w, __atomic_load_n(w, __ATOMIC_RELAXED) + 1, __ATOMIC_RELEASE);
        if (e->flush) cxl_flush_meta(w, sizeof *w, 0);
        i++;
    }
    cxl_beat_rounds++;
}

static void *cxl_beat_main(void *arg)
{
    (void)arg;
    for (;;) {
        uint64_t ns = __atomic_load_n(&cxl_beat_period_ns, __ATOMIC_RELAXED);
        struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
        pthread_mutex_lock(&cxl_beat_lock);
        cxl_beat_once();
        pthread_mutex_unlock(&cxl_beat_lock);
    }
    return NULL;
}

static void cxl_beat_after_fork(void)
{
    pthread_mutex_init(&cxl_beat_lock, NULL);
    cxl_beat_n = 0;
    cxl_beat_running = 0;
}

/* Start the thread (under the lock); 0 or an errno.  Every signal is
 * blocked in it: they belong to the interpreter's main thread. */
static int cxl_beat_start(void)
{
    static int atfork = 0;
    if (cxl_beat_running) return 0;
    if (!atfork) {
        pthread_atfork(NULL, NULL, cxl_beat_after_fork);
        atfork = 1;
    }
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    int rc = pthread_create(&t, &attr, cxl_beat_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) cxl_beat_running = 1;
    return rc;
}

/* Beat `word` from now on, while `*owner` holds `token` (owner NULL:
 * always); 0, or an errno (no room, no thread). */
static int cxl_beat_add(uint64_t *word, int flush, const uint64_t *owner, uint64_t token)
{
    int rc = 0;
    pthread_mutex_lock(&cxl_beat_lock);
    if (cxl_beat_n == CXL_BEAT_MAX) {
        rc = ENOSPC;
    } else {
        rc = cxl_beat_start();
        if (rc == 0) {
            cxl_beats[cxl_beat_n].word = word;
            cxl_beats[cxl_beat_n].flush = flush;
            cxl_beats[cxl_beat_n].owner = owner;
            cxl_beats[cxl_beat_n].token = token;
            cxl_beat_n++;
        }
    }
    pthread_mutex_unlock(&cxl_beat_lock);
    return rc;
}

/* Stop beating `word` (before its memory goes); a word not registered is
 * ignored. */
static void cxl_beat_remove(const uint64_t *word)
{
    pthread_mutex_lock(&cxl_beat_lock);
    for (int i = 0; i < cxl_beat_n; i++) {
        if (cxl_beats[i].word == word) {
            cxl_beats[i] = cxl_beats[--cxl_beat_n];
            break;
        }
    }
    pthread_mutex_unlock(&cxl_beat_lock);
}

/* Stop beating every word that lies in, or is owned through, the `nbytes`
 * at `base` (before that memory is unmapped: the thread would fault on
 * it, as it did at exit when a mapping went with a word still beating). */
static void cxl_beat_remove_range(const void *base, size_t nbytes)
{
    uintptr_t lo = (uintptr_t)base, hi = lo + nbytes;
    pthread_mutex_lock(&cxl_beat_lock);
    for (int i = 0; i < cxl_beat_n;) {
        uintptr_t w = (uintptr_t)cxl_beats[i].word, o = (uintptr_t)cxl_beats[i].owner;
        if ((w >= lo && w < hi) || (o != 0 && o >= lo && o < hi))
            cxl_beats[i] = cxl_beats[--cxl_beat_n];
        else
            i++;
    }
    pthread_mutex_unlock(&cxl_beat_lock);
}

/* The period, until the thread starts: observers were told the period
 * of each counter when it was registered, so it never changes after. */
static void cxl_beat_set_period(uint64_t ns)
{
    pthread_mutex_lock(&cxl_beat_lock);
    if (!cxl_beat_running) cxl_beat_period_ns = ns ? ns : 1;
    pthread_mutex_unlock(&cxl_beat_lock);
}

/* Whether a beat last seen to change at `since_s` (this process's
 * monotonic clock) has been still for longer than its owner's lease. */
static inline int cxl_beat_expired(double since_s, double now_s, uint64_t period_ns,
                                   uint64_t beats)
{
    return now_s - since_s > (double)period_ns * 1e-9 * (double)beats;
}

#endif /* CXL_BEAT_H */
