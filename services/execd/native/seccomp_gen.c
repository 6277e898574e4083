/*
 * sandpod-seccomp-gen: compile the sandbox's seccomp filters with libseccomp, at build time.
 *
 * Prints a C header with one classic-BPF program per mode (struct sock_filter arrays) that
 * jail_exec.c embeds and loads with one prctl: building the filter with libseccomp at every
 * command's entry costs ~7 ms, loading the compiled program a few microseconds.
 *
 * The policy (modes "default" and "nested"; "unconfined" loads nothing):
 *   - only the build machine's native ABI: any other (i386 via int 0x80, x32 on x86_64) kills
 *     the process (SCMP_ACT_KILL_PROCESS on a foreign architecture);
 *   - every system call libseccomp knows for that ABI is allowed except DENIED (and, in the
 *     default mode, NAMESPACES), which fail with EPERM; the result is at least as strict as the
 *     common container default profile for a container without capabilities (its allow-list
 *     minus ours is empty; ours also refuses socket families beyond unix/inet/inet6/netlink);
 *   - clone with a CLONE_NEW* flag and every personality but the harmless ones fail with
 *     EPERM; clone3 fails with ENOSYS (its flags live in memory a filter cannot read, so libc
 *     must fall back to clone, which is filtered);
 *   - numbers above every one libseccomp knows (system calls newer than it) fail with ENOSYS, as
 *     on an older kernel, so libc's fallbacks work (a prologue before libseccomp's program);
 *     a few newer harmless ones are allowed by number; unused numbers below fail with EPERM.
 * Mode "nested" (a template's allowNestedUserNamespaces) also allows creating and entering
 * namespaces and mounting in them: unshare, setns, clone(3) with any flags, the mount family.
 *
 * The form emitted is not libseccomp's (an allow rule per system call, ~440 instructions, ~100 us
 * to load) but default allow with every refusal explicit: a balanced jge search over runs of
 * numbers with one answer (~70 instructions, ~35 us), whose path for an allowed number reads only
 * the number and the architecture, so the kernel's action cache (Linux >= 5.11) keeps every such
 * call from running the filter at all. libseccomp's form is still built, as the reference: the
 * emitted program must answer exactly as it on every number and argument class, or no header.
 */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const DENIED[] = {
    /* kernel keyrings: keys outlive the sandbox and are shared per uid */
    "add_key", "keyctl", "request_key",
    /* large kernel attack surface no sandbox needs */
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
    "userfaultfd", "fanotify_init", "lookup_dcookie", "open_by_handle_at",
    "kcmp", "pidfd_getfd", "process_madvise",
    /* NUMA policy (needs CAP_SYS_NICE in the container default) */
    "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
    "set_mempolicy_home_node",
    /* the machine: modules, kexec, reboot, swap, clocks, accounting, quotas, logs */
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "clock_settime", "settimeofday", "stime", "acct", "quotactl", "quotactl_fd", "syslog",
    "vhangup", "ioperm", "iopl", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl",
    "sethostname", "setdomainname",
    /* never implemented, reserved numbers */
    "afs_syscall", "getpmsg", "putpmsg", "security", "tuxcall", "vserver",
    NULL,
};

/* Denied unless the template allows nested user namespaces. */
static const char *const NAMESPACES[] = {
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen",
    "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr", NULL,
};

/* Filtered by argument below. */
static const char *const BY_ARGUMENT[] = {"clone", "clone3", "socket", "personality", NULL};

/* Newer than libseccomp 2.5 (numbers shared by every architecture since Linux 5.1). */
static const int NEWER_ALLOWED[] = {
    451, /* cachestat */ 452, /* fchmodat2 */ 453, /* map_shadow_stack */
    454, /* futex_wake */ 455, /* futex_wait */ 456, /* futex_requeue */
    462, /* mseal */ 463, 464, 465, 466, /* setxattrat getxattrat listxattrat removexattrat */
};
#define MAX_NR 600 /* above every native number in use (x32's start at 512 | 0x40000000) */

#define CLONE_NS_FLAGS 0x7E020080ULL /* NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME */
static const unsigned long PERSONALITIES[] = {
    0x0,        /* PER_LINUX */
    0x8,        /* PER_LINUX32 */
    0x20000,    /* UNAME26 */
    0x20008,    /* UNAME26 | PER_LINUX32 */
    0xffffffff, /* query only */
};
static const int SOCKET_FAMILIES[] = {1 /* unix */, 2 /* inet */, 10 /* inet6 */, 16 /* netlink */};

static int listed(const char *const *list, const char *name) {
    for (; *list; list++)
        if (strcmp(*list, name) == 0) return 1;
    return 0;
}

static void die(const char *what, int rc) {
    fprintf(stderr, "sandpod-seccomp-gen: %s: %s\n", what, strerror(-rc));
    exit(1);
}

static void add(scmp_filter_ctx ctx, uint32_t action, int nr, unsigned n, struct scmp_arg_cmp *cmp) {
    int rc = seccomp_rule_add_array(ctx, action, nr, n, cmp);
    if (rc != 0) die("seccomp_rule_add", rc);
}

static int last_known; /* the highest native number libseccomp can name */

static scmp_filter_ctx build(int nested) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
    if (!ctx) die("seccomp_init", -ENOMEM);
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    if (rc == 0) rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2); /* binary tree */
    if (rc != 0) die("seccomp_attr_set", rc);
    for (size_t k = 0; k < sizeof NEWER_ALLOWED / sizeof *NEWER_ALLOWED; k++)
        add(ctx, SCMP_ACT_ALLOW, NEWER_ALLOWED[k], 0, NULL);
    for (int nr = 0; nr < MAX_NR; nr++) {
        char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
        if (!name) continue; /* unused below last_known: EPERM; above: ENOSYS (prologue) */
        last_known = nr;
        int deny = listed(DENIED, name) || listed(BY_ARGUMENT, name) ||
                   (!nested && listed(NAMESPACES, name));
        if (!deny) add(ctx, SCMP_ACT_ALLOW, nr, 0, NULL);
        free(name);
    }
    struct scmp_arg_cmp cmp;
    if (nested) {
        add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 0, NULL);
        add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone3), 0, NULL);
    } else {
        cmp = SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NS_FLAGS, 0);
        add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1, &cmp);
        add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0, NULL);
    }
    for (size_t k = 0; k < sizeof PERSONALITIES / sizeof *PERSONALITIES; k++) {
        cmp = SCMP_A0(SCMP_CMP_EQ, PERSONALITIES[k]);
        add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), 1, &cmp);
    }
    for (size_t k = 0; k < sizeof SOCKET_FAMILIES / sizeof *SOCKET_FAMILIES; k++) {
        cmp = SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)SOCKET_FAMILIES[k]);
        add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), 1, &cmp);
    }
    return ctx;
}

/* A classic BPF program, built in memory (the reference and the emitted one). */
struct insn {
    unsigned short code;
    unsigned char jt, jf;
    unsigned int k;
};
#define MAX_PROG 2048
struct prog {
    struct insn ins[MAX_PROG];
    unsigned n;
};

static void put(struct prog *p, unsigned short code, unsigned jt, unsigned jf, unsigned k) {
    if (p->n >= MAX_PROG || jt > 255 || jf > 255) die("program too long", -E2BIG);
    p->ins[p->n++] = (struct insn){code, (unsigned char)jt, (unsigned char)jf, k};
}

/* The previous form of the filter, kept as the policy's reference: libseccomp's default-deny
 * program (an allow rule per system call) behind a prologue that kills a foreign ABI and
 * returns ENOSYS above every number libseccomp knows. ~440 instructions; every syscall walks it. */
static void reference(int nested, struct prog *out) {
    scmp_filter_ctx ctx = build(nested);
    char path[] = "/tmp/sandpod-seccomp-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) die("mkstemp", -errno);
    unlink(path);
    int rc = seccomp_export_bpf(ctx, fd);
    if (rc != 0) die("seccomp_export_bpf", rc);
    off_t size = lseek(fd, 0, SEEK_CUR);
    unsigned char *buf = malloc((size_t)size);
    if (!buf || pread(fd, buf, (size_t)size, 0) != size) die("read back", -EIO);
    const unsigned nnew = sizeof NEWER_ALLOWED / sizeof *NEWER_ALLOWED, main_at = 8 + nnew;
    out->n = 0;
    put(out, 0x20, 0, 0, 4);                         /* A = arch */
    put(out, 0x15, 1, 0, seccomp_arch_native());     /* native? */
    put(out, 0x06, 0, 0, SCMP_ACT_KILL_PROCESS);
    put(out, 0x20, 0, 0, 0);                         /* A = nr */
    put(out, 0x35, 0, 1, 0x40000000);                /* x32 bit? */
    put(out, 0x06, 0, 0, SCMP_ACT_KILL_PROCESS);
    put(out, 0x25, 0, main_at - 7, (unsigned)last_known); /* above every known number? */
    for (unsigned k = 0; k < nnew; k++) put(out, 0x15, main_at - (7 + k) - 1, 0, (unsigned)NEWER_ALLOWED[k]);
    put(out, 0x06, 0, 0, SCMP_ACT_ERRNO(ENOSYS));
    for (off_t i = 0; i + 8 <= size; i += 8) {
        unsigned short code;
        unsigned int k;
        memcpy(&code, buf + i, 2);
        memcpy(&k, buf + i + 4, 4);
        put(out, code, buf[i + 2], buf[i + 3], k);
    }
    free(buf);
    close(fd);
    seccomp_release(ctx);
}

/* What a system call number gets, in the fast form (the same policy, per number). */
enum { C_CLONE, C_SOCKET, C_PERSONALITY, C_ALLOW, C_EPERM, C_ENOSYS, C_KILL, NCLASS };

static int class_of(int nr, int nested) {
    for (size_t k = 0; k < sizeof NEWER_ALLOWED / sizeof *NEWER_ALLOWED; k++)
        if (nr == NEWER_ALLOWED[k]) return C_ALLOW;
    if (nr > last_known) return C_ENOSYS;
    char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr);
    if (!name) return C_EPERM; /* an unused number below the known ones */
    int c = C_ALLOW;
    if (strcmp(name, "clone") == 0) c = nested ? C_ALLOW : C_CLONE;
    else if (strcmp(name, "clone3") == 0) c = nested ? C_ALLOW : C_ENOSYS;
    else if (strcmp(name, "socket") == 0) c = C_SOCKET;
    else if (strcmp(name, "personality") == 0) c = C_PERSONALITY;
    else if (listed(DENIED, name) || (!nested && listed(NAMESPACES, name))) c = C_EPERM;
    free(name);
    return c;
}

/* Jump targets while emitting: >= 0 an instruction, < 0 the block of class -1 - ref. */
static int tt[MAX_PROG], tf[MAX_PROG];

static void put_ref(struct prog *p, unsigned short code, int jt, int jf, unsigned k) {
    tt[p->n] = jt;
    tf[p->n] = jf;
    put(p, code, 0, 0, k);
}

/* Segments of numbers: a class, and single numbers inside it with another class (a run of
 * one between two runs of the same class costs one jeq instead of two jge). */
#ifndef MAX_EXCEPTIONS
#define MAX_EXCEPTIONS 4 /* per segment: a chain of jeq, walked in full by the allowed numbers */
#endif
static unsigned seg_start[MAX_NR + 1], exc_nr[MAX_NR + 1];
static int seg_cls[MAX_NR + 1], seg_exc[MAX_NR + 2], exc_cls[MAX_NR + 1];

static int segments(const unsigned *start, const int *cls, int runs) {
    int nseg = 0, nexc = 0;
    for (int i = 0; i < runs;) {
        seg_start[nseg] = start[i], seg_cls[nseg] = cls[i], seg_exc[nseg] = nexc;
        int j = i + 1;
        while (j + 1 < runs && start[j + 1] - start[j] == 1 && cls[j + 1] == cls[i] &&
               nexc - seg_exc[nseg] < MAX_EXCEPTIONS)
            exc_nr[nexc] = start[j], exc_cls[nexc++] = cls[j], j += 2;
        nseg++, i = j;
    }
    seg_exc[nseg] = nexc;
    return nseg;
}

static int leaf(struct prog *p, int s) {
    if (seg_exc[s] == seg_exc[s + 1]) return -1 - seg_cls[s];
    int first = (int)p->n;
    for (int e = seg_exc[s]; e < seg_exc[s + 1]; e++)
        put_ref(p, 0x15, -1 - exc_cls[e], e + 1 < seg_exc[s + 1] ? (int)p->n + 1 : -1 - seg_cls[s],
                exc_nr[e]);
    return first;
}

/* A balanced binary search over the segments: the path of a number is ~log2(segments)
 * comparisons (and its segment's chain), for the kernel's action-cache emulation at load and
 * for the uncached (argument-filtered or refused) calls. */
static int tree(struct prog *p, int lo, int hi) {
    if (lo == hi) return leaf(p, lo);
    int at = (int)p->n, mid = (lo + hi + 1) / 2;
    put_ref(p, 0x35, 0, 0, seg_start[mid]); /* jge seg_start[mid] */
    tf[at] = tree(p, lo, mid - 1);
    tt[at] = tree(p, mid, hi);
    return at;
}

/* The first argument, as libseccomp compares it: all 64 bits (low word at 16, high at 20). */
static void one_of(struct prog *p, const unsigned long *values, size_t n) {
    put_ref(p, 0x20, 0, 0, 20);
    put_ref(p, 0x15, (int)p->n + 1, -1 - C_EPERM, 0); /* high word 0, else EPERM */
    put_ref(p, 0x20, 0, 0, 16);
    for (size_t k = 0; k < n; k++)
        put_ref(p, 0x15, -1 - C_ALLOW, k + 1 < n ? (int)p->n + 1 : -1 - C_EPERM, (unsigned)values[k]);
}

/* The emitted form: default allow, every refusal explicit; its path for an allowed number reads
 * only the number and the architecture, so the kernel (>= 5.11) caches it as allowed and such a
 * call never runs the filter again. */
static void fast(int nested, struct prog *p) {
    unsigned start[MAX_NR + 1];
    int cls[MAX_NR + 1], runs = 0;
    for (int nr = 0; nr <= MAX_NR; nr++) {
        int c = nr == MAX_NR ? C_ENOSYS : class_of(nr, nested);
        if (runs == 0 || cls[runs - 1] != c) start[runs] = (unsigned)nr, cls[runs++] = c;
    }
    p->n = 0;
    put_ref(p, 0x20, 0, 0, 4);                                   /* A = arch */
    put_ref(p, 0x15, 2, -1 - C_KILL, seccomp_arch_native());     /* native, else kill */
    put_ref(p, 0x20, 0, 0, 0);                                   /* A = nr */
    put_ref(p, 0x35, -1 - C_KILL, 4, 0x40000000);                /* x32 (or above): kill */
    tree(p, 0, segments(start, cls, runs) - 1);
    int block[NCLASS];
    block[C_CLONE] = (int)p->n;
    put_ref(p, 0x20, 0, 0, 16); /* no CLONE_NEW* flag in the low word (the mask's high is 0) */
    put_ref(p, 0x45, -1 - C_EPERM, -1 - C_ALLOW, (unsigned)CLONE_NS_FLAGS);
    block[C_SOCKET] = (int)p->n;
    unsigned long families[sizeof SOCKET_FAMILIES / sizeof *SOCKET_FAMILIES];
    for (size_t k = 0; k < sizeof families / sizeof *families; k++)
        families[k] = (unsigned long)SOCKET_FAMILIES[k];
    one_of(p, families, sizeof families / sizeof *families);
    block[C_PERSONALITY] = (int)p->n;
    one_of(p, PERSONALITIES, sizeof PERSONALITIES / sizeof *PERSONALITIES);
    const unsigned ret[] = {[C_ALLOW] = SCMP_ACT_ALLOW, [C_EPERM] = SCMP_ACT_ERRNO(EPERM),
                            [C_ENOSYS] = SCMP_ACT_ERRNO(ENOSYS), [C_KILL] = SCMP_ACT_KILL_PROCESS};
    for (int c = C_ALLOW; c < NCLASS; c++) block[c] = (int)p->n, put_ref(p, 0x06, 0, 0, ret[c]);
    for (unsigned i = 0; i < p->n; i++) { /* resolve the targets into forward offsets */
        if (p->ins[i].code == 0x06 || p->ins[i].code == 0x20) continue;
        int t[2] = {tt[i], tf[i]};
        for (int j = 0; j < 2; j++) {
            int to = t[j] < 0 ? block[-1 - t[j]] : t[j], off = to - (int)i - 1;
            if (off < 0 || off > 255) die("jump out of reach", -E2BIG);
            if (j == 0) p->ins[i].jt = (unsigned char)off;
            else p->ins[i].jf = (unsigned char)off;
        }
    }
}

/* A classic BPF interpreter for what both forms use (as the kernel runs them). */
static unsigned run(const struct prog *p, const unsigned *data) {
    unsigned a = 0;
    for (unsigned pc = 0; pc < p->n; pc++) {
        const struct insn *f = &p->ins[pc];
        switch (f->code) {
        case 0x20: /* ld [k] */
            if (f->k % 4 || f->k >= 64) die("load outside seccomp_data", -EINVAL);
            a = data[f->k / 4];
            break;
        case 0x05: pc += f->k; break;
        case 0x15: pc += a == f->k ? f->jt : f->jf; break;
        case 0x25: pc += a > f->k ? f->jt : f->jf; break;
        case 0x35: pc += a >= f->k ? f->jt : f->jf; break;
        case 0x45: pc += a & f->k ? f->jt : f->jf; break;
        case 0x54: a &= f->k; break;
        case 0x06: return f->k;
        default:
            fprintf(stderr, "sandpod-seccomp-gen: opcode 0x%04x unknown to the check\n", f->code);
            exit(1);
        }
    }
    die("the program falls off its end", -EINVAL);
    return 0;
}

/* The emitted program must answer exactly as the reference for every architecture, every number
 * (native, x32 and beyond) and first arguments around every value a rule names, or no header. */
static unsigned long check(const struct prog *ref, const struct prog *got) {
    static const unsigned arches[] = {0, 0x40000003 /* i386 */, 0xc00000b7 /* aarch64 */};
    unsigned long base[64 + 32], vals[3 * (64 + 32)], n = 0, probes = 0;
    size_t nb = 0;
    for (int b = 0; b < 64; b++) base[nb++] = 1UL << b;
    const unsigned long extra[] = {0, 3, 9, 17, 40, 0x11, 0x3d0f00, 0x20001, 0x40000, 0xfffffffe,
                                   CLONE_NS_FLAGS, CLONE_NS_FLAGS | 0x11};
    for (size_t k = 0; k < sizeof extra / sizeof *extra; k++) base[nb++] = extra[k];
    for (size_t k = 0; k < sizeof PERSONALITIES / sizeof *PERSONALITIES; k++) base[nb++] = PERSONALITIES[k];
    for (size_t k = 0; k < sizeof SOCKET_FAMILIES / sizeof *SOCKET_FAMILIES; k++)
        base[nb++] = (unsigned long)SOCKET_FAMILIES[k];
    for (size_t k = 0; k < nb; k++) {
        vals[n++] = base[k];
        vals[n++] = base[k] | 1UL << 32;
        vals[n++] = base[k] | 0xffffffff00000000UL;
    }
    unsigned data[16];
    /* 0..1100, around the x32 bit (0x3ffffff0..0x40000400), the top 16 */
    for (unsigned long nr = 0; nr < 0x100000000UL;
         nr = nr == 1100 ? 0x3ffffff0 : nr == 0x40000400 ? 0xfffffff0 : nr + 1) {
        for (size_t a = 0; a < 1 + sizeof arches / sizeof *arches; a++) {
            memset(data, 0, sizeof data);
            data[0] = (unsigned)nr;
            data[1] = a == 0 ? seccomp_arch_native() : arches[a - 1];
            data[2] = 0x12345678;
            for (unsigned long v = 0; v < (a == 0 ? n : 1); v++) {
                data[4] = (unsigned)vals[v], data[5] = (unsigned)(vals[v] >> 32);
                for (int j = 6; j < 16; j++) data[j] = v & 1 ? 0xdeadbeefU * (unsigned)j : 0;
                unsigned want = run(ref, data), have = run(got, data);
                probes++;
                if (want != have) {
                    fprintf(stderr, "sandpod-seccomp-gen: nr %lu arch 0x%x a0 0x%lx: 0x%x, "
                            "the policy says 0x%x\n", nr, data[1], vals[v], have, want);
                    exit(1);
                }
            }
        }
    }
    return probes;
}

static struct prog ref_prog, fast_prog;

static void emit(const char *name, int nested) {
    reference(nested, &ref_prog);
    fast(nested, &fast_prog);
    unsigned long probes = check(&ref_prog, &fast_prog);
    fprintf(stderr, "sandpod-seccomp-gen: %s: %u instructions (libseccomp's default-deny form: %u), "
            "the same answer on %lu probes\n", name, fast_prog.n, ref_prog.n, probes);
    printf("static const struct sock_filter %s[] = {\n", name);
    for (unsigned i = 0; i < fast_prog.n; i++) {
        const struct insn *f = &fast_prog.ins[i];
        printf("    {0x%04x, %u, %u, 0x%08x},\n", f->code, f->jt, f->jf, f->k);
    }
    printf("};\n");
}
int main(void) {
    printf("/* generated by sandpod-seccomp-gen (services/execd/native/seccomp_gen.c) */\n");
    printf("#define SANDPOD_SECCOMP 1\n");
    emit("sandpod_filter_default", 0);
    emit("sandpod_filter_nested", 1);
    return 0;
}
