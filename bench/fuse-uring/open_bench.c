/*
 * open_bench: the cost of one FUSE open round trip, over /dev/fuse and over io_uring.
 *
 * A minimal FUSE file system (one 4 KiB file, "f") is mounted at MOUNTPOINT and served
 * either by threads reading /dev/fuse (the transport hoardfs uses today) or by one
 * io_uring queue per CPU (FUSE over io_uring, Linux 6.14+, module parameter
 * fuse.enable_uring=Y): a thread pinned to each CPU holds DEPTH ring entries registered
 * with FUSE_IO_URING_CMD_REGISTER and answers with COMMIT_AND_FETCH. A child process then
 * runs N x (open, pread 4 KiB, close) of the warm file and reports microseconds per
 * operation (p50, p99, mean), interrupts per operation (rescheduling and function-call
 * IPIs, from /proc/interrupts) and its migrations per operation (/proc/self/sched).
 *
 * The daemon answers as hoardfs answers a cached read open: FOPEN_KEEP_CACHE and
 * FOPEN_NOFLUSH (so the pread is a page-cache hit and close sends only an asynchronous
 * RELEASE), attributes and names valid for an hour (no LOOKUP or GETATTR per open).
 * What is left per operation is the OPEN round trip and the RELEASE.
 *
 * Usage: open_bench MOUNTPOINT devfuse|uring|local N [--pin-client CPU] [--idle-ring]
 *   local: no mount; the same loop over MOUNTPOINT/f, a file of the local disk.
 *   --idle-ring: ring threads run SCHED_IDLE (so a caller woken on their CPU keeps it).
 *
 * Built and run by bench/fuse_uring.py; see doc/BENCHMARKS.md. Linux only, as root.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ABI 7.42 (not in this system's linux/fuse.h, which is 7.38). */
#define OVER_IO_URING (1ULL << 41)
#define URING_IN_OUT_HEADER_SZ 128
#define URING_OP_IN_OUT_SZ 128
#define CMD_REGISTER 1
#define CMD_COMMIT_AND_FETCH 2

struct uring_ent_in_out {
	uint64_t flags;
	uint64_t commit_id;
	uint32_t payload_sz;
	uint32_t padding;
	uint64_t reserved;
};

struct uring_req_header {
	char in_out[URING_IN_OUT_HEADER_SZ];
	char op_in[URING_OP_IN_OUT_SZ];
	struct uring_ent_in_out ent;
};

struct uring_cmd_req {
	uint64_t flags;
	uint64_t commit_id;
	uint16_t qid;
	uint8_t padding[6];
};

#define FILE_INO 2
#define FILE_SIZE 4096
#define PAYLOAD (1 << 20)
#define DEPTH 4
#define MAX_QUEUES 64

static int fuse_fd = -1;
static int use_uring;
static int idle_ring;
static int nr_queues;
static volatile int ready_queues;
static volatile int init_done;
/* Requests answered through each transport (OPENs only, to check where they went). */
static volatile long dev_opens, ring_opens;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void fill_attr(struct fuse_attr *a, uint64_t ino)
{
	memset(a, 0, sizeof(*a));
	a->ino = ino;
	a->nlink = 1;
	a->blksize = 4096;
	if (ino == FUSE_ROOT_ID) {
		a->mode = S_IFDIR | 0755;
		a->nlink = 2;
	} else {
		a->mode = S_IFREG | 0644;
		a->size = FILE_SIZE;
		a->blocks = FILE_SIZE / 512;
	}
}

/*
 * Answers one request. `op` is the opcode's fixed in-struct, `rest` what follows it (a
 * name), `out` receives the reply's arguments; returns their length, or a negative errno,
 * or INT32_MIN when no reply is sent (FORGET).
 */
static int answer(const struct fuse_in_header *in, const void *op, const char *rest, char *out)
{
	switch (in->opcode) {
	case FUSE_LOOKUP: {
		if (in->nodeid != FUSE_ROOT_ID || strcmp(rest, "f") != 0)
			return -ENOENT;
		struct fuse_entry_out *e = (void *)out;
		memset(e, 0, sizeof(*e));
		e->nodeid = FILE_INO;
		e->generation = 1;
		e->entry_valid = 3600;
		e->attr_valid = 3600;
		fill_attr(&e->attr, FILE_INO);
		return sizeof(*e);
	}
	case FUSE_GETATTR: {
		struct fuse_attr_out *a = (void *)out;
		memset(a, 0, sizeof(*a));
		a->attr_valid = 3600;
		fill_attr(&a->attr, in->nodeid);
		return sizeof(*a);
	}
	case FUSE_OPEN: {
		struct fuse_open_out *o = (void *)out;
		memset(o, 0, sizeof(*o));
		o->fh = 1;
		o->open_flags = FOPEN_KEEP_CACHE | FOPEN_NOFLUSH;
		return sizeof(*o);
	}
	case FUSE_READ: {
		const struct fuse_read_in *r = op;
		uint32_t n = r->offset >= FILE_SIZE ? 0 : FILE_SIZE - r->offset;
		if (n > r->size)
			n = r->size;
		memset(out, 'x', n);
		return n;
	}
	case FUSE_RELEASE:
	case FUSE_FLUSH:
	case FUSE_RELEASEDIR:
		return 0;
	case FUSE_OPENDIR: {
		struct fuse_open_out *o = (void *)out;
		memset(o, 0, sizeof(*o));
		return sizeof(*o);
	}
	case FUSE_STATFS: {
		struct fuse_statfs_out *s = (void *)out;
		memset(s, 0, sizeof(*s));
		s->st.bsize = 4096;
		s->st.namelen = 255;
		return sizeof(*s);
	}
	case FUSE_FORGET:
	case FUSE_BATCH_FORGET:
	case FUSE_INTERRUPT:
		return INT32_MIN;
	default:
		return -ENOSYS;
	}
}

/* Size of the fixed in-struct of an opcode, in a /dev/fuse request. */
static size_t op_size(uint32_t opcode)
{
	switch (opcode) {
	case FUSE_READ:
		return sizeof(struct fuse_read_in);
	case FUSE_OPEN:
	case FUSE_OPENDIR:
		return sizeof(struct fuse_open_in);
	case FUSE_RELEASE:
	case FUSE_RELEASEDIR:
		return sizeof(struct fuse_release_in);
	case FUSE_FLUSH:
		return sizeof(struct fuse_flush_in);
	case FUSE_GETATTR:
		return sizeof(struct fuse_getattr_in);
	default:
		return 0;
	}
}

static void reply_dev(uint64_t unique, int r, const char *out)
{
	struct fuse_out_header h = { .unique = unique };
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)out, 0 } };
	if (r < 0) {
		h.error = r;
		h.len = sizeof(h);
		(void)writev(fuse_fd, iov, 1);
		return;
	}
	h.len = sizeof(h) + r;
	iov[1].iov_len = r;
	(void)writev(fuse_fd, iov, 2);
}

static void init_reply(const struct fuse_in_header *in, const struct fuse_init_in *init)
{
	struct fuse_init_out o;
	memset(&o, 0, sizeof(o));
	o.major = FUSE_KERNEL_VERSION;
	o.minor = init->minor < 42 ? init->minor : 42;
	o.max_readahead = 128 << 10;
	o.flags = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_INIT_EXT | FUSE_MAX_PAGES;
	o.max_background = 64;
	o.congestion_threshold = 48;
	o.max_write = 128 << 10;
	o.time_gran = 1;
	o.max_pages = 32;
	if (use_uring)
		o.flags2 = (uint32_t)(OVER_IO_URING >> 32);
	reply_dev(in->unique, sizeof(o), (const char *)&o);
}

/* /dev/fuse: INIT, then (devfuse mode) every request, (uring mode) what stays here. */
static void *dev_thread(void *arg)
{
	(void)arg;
	char *buf = malloc(PAYLOAD + 4096);
	char *out = malloc(PAYLOAD);
	for (;;) {
		ssize_t n = read(fuse_fd, buf, PAYLOAD + 4096);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ENOENT)
				continue;
			if (errno == ENODEV)
				return NULL;
			die("read /dev/fuse");
		}
		const struct fuse_in_header *in = (void *)buf;
		if (in->opcode == FUSE_INIT) {
			init_reply(in, (const void *)(in + 1));
			__sync_synchronize();
			init_done = 1;
			continue;
		}
		if (in->opcode == FUSE_OPEN)
			__sync_fetch_and_add(&dev_opens, 1);
		const char *op = (const char *)(in + 1);
		int r = answer(in, op, op + op_size(in->opcode), out);
		if (r != INT32_MIN)
			reply_dev(in->unique, r, out);
	}
}

struct ring_ent {
	struct uring_req_header *hdr;
	char *payload;
	struct iovec iov[2];
};

static void pin(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		die("sched_setaffinity");
}

static void sqe_cmd(struct io_uring *ring, struct ring_ent *e, uint32_t cmd, int qid, uint64_t commit)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	if (!sqe) {
		fprintf(stderr, "no sqe\n");
		exit(1);
	}
	memset(sqe, 0, 128);
	sqe->opcode = IORING_OP_URING_CMD;
	sqe->fd = fuse_fd;
	sqe->cmd_op = cmd;
	io_uring_sqe_set_data(sqe, e);
	if (cmd == CMD_REGISTER) {
		sqe->addr = (uint64_t)(uintptr_t)e->iov;
		sqe->len = 2;
	}
	struct uring_cmd_req *req = (void *)sqe->cmd;
	req->qid = qid;
	req->commit_id = commit;
}

/* One queue: a thread pinned to CPU `qid` with DEPTH registered entries. */
static void *ring_thread(void *arg)
{
	int qid = (int)(intptr_t)arg;
	pin(qid);
	if (idle_ring) {
		struct sched_param p = { 0 };
		if (sched_setscheduler(0, SCHED_IDLE, &p))
			die("SCHED_IDLE");
	}
	struct io_uring ring;
	struct io_uring_params params = { 0 };
	params.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
	params.cq_entries = 2 * DEPTH;
	int rc = io_uring_queue_init_params(DEPTH, &ring, &params);
	if (rc) {
		fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-rc));
		exit(1);
	}
	struct ring_ent ents[DEPTH];
	for (int i = 0; i < DEPTH; i++) {
		struct ring_ent *e = &ents[i];
		if (posix_memalign((void **)&e->hdr, 4096, 4096) ||
		    posix_memalign((void **)&e->payload, 4096, PAYLOAD))
			die("alloc");
		memset(e->hdr, 0, 4096);
		e->iov[0] = (struct iovec){ e->hdr, sizeof(struct uring_req_header) };
		e->iov[1] = (struct iovec){ e->payload, PAYLOAD };
		sqe_cmd(&ring, e, CMD_REGISTER, qid, 0);
	}
	rc = io_uring_submit(&ring);
	if (rc != DEPTH) {
		fprintf(stderr, "register: submitted %d: %s\n", rc, rc < 0 ? strerror(-rc) : "");
		exit(1);
	}
	__sync_fetch_and_add(&ready_queues, 1);
	char *out = malloc(PAYLOAD);
	for (;;) {
		struct io_uring_cqe *cqe;
		rc = io_uring_wait_cqe(&ring, &cqe);
		if (rc == -EINTR)
			continue;
		if (rc) {
			fprintf(stderr, "wait_cqe: %s\n", strerror(-rc));
			exit(1);
		}
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&ring, head, cqe) {
			seen++;
			struct ring_ent *e = io_uring_cqe_get_data(cqe);
			if (cqe->res < 0) {
				if (cqe->res == -ENOTCONN || cqe->res == -ENODEV)
					return NULL; /* unmounted */
				fprintf(stderr, "ring cqe: %s\n", strerror(-cqe->res));
				exit(1);
			}
			const struct fuse_in_header *in = (void *)e->hdr->in_out;
			uint64_t commit = e->hdr->ent.commit_id;
			if (in->opcode == FUSE_OPEN)
				__sync_fetch_and_add(&ring_opens, 1);
			e->payload[e->hdr->ent.payload_sz < PAYLOAD ? e->hdr->ent.payload_sz : PAYLOAD - 1] = 0;
			int r = answer(in, e->hdr->op_in, e->payload, out);
			struct fuse_out_header *oh = (void *)e->hdr->in_out;
			uint64_t unique = in->unique;
			memset(oh, 0, sizeof(*oh));
			oh->unique = unique;
			if (r < 0) {
				oh->error = r;
				e->hdr->ent.payload_sz = 0;
			} else {
				memcpy(e->payload, out, r);
				e->hdr->ent.payload_sz = r;
			}
			sqe_cmd(&ring, e, CMD_COMMIT_AND_FETCH, qid, commit);
		}
		io_uring_cq_advance(&ring, seen);
		io_uring_submit(&ring);
	}
}

/* Rescheduling plus function-call interrupts, all CPUs. */
static long ipis(void)
{
	FILE *f = fopen("/proc/interrupts", "r");
	char line[4096];
	long total = 0;
	while (f && fgets(line, sizeof(line), f)) {
		char *p = line;
		while (*p == ' ')
			p++;
		if (strncmp(p, "RES:", 4) && strncmp(p, "CAL:", 4))
			continue;
		p += 4;
		for (int i = 0; i < nr_queues; i++)
			total += strtol(p, &p, 10);
	}
	if (f)
		fclose(f);
	return total;
}

static long migrations(void)
{
	FILE *f = fopen("/proc/self/sched", "r");
	char line[256];
	long n = -1;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "se.nr_migrations", 16))
			n = atol(strchr(line, ':') + 1);
	if (f)
		fclose(f);
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int client(const char *mnt, long n, int pin_cpu)
{
	if (pin_cpu >= 0)
		pin(pin_cpu);
	char path[4096], buf[FILE_SIZE];
	snprintf(path, sizeof(path), "%s/f", mnt);
	/* Warm: the name, the attributes and the page cache. */
	for (int i = 0; i < 100; i++) {
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			die("open (warm-up)");
		if (pread(fd, buf, sizeof(buf), 0) != FILE_SIZE)
			die("pread (warm-up)");
		close(fd);
	}
	double *lat = malloc(n * sizeof(double));
	long ipi0 = ipis(), mig0 = migrations();
	double t0 = now_us();
	for (long i = 0; i < n; i++) {
		double a = now_us();
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			die("open");
		if (pread(fd, buf, sizeof(buf), 0) != FILE_SIZE)
			die("pread");
		close(fd);
		lat[i] = now_us() - a;
	}
	double total = now_us() - t0;
	long ipi1 = ipis(), mig1 = migrations();
	qsort(lat, n, sizeof(double), cmp_double);
	printf("{\"ops\": %ld, \"us_mean\": %.2f, \"us_p50\": %.2f, \"us_p99\": %.2f, "
	       "\"ipis_per_op\": %.3f, \"migrations_per_op\": %.4f}\n",
	       n, total / n, lat[n / 2], lat[n * 99 / 100], (double)(ipi1 - ipi0) / n,
	       (double)(mig1 - mig0) / n);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s MOUNTPOINT devfuse|uring|local N [--pin-client CPU] [--idle-ring]\n", argv[0]);
		return 2;
	}
	const char *mnt = argv[1];
	use_uring = !strcmp(argv[2], "uring");
	long n = atol(argv[3]);
	int pin_cpu = -1;
	for (int i = 4; i < argc; i++) {
		if (!strcmp(argv[i], "--pin-client") && i + 1 < argc)
			pin_cpu = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--idle-ring"))
			idle_ring = 1;
	}
	nr_queues = get_nprocs_conf();
	if (!strcmp(argv[2], "local"))
		return client(mnt, n, pin_cpu);
	if (nr_queues > MAX_QUEUES)
		nr_queues = MAX_QUEUES;
	fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fuse_fd < 0)
		die("/dev/fuse");
	char opts[256];
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fuse_fd);
	if (mount("open_bench", mnt, "fuse.open_bench", MS_NOSUID | MS_NODEV, opts))
		die("mount");
	pthread_t t;
	/* /dev/fuse readers: INIT (and, without io_uring, everything). */
	for (int i = 0; i < (use_uring ? 1 : 2); i++)
		if (pthread_create(&t, NULL, dev_thread, NULL))
			die("pthread_create");
	/* Queues register after INIT (it enables io_uring), before any other request: once
	 * INIT has enabled it, requests wait for the queues rather than go to /dev/fuse. */
	while (!init_done)
		usleep(100);
	if (use_uring) {
		for (int q = 0; q < nr_queues; q++)
			if (pthread_create(&t, NULL, ring_thread, (void *)(intptr_t)q))
				die("pthread_create");
		while (ready_queues < nr_queues)
			usleep(1000);
		usleep(20000);
	}
	struct stat st;
	if (stat(mnt, &st))
		die("stat mountpoint");
	pid_t pid = fork();
	if (pid == 0)
		_exit(client(mnt, n, pin_cpu));
	int status;
	waitpid(pid, &status, 0);
	fprintf(stderr, "opens answered: %ld over /dev/fuse, %ld over io_uring\n", dev_opens, ring_opens);
	umount2(mnt, MNT_DETACH);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
