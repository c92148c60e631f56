/*
 * pollux_fio.c — an fio external ioengine over libpollux.
 *
 *   fio --thread=1 --ioengine=external:/path/libpollux_fio.so \
 *       --filename='trtype\:soft backend\:ram size\:64MiB' ...
 *
 * filename= is a pollux transport ID (PCIe, TCP, the emulated
 * controller) with every ':' written '\:' (fio splits file names at an
 * unescaped ':'); its fields are separated by spaces as usual (fio keeps
 * spaces inside a file name), or by '+' for shells and command lines
 * where a space is awkward ('trtype\:tcp+traddr\:127.0.0.1+...': the
 * engine reads '+' as a space). The job does I/O to the controller's first
 * namespace. One file per job; thread=1 is required (the controller and
 * the emulated device's thread live in fio's process).
 *
 * Each job (fio thread) has its own pollux queue pair of iodepth entries;
 * jobs naming the same transport ID share one controller. The I/O memory
 * of a job (iomem_alloc) is one pollux DMA buffer, so requests go to the
 * controller without a copy. queue() submits (the doorbell is rung by
 * commit() or the next poll), getevents() polls the queue pair until
 * `min` completions arrived, event() hands them to fio, as the libaio
 * engine does.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fio.h"
#include "optgroup.h"

#include "pollux.h"

/* A controller shared by the jobs naming the same transport ID. */
struct pctrl {
    struct pctrl *next;
    char *trid;
    struct pollux_ctrl *ctrl;
    struct pollux_ns_info ns;
    int refs;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pctrl *g_ctrls;

/* One job's state. */
struct pjob {
    struct pctrl *pc;
    struct pollux_qpair *qp;
    struct pollux_buf *buf;
    char *base;
    unsigned int shift;
    struct io_u **events;
    unsigned int nevents, max_events;
    /* For POLLUX_FIO_CPU: I/Os completed, the thread's CPU time at init. */
    uint64_t ios;
    struct timespec cpu0;
};

/* The transport ID of a file name: '+' read as a space. */
static char *trid_of(const char *name)
{
    char *t = strdup(name);
    for (char *p = t; p && *p; p++)
        if (*p == '+')
            *p = ' ';
    return t;
}

/* The controller of `name`, connected on first use; a reference taken. */
static struct pctrl *get_ctrl(const char *name)
{
    char *trid = trid_of(name);
    struct pctrl *pc;

    if (!trid)
        return NULL;
    pthread_mutex_lock(&g_lock);
    for (pc = g_ctrls; pc; pc = pc->next)
        if (!strcmp(pc->trid, trid))
            break;
    if (!pc) {
        struct pollux_ctrl *c = pollux_connect(trid);
        if (!c) {
            log_err("pollux: connect '%s': %s\n", trid, pollux_last_error());
            goto out;
        }
        pc = calloc(1, sizeof(*pc));
        if (!pc || pollux_ns_get(c, 0, &pc->ns)) {
            log_err("pollux: '%s': no namespace (%s)\n", trid, pollux_last_error());
            free(pc);
            pc = NULL;
            pollux_detach(c);
            goto out;
        }
        pc->trid = trid;
        trid = NULL;
        pc->ctrl = c;
        pc->next = g_ctrls;
        g_ctrls = pc;
    }
    pc->refs++;
out:
    pthread_mutex_unlock(&g_lock);
    free(trid);
    return pc;
}

static void put_ctrl(struct pctrl *pc)
{
    struct pctrl **pp;

    pthread_mutex_lock(&g_lock);
    if (--pc->refs == 0) {
        for (pp = &g_ctrls; *pp != pc; pp = &(*pp)->next)
            ;
        *pp = pc->next;
        if (pollux_detach(pc->ctrl))
            log_err("pollux: detach: %s\n", pollux_last_error());
        free(pc->trid);
        free(pc);
    }
    pthread_mutex_unlock(&g_lock);
}

/* Main process, before the jobs start: connect, size the file. */
static int pollux_setup(struct thread_data *td)
{
    struct fio_file *f;
    unsigned int i;

    if (!td->o.use_thread) {
        log_err("pollux: the engine needs thread=1\n");
        return 1;
    }
    if (td->o.nr_files != 1) {
        log_err("pollux: one filename (a transport ID) per job\n");
        return 1;
    }
    for_each_file(td, f, i) {
        struct pctrl *pc = FILE_ENG_DATA(f);
        if (!pc) {
            pc = get_ctrl(f->file_name);
            if (!pc)
                return 1;
            FILE_SET_ENG_DATA(f, pc);
        }
        f->real_file_size = pc->ns.num_blocks * pc->ns.block_size;
        f->filetype = FIO_TYPE_BLOCK;
        fio_file_set_size_known(f);
    }
    return 0;
}

/* The job's thread: its queue pair. */
static int pollux_init(struct thread_data *td)
{
    struct fio_file *f = td->files[0];
    struct pctrl *pc = FILE_ENG_DATA(f);
    struct pjob *j;

    if (!pc) {
        log_err("pollux: no controller for '%s'\n", f->file_name);
        return 1;
    }
    j = calloc(1, sizeof(*j));
    if (!j)
        return 1;
    j->pc = pc;
    j->shift = __builtin_ctz(pc->ns.block_size);
    j->max_events = td->o.iodepth;
    j->events = calloc(j->max_events, sizeof(*j->events));
    j->qp = pollux_qpair_alloc(pc->ctrl, td->o.iodepth);
    if (!j->events || !j->qp) {
        log_err("pollux: queue pair of depth %u: %s\n", td->o.iodepth, pollux_last_error());
        free(j->events);
        free(j);
        return 1;
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &j->cpu0);
    td->io_ops_data = j;
    return 0;
}

/* The job's I/O memory: one DMA buffer of the controller. */
static int pollux_iomem_alloc(struct thread_data *td, size_t total)
{
    struct pjob *j = td->io_ops_data;

    j->buf = pollux_buf_alloc(j->pc->ctrl, total);
    if (!j->buf) {
        log_err("pollux: %zu-byte buffer: %s\n", total, pollux_last_error());
        return 1;
    }
    j->base = pollux_buf_ptr(j->buf);
    td->orig_buffer = j->base;
    return 0;
}

static void pollux_iomem_free(struct thread_data *td)
{
    struct pjob *j = td->io_ops_data;

    if (j && j->buf) {
        if (pollux_buf_free(j->buf))
            log_err("pollux: buffer free: %s\n", pollux_last_error());
        j->buf = NULL;
    }
    td->orig_buffer = NULL;
}

static void on_done(void *arg, const struct pollux_cpl *cpl)
{
    struct io_u *io_u = arg;
    struct pjob *j = io_u->engine_data;

    io_u->error = cpl->status < 0 ? -cpl->status : 0;
    if (io_u->error)
        io_u->resid = io_u->xfer_buflen;
    j->events[j->nevents++] = io_u;
    j->ios++;
}

static enum fio_q_status pollux_queue(struct thread_data *td, struct io_u *io_u)
{
    struct pjob *j = td->io_ops_data;
    uint32_t nsid = j->pc->ns.nsid;
    uint64_t lba = io_u->offset >> j->shift;
    uint32_t nlb = io_u->xfer_buflen >> j->shift;
    size_t off = (char *)io_u->xfer_buf - j->base;
    int rc;

    fio_ro_check(td, io_u);
    io_u->engine_data = j;
    switch (io_u->ddir) {
    case DDIR_READ:
        rc = pollux_qpair_read(j->qp, nsid, lba, nlb, j->buf, off, on_done, io_u);
        break;
    case DDIR_WRITE:
        rc = pollux_qpair_write(j->qp, nsid, lba, nlb, j->buf, off, on_done, io_u);
        break;
    case DDIR_SYNC:
    case DDIR_DATASYNC:
        rc = pollux_qpair_flush(j->qp, nsid, on_done, io_u);
        break;
    default:
        rc = -ENOTSUP;
        break;
    }
    if (rc == -EAGAIN)
        return FIO_Q_BUSY;
    if (rc < 0) {
        io_u->error = -rc;
        td_verror(td, io_u->error, "pollux submit");
        return FIO_Q_COMPLETED;
    }
    return FIO_Q_QUEUED;
}

static int pollux_commit(struct thread_data *td)
{
    struct pjob *j = td->io_ops_data;

    return pollux_qpair_kick(j->qp) < 0 ? -EIO : 0;
}

static int pollux_getevents(struct thread_data *td, unsigned int min, unsigned int max,
                            const struct timespec *t)
{
    struct pjob *j = td->io_ops_data;

    j->nevents = 0;
    if (max > j->max_events)
        max = j->max_events;
    do {
        int n = pollux_qpair_poll(j->qp, max - j->nevents);
        if (n < 0) {
            log_err("pollux: poll: %s\n", pollux_last_error());
            return n;
        }
    } while (j->nevents < min);
    return j->nevents;
}

static struct io_u *pollux_event(struct thread_data *td, int event)
{
    struct pjob *j = td->io_ops_data;

    return j->events[event];
}

static void pollux_cleanup(struct thread_data *td)
{
    struct pjob *j = td->io_ops_data;
    struct fio_file *f;
    unsigned int i;

    if (j && getenv("POLLUX_FIO_CPU")) {
        /* The job thread's CPU time from init to here, and its I/Os: what
         * bench/fio_vs_perf.sh divides (fio's own usr_cpu/sys_cpu is the
         * whole process's, the emulated device's thread included). */
        struct timespec now;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
        fprintf(stderr, "pollux_fio: job %s cpu_s %.6f ios %llu\n", td->o.name,
                 (now.tv_sec - j->cpu0.tv_sec) + (now.tv_nsec - j->cpu0.tv_nsec) / 1e9,
                 (unsigned long long)j->ios);
    }
    if (j) {
        while (pollux_qpair_outstanding(j->qp) > 0) {
            j->nevents = 0;
            if (pollux_qpair_poll(j->qp, j->max_events) < 0)
                break;
        }
        if (pollux_qpair_free(j->qp))
            log_err("pollux: queue pair free: %s\n", pollux_last_error());
        free(j->events);
        free(j);
        td->io_ops_data = NULL;
    }
    for_each_file(td, f, i) {
        struct pctrl *pc = FILE_ENG_DATA(f);
        if (pc) {
            FILE_SET_ENG_DATA(f, NULL);
            put_ctrl(pc);
        }
    }
}

static int pollux_open_file(struct thread_data *td, struct fio_file *f)
{
    return 0;
}

static int pollux_close_file(struct thread_data *td, struct fio_file *f)
{
    return 0;
}

static int pollux_get_file_size(struct thread_data *td, struct fio_file *f)
{
    return 0;
}

struct ioengine_ops ioengine = {
    .name = "pollux",
    .version = FIO_IOOPS_VERSION,
    .flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_MEMALIGN | FIO_DISKLESSIO,
    .setup = pollux_setup,
    .init = pollux_init,
    .queue = pollux_queue,
    .commit = pollux_commit,
    .getevents = pollux_getevents,
    .event = pollux_event,
    .cleanup = pollux_cleanup,
    .open_file = pollux_open_file,
    .close_file = pollux_close_file,
    .get_file_size = pollux_get_file_size,
    .iomem_alloc = pollux_iomem_alloc,
    .iomem_free = pollux_iomem_free,
};
