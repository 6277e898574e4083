/*
 * sandpod-jail-exec --root-ops: the holder's root-building steps, in one process.
 *
 * The holder (holder.sh, run as root in the sandbox's fresh namespaces) builds the sandbox's root
 * from mounts, directories and links. Done with the host's tools that is ~30 processes
 * (mount(8), mkdir, ln, ip, pivot_root, umount), each a fork + exec of a dynamically linked
 * binary: ~2-4 ms apiece on a small VM, most of a local create. This mode does the same steps
 * with the system calls those tools make, in the order given, so the holder spawns one process
 * per batch instead of one per step:
 *
 *   sandpod-jail-exec --root-ops OP ARGS... [OP ARGS...]...
 *
 *   mount TYPE SOURCE TARGET FLAGS DATA   mount(2); FLAGS a comma list of ro, nosuid, nodev,
 *                                         noexec, bind, remount ("" for none); DATA passed as is
 *                                         ("" for none). A remount keeps every restriction the
 *                                         mount has already (ro, nosuid, nodev, noexec, atime
 *                                         flags): it only ever adds some, as mount(8) does.
 *   bindfile SOURCE TARGET                create the empty file TARGET, bind SOURCE over it
 *   mask PATH                             if PATH is a directory (now: a step before may have
 *                                         mounted the root it is in), an empty read-only tmpfs
 *                                         over it (ro,nosuid,nodev,noexec size=4k,mode=0755)
 *   mkdir PATH                            mkdir -p of one level: an existing directory is fine
 *   symlink TARGET LINK                   ln -s TARGET LINK
 *   lo-up                                 ip link set lo up (this network namespace's)
 *   pivot DIR                             cd DIR; pivot_root . .; umount -l .; cd /
 *
 * Paths are used as given (the holder passes them, as it passed them to the tools: a symlink in
 * a path is followed as mount(8) and mkdir(1) follow it). The first failing step ends the batch:
 * exit 125 with the step and the reason on stderr (the holder's set -e then ends the holder,
 * whose stderr is the log the driver quotes).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

int root_ops(int argc, char **argv);

static int op_fail(const char *op, const char *arg) {
    fprintf(stderr, "sandpod-jail-exec: %s %s: %s\n", op, arg ? arg : "", strerror(errno));
    return 125;
}

/* The MS_* flags of a comma list; -1 (errno EINVAL) for a word we do not know. */
static long parse_flags(const char *list) {
    static const struct { const char *name; unsigned long flag; } words[] = {
        {"ro", MS_RDONLY}, {"nosuid", MS_NOSUID}, {"nodev", MS_NODEV}, {"noexec", MS_NOEXEC},
        {"bind", MS_BIND}, {"remount", MS_REMOUNT},
    };
    unsigned long flags = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        size_t k = 0;
        for (; k < sizeof words / sizeof words[0]; k++)
            if (strlen(words[k].name) == len && strncmp(p, words[k].name, len) == 0) break;
        if (k == sizeof words / sizeof words[0]) {
            errno = EINVAL;
            return -1;
        }
        flags |= words[k].flag;
        p += len + (p[len] == ',');
    }
    return (long)flags;
}

/* The restrictions `target`'s mount has now, as MS_* flags (a bind remount replaces them all). */
static unsigned long kept_flags(const char *target) {
    static const struct { unsigned long st, ms; } map[] = {
        {ST_RDONLY, MS_RDONLY},   {ST_NOSUID, MS_NOSUID},         {ST_NODEV, MS_NODEV},
        {ST_NOEXEC, MS_NOEXEC},   {ST_NOATIME, MS_NOATIME},       {ST_NODIRATIME, MS_NODIRATIME},
        {ST_RELATIME, MS_RELATIME},
    };
    struct statvfs st;
    unsigned long flags = 0;
    if (statvfs(target, &st) != 0) return 0; /* mount(2) then fails on the target itself */
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
        if (st.f_flag & map[k].st) flags |= map[k].ms;
    return flags;
}

static int do_mount(char **a) {
    long flags = parse_flags(a[3]);
    if (flags < 0) return op_fail("mount flags", a[3]);
    unsigned long f = (unsigned long)flags;
    if (f & MS_REMOUNT) f |= kept_flags(a[2]);
    if (mount(a[1], a[2], a[0], f, a[4][0] ? a[4] : NULL) != 0) return op_fail("mount", a[2]);
    return 0;
}

static int do_bindfile(char **a) {
    int fd = open(a[1], O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0666);
    if (fd < 0) return op_fail("create", a[1]);
    close(fd);
    if (mount(a[0], a[1], NULL, MS_BIND, NULL) != 0) return op_fail("bind", a[1]);
    return 0;
}

static int do_mask(char **a) {
    struct stat st;
    if (stat(a[0], &st) != 0 || !S_ISDIR(st.st_mode)) return 0; /* as the shell's [ -d ] */
    unsigned long flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
    if (mount("sandpod-masked", a[0], "tmpfs", flags, "size=4k,mode=0755") != 0)
        return op_fail("mask", a[0]);
    return 0;
}

static int do_mkdir(char **a) {
    struct stat st;
    if (mkdir(a[0], 0777) == 0) return 0;
    if (errno == EEXIST && stat(a[0], &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    return op_fail("mkdir", a[0]);
}

static int do_symlink(char **a) {
    if (symlink(a[0], a[1]) != 0) return op_fail("symlink", a[1]);
    return 0;
}

static int do_lo_up(char **a) {
    (void)a;
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return op_fail("socket", "lo");
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    int ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP;
    ok = ok && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    int saved = errno;
    close(s);
    errno = saved;
    return ok ? 0 : op_fail("link up", "lo");
}

static int do_pivot(char **a) {
    if (chdir(a[0]) != 0) return op_fail("chdir", a[0]);
    if (syscall(SYS_pivot_root, ".", ".") != 0) return op_fail("pivot_root", a[0]);
    if (umount2(".", MNT_DETACH) != 0) return op_fail("umount", "the old root");
    if (chdir("/") != 0) return op_fail("chdir", "/");
    return 0;
}

int root_ops(int argc, char **argv) {
    static const struct { const char *name; int nargs; int (*run)(char **); } ops[] = {
        {"mount", 5, do_mount},     {"bindfile", 2, do_bindfile}, {"mkdir", 1, do_mkdir},
        {"mask", 1, do_mask},
        {"symlink", 2, do_symlink}, {"lo-up", 0, do_lo_up},       {"pivot", 1, do_pivot},
    };
    int i = 0;
    while (i < argc) {
        size_t k = 0;
        for (; k < sizeof ops / sizeof ops[0]; k++)
            if (strcmp(argv[i], ops[k].name) == 0) break;
        if (k == sizeof ops / sizeof ops[0]) {
            fprintf(stderr, "sandpod-jail-exec: unknown root op %s\n", argv[i]);
            return 125;
        }
        if (i + 1 + ops[k].nargs > argc) {
            fprintf(stderr, "sandpod-jail-exec: root op %s needs %d arguments\n", argv[i],
                    ops[k].nargs);
            return 125;
        }
        int rc = ops[k].run(&argv[i + 1]);
        if (rc != 0) return rc;
        i += 1 + ops[k].nargs;
    }
    return 0;
}
