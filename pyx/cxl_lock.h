/* Locks the kernel holds for a process: liveness without a clock among the
 * processes of one kernel (this host, any pid namespace; cxlmpi.memory.liveness).
 *
 * Each rank holds a shared open-file-description lock (F_OFD_SETLK) on one
 * byte of the pool's backing file -- the first byte of its control line --
 * for as long as it maps the pool.  The kernel drops the lock when the
 * last descriptor of that open file description is closed (at exit, at
 * kill -9, in any container) and keeps it while the process is stopped
 * (SIGSTOP, docker pause, a debugger): a peer that only stood still is
 * never taken for dead.  F_OFD_GETLK from another open file description
 * tells held from free. */
#ifndef CXL_LOCK_H
#define CXL_LOCK_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#ifndef F_OFD_GETLK
#define F_OFD_GETLK 36
#define F_OFD_SETLK 37
#endif

static int cxl_ofd_lock(int fd, uint64_t at, short type, int cmd, struct flock *fl)
{
    memset(fl, 0, sizeof *fl);
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = (off_t)at;
    fl->l_len = 1;
    return fcntl(fd, cmd, fl) == 0 ? 0 : errno;
}

/* Hold a shared lock of byte `at` of `fd`'s file for its open file
 * description: 0 or an errno. */
static inline int cxl_ofd_hold(int fd, uint64_t at)
{
    struct flock fl;
    return cxl_ofd_lock(fd, at, F_RDLCK, F_OFD_SETLK, &fl);
}

static inline void cxl_ofd_drop(int fd, uint64_t at)
{
    struct flock fl;
    (void)cxl_ofd_lock(fd, at, F_UNLCK, F_OFD_SETLK, &fl);
}

/* 1: another open file description locks byte `at`; 0: none does; -1: the
 * kernel cannot say. */
static inline int cxl_ofd_held(int fd, uint64_t at)
{
    struct flock fl;
    if (fd < 0 || cxl_ofd_lock(fd, at, F_WRLCK, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type != F_UNLCK;
}

/* Whether a free byte of `fd`'s file means its owner is gone: only where
 * every process reaches the memory through this very file (a regular file:
 * a pool file, bind-mounted or not, or a shm segment).  A device is another
 * inode behind each of its nodes -- containers given /dev/dax0.0 by
 * `--device` each have their own -- and a lock taken through one node is
 * not seen through another: a live owner would look gone. */
static inline int cxl_ofd_free_means_gone(int fd)
{
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

#endif /* CXL_LOCK_H */
