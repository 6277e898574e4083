/*
 * sandpod-jail-exec: enter a local-runtime sandbox and exec a command, in one step.
 *
 * Replaces the chain `sh (join cgroups) -> nsenter -> sh (unwrap env)` of execd's jail with one
 * small exec (the fork into the sandbox's pid namespace is done by execd before exec):
 *
 *   sandpod-jail-exec [--seccomp=MODE] [--userns] CGROUP_PROCS... -- HOLDER_PID CWD UID GID --
 *                     COMMAND [ARGS...]
 *   sandpod-jail-exec [--seccomp=MODE] --filter-only COMMAND [ARGS...]   (the holder's last step)
 *   sandpod-jail-exec --root-ops OP ARGS...   (the holder's mounts, in one process: root_ops.c)
 *
 *   1. write 0 to each cgroup file named (`tasks` on v1: see cgroup_join_file in sandpod_service;
 *      `cgroup.procs` on v2), joining the command's cgroups before anything runs; raise a
 *      negative oom_score_adj inherited from execd to 0 (a sandbox's processes are always fair
 *      game for its OOM killer; unprivileged, they could not have lowered it);
 *   2. enter the holder's cgroup, ipc, uts, net and mount namespaces and its root;
 *   3. drop supplementary groups, setgid GID, setuid UID, then chdir CWD (inside, as the user);
 *   4. replace the environment by the SANDPOD_JAIL_ENV_<i>=NAME=VALUE variables, unwrapped
 *      (the root steps never see the command's environment as such: no LD_PRELOAD as root);
 *   5. load the seccomp filter of MODE (below), then execvp COMMAND (PATH from the unwrapped
 *      environment).
 *
 * --userns (rootless: the jail lives in a user namespace we own): step 2 enters the user
 * namespace first, which grants the rights to enter the others, and the pid namespace too;
 * execd cannot fork into it (a multithreaded process may not change user namespace), so this
 * process forks the command into it and stays as a transparent parent: it ignores the signals
 * execd sends to the command's process group (the command gets them too), kills the command if
 * it is killed itself (PR_SET_PDEATHSIG), and exits with the command's status (re-raising the
 * signal that ended it). Supplementary groups cannot be dropped there (setgroups is denied in
 * an unprivileged user namespace); the uid and gid are ours already.
 *
 * Seccomp MODE: `default` (the default), `nested` (a template allows nested user namespaces) or
 * `unconfined` (a template opted out: no filter). The filters are classic BPF programs compiled
 * at build time by seccomp_gen.c (libseccomp) into seccomp_bpf.h, policy described there; built
 * without libseccomp (SANDPOD_SECCOMP undefined) no filter is loaded, and the lifecycle reports
 * the jail's seccomp protection as degraded (it reads the holder's `Seccomp:` line). The filter
 * is the last thing loaded before exec, so the steps as root are not filtered; with --userns it
 * is loaded before the fork, so the transparent parent is filtered too. --filter-only is the
 * holder's last step: no_new_privs, the filter, fds above 2 closed, exec.
 *
 * Exit 125 with a message on stderr when a step fails (like nsenter/the shell did), 127 when
 * the command cannot be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#if __has_include("seccomp_bpf.h")
#include "seccomp_bpf.h" /* generated at build time by seccomp_gen.c; defines SANDPOD_SECCOMP */
#endif

extern char **environ;

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "sandpod-jail-exec: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    return 125;
}

/* Load the filter of `mode` ("default", "nested" or "unconfined"); needs no_new_privs (or
 * CAP_SYS_ADMIN). Returns 0, or -1 with errno set. */
static int load_seccomp(const char *mode) {
    if (strcmp(mode, "unconfined") == 0) return 0;
    if (strcmp(mode, "default") != 0 && strcmp(mode, "nested") != 0) {
        errno = EINVAL;
        return -1;
    }
#ifdef SANDPOD_SECCOMP
    int nested = strcmp(mode, "nested") == 0;
    struct sock_fprog prog = {
        .len = (unsigned short)(nested ? sizeof sandpod_filter_nested / sizeof(struct sock_filter)
                                       : sizeof sandpod_filter_default / sizeof(struct sock_filter)),
        .filter = (struct sock_filter *)(nested ? sandpod_filter_nested : sandpod_filter_default),
    };
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0);
#else
    return 0; /* built without libseccomp: reported as degraded by the lifecycle */
#endif
}

/* 0 if our oom_score_adj is negative (execd's, inherited); raising it needs no privilege. */
static int oom_score_at_least_zero(void) {
    char buf[16] = {0};
    int fd = open("/proc/self/oom_score_adj", O_RDWR | O_CLOEXEC);
    if (fd < 0 || read(fd, buf, sizeof buf - 1) < 0) return fail("read", "oom_score_adj");
    int ok = atoi(buf) >= 0 || (lseek(fd, 0, SEEK_SET) == 0 && write(fd, "0", 1) == 1);
    close(fd);
    return ok ? 0 : fail("reset", "oom_score_adj");
}

/* Rootless: fork the command into the pid namespace entered; wait; exit as it did. */
static int forward(void) {
    static const int quiet[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE,
                                SIGALRM, SIGTSTP, SIGTTIN, SIGTTOU, SIGWINCH, SIGCONT};
    const size_t nquiet = sizeof quiet / sizeof quiet[0];
    for (size_t k = 0; k < nquiet; k++) signal(quiet[k], SIG_IGN);
    pid_t child = fork();
    if (child < 0) return fail("fork", NULL);
    if (child == 0) {
        for (size_t k = 0; k < nquiet; k++) signal(quiet[k], SIG_DFL);
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) _exit(fail("pdeathsig", NULL));
        /* Our parent is outside the pid namespace, so getppid() is 0 while it lives; had it
         * died before the prctl, we would have been re-parented to the holder (pid 1). */
        if (getppid() != 0) _exit(125);
        return -1;                          /* go on to exec the command */
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) return fail("waitpid", NULL);
    if (WIFEXITED(status)) exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no core file of ours for the command's SIGSEGV */
    raise(sig);
    exit(128 + sig);
}

int root_ops(int argc, char **argv); /* root_ops.c: the holder's root-building steps */

int main(int argc, char **argv) {
    int i = 1, userns = 0;
    const char *seccomp = "default";
    if (argc > 1 && strcmp(argv[1], "--root-ops") == 0) return root_ops(argc - 2, argv + 2);
    if (i < argc && strncmp(argv[i], "--seccomp=", 10) == 0) seccomp = argv[i++] + 10;
    if (i < argc && strcmp(argv[i], "--filter-only") == 0) {
        if (i + 1 >= argc) return fail("no command", NULL);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("no_new_privs", NULL);
        if (load_seccomp(seccomp) != 0) return fail("seccomp filter", seccomp);
        syscall(SYS_close_range, 3U, ~0U, 0U); /* the holder opened us as fd 9 */
        execvp(argv[i + 1], &argv[i + 1]);
        return fail("exec", argv[i + 1]);
    }
    if (i < argc && strcmp(argv[i], "--userns") == 0) {
        userns = 1;
        i++;
    }
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) return fail("join cgroup", argv[i]);
        close(fd);
    }
    if (oom_score_at_least_zero() != 0) return 125;
    if (i + 6 > argc || strcmp(argv[i + 5], "--") != 0) {
        fprintf(stderr, "usage: sandpod-jail-exec [--seccomp=MODE] CGROUP_PROCS... -- PID CWD UID GID -- CMD...\n");
        return 125;
    }
    const char *pid = argv[i + 1], *cwd = argv[i + 2];
    uid_t uid = (uid_t)strtoul(argv[i + 3], NULL, 10);
    gid_t gid = (gid_t)strtoul(argv[i + 4], NULL, 10);
    char **command = &argv[i + 6];
    if (!command[0]) return fail("no command", NULL);

    /* user first (rootless: it grants the rights for the rest), pid before mnt */
    static const char *spaces[] = {"user", "pid", "cgroup", "ipc", "uts", "net", "mnt"};
    static const int types[] = {CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWCGROUP, CLONE_NEWIPC,
                                CLONE_NEWUTS, CLONE_NEWNET, CLONE_NEWNS};
    const int first = userns ? 0 : 2; /* as root, execd already forked us into the pid ns */
    char path[256];
    snprintf(path, sizeof path, "/proc/%s/root", pid);
    int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return fail("open", path);
    int fds[7];
    for (int k = first; k < 7; k++) {  /* open all first: /proc/<pid> is not visible after mnt */
        snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, spaces[k]);
        fds[k] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[k] < 0) return fail("open", path);
    }
    for (int k = first; k < 7; k++)
        if (setns(fds[k], types[k]) != 0) return fail("setns", spaces[k]);
    if (fchdir(root) != 0 || chroot(".") != 0) return fail("chroot", "holder root");
    if ((!userns && setgroups(0, NULL) != 0) || setgid(gid) != 0 || setuid(uid) != 0)
        return fail("drop privileges to", argv[i + 3]);
    /* As the sandbox's user: a cwd it may not enter is refused, never entered as root. */
    if (chdir(cwd) != 0) return fail("chdir", cwd);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("no_new_privs", NULL);
    if (userns) {
        if (load_seccomp(seccomp) != 0) return fail("seccomp filter", seccomp);
        int done = forward(); /* returns only in the child */
        if (done >= 0) return done;
    }

    /* Unwrap SANDPOD_JAIL_ENV_<i> in index order into a fresh environment. */
    size_t n = 0;
    for (char **e = environ; *e; e++) n++;
    char **env = calloc(n + 1, sizeof *env);
    if (!env) return fail("calloc", NULL);
    size_t out = 0;
    for (size_t want = 0; want < n; want++) {
        char key[64];
        int len = snprintf(key, sizeof key, "SANDPOD_JAIL_ENV_%zu=", want);
        char *found = NULL;
        for (char **e = environ; *e; e++)
            if (strncmp(*e, key, (size_t)len) == 0) { found = *e + len; break; }
        if (!found) break;
        env[out++] = found;
    }
    env[out] = NULL;
    environ = env;
    if (!userns && load_seccomp(seccomp) != 0) return fail("seccomp filter", seccomp);
    execvp(command[0], command);
    fprintf(stderr, "sandpod-jail-exec: %s: %s\n", command[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
