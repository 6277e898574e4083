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

static void emit(const char *name, int nested) {
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
    /* The prologue: a foreign ABI is killed (libseccomp checks it too, further on), and a
     * number above every one libseccomp knows fails with ENOSYS unless NEWER_ALLOWED names it:
     * one comparison instead of a rule per unknown number (a smaller program loads faster). */
    const size_t nnew = sizeof NEWER_ALLOWED / sizeof *NEWER_ALLOWED;
    const unsigned main_at = 8 + (unsigned)nnew;
    printf("static const struct sock_filter %s[] = {\n", name);
    printf("    {0x0020, 0, 0, 0x00000004},\n");                     /* 0: A = arch */
    printf("    {0x0015, 1, 0, 0x%08x},\n", seccomp_arch_native()); /* 1: native? skip 1 */
    printf("    {0x0006, 0, 0, 0x%08x},\n", SCMP_ACT_KILL_PROCESS); /* 2: kill */
    printf("    {0x0020, 0, 0, 0x00000000},\n");                     /* 3: A = nr */
    printf("    {0x0035, 0, 1, 0x40000000},\n");                     /* 4: x32 bit? */
    printf("    {0x0006, 0, 0, 0x%08x},\n", SCMP_ACT_KILL_PROCESS); /* 5: kill */
    printf("    {0x0025, 0, %u, 0x%08x},\n", main_at - 7, (unsigned)last_known); /* 6: > known? */
    for (size_t k = 0; k < nnew; k++)                                  /* 7..: newer allowed */
        printf("    {0x0015, %u, 0, 0x%08x},\n", (unsigned)(main_at - (7 + k) - 1),
               (unsigned)NEWER_ALLOWED[k]);
    printf("    {0x0006, 0, 0, 0x%08x},\n", SCMP_ACT_ERRNO(ENOSYS)); /* unknown: ENOSYS */
    for (off_t i = 0; i + 8 <= size; i += 8) {                       /* libseccomp's */
        unsigned short code;
        unsigned int k;
        memcpy(&code, buf + i, 2);
        memcpy(&k, buf + i + 4, 4);
        printf("    {0x%04x, %u, %u, 0x%08x},\n", code, buf[i + 2], buf[i + 3], k);
    }
    printf("};\n");
    free(buf);
    close(fd);
    seccomp_release(ctx);
}

int main(void) {
    printf("/* generated by sandpod-seccomp-gen (services/execd/native/seccomp_gen.c) */\n");
    printf("#define SANDPOD_SECCOMP 1\n");
    emit("sandpod_filter_default", 0);
    emit("sandpod_filter_nested", 1);
    return 0;
}
