/*
 * sandpod-jail-exec: enter a local-runtime sandbox and exec a command, in one step.
 *
 * Replaces the chain `sh (join cgroups) -> nsenter -> sh (unwrap env)` of execd's jail with one
 * small exec (the fork into the sandbox's pid namespace is done by execd before exec):
 *
 *   sandpod-jail-exec CGROUP_PROCS... -- HOLDER_PID CWD UID GID -- COMMAND [ARGS...]
 *
 *   1. write 0 to each cgroup file named (`tasks` on v1: see cgroup_join_file in sandpod_service;
 *      `cgroup.procs` on v2), joining the command's cgroups before anything runs;
 *   2. enter the holder's cgroup, ipc, uts, net and mount namespaces and its root;
 *   3. chdir CWD (inside), drop supplementary groups, setgid GID, setuid UID;
 *   4. replace the environment by the SANDPOD_JAIL_ENV_<i>=NAME=VALUE variables, unwrapped
 *      (the root steps never see the command's environment as such: no LD_PRELOAD as root);
 *   5. execvp COMMAND (PATH from the unwrapped environment).
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
#include <sys/prctl.h>
#include <unistd.h>

extern char **environ;

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "sandpod-jail-exec: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    return 125;
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int fd = open(argv[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) return fail("join cgroup", argv[i]);
        close(fd);
    }
    if (i + 6 > argc || strcmp(argv[i + 5], "--") != 0) {
        fprintf(stderr, "usage: sandpod-jail-exec CGROUP_PROCS... -- PID CWD UID GID -- CMD...\n");
        return 125;
    }
    const char *pid = argv[i + 1], *cwd = argv[i + 2];
    uid_t uid = (uid_t)strtoul(argv[i + 3], NULL, 10);
    gid_t gid = (gid_t)strtoul(argv[i + 4], NULL, 10);
    char **command = &argv[i + 6];
    if (!command[0]) return fail("no command", NULL);

    static const char *spaces[] = {"cgroup", "ipc", "uts", "net", "mnt"};
    static const int types[] = {CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET,
                                CLONE_NEWNS};
    char path[256];
    snprintf(path, sizeof path, "/proc/%s/root", pid);
    int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return fail("open", path);
    int fds[5];
    for (int k = 0; k < 5; k++) {  /* open all first: /proc/<pid> is not visible after mnt */
        snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, spaces[k]);
        fds[k] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[k] < 0) return fail("open", path);
    }
    for (int k = 0; k < 5; k++)
        if (setns(fds[k], types[k]) != 0) return fail("setns", spaces[k]);
    if (fchdir(root) != 0 || chroot(".") != 0) return fail("chroot", "holder root");
    if (chdir(cwd) != 0) return fail("chdir", cwd);
    if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
        return fail("drop privileges to", argv[i + 3]);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("no_new_privs", NULL);

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
    execvp(command[0], command);
    fprintf(stderr, "sandpod-jail-exec: %s: %s\n", command[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}
