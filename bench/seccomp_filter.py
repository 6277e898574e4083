"""What the jail's seccomp filter costs: loading it, entering with it, and system calls under it.

Compiles a small C harness against a generated filter header (``make install``'s
``.venv/build/seccomp/seccomp_bpf.h`` unless ``--header``) and, interleaving the modes so host
noise hits them alike, measures in fresh child processes:

- load: one ``prctl(PR_SET_SECCOMP)`` of the filter (floor: a one-instruction allow filter);
- calls: ns per ``getppid`` over ``--calls`` calls, best of 5 (its result depends on no argument:
  with the kernel's action cache, Linux >= 5.11, it never runs the filter, so inside ~= outside;
  ``uncached`` is the default filter behind one load of an argument, which the cache cannot
  follow, so every call runs it) and per ``personality(0xffffffff)`` (filtered by argument: runs
  the filter every time);
- cache: which native numbers 0..511 the kernel's load-time emulation (seccomp_is_const_allow:
  only loads of the number and the architecture, jumps on constants, returns) finds always
  allowed, i.e. cached; the rest are the refused and the argument-filtered ones;
- entry: ``sandpod-jail-exec --seccomp=MODE --filter-only /bin/true`` spawned and waited (the
  helper built with the same header), default vs unconfined.

    .venv/bin/python bench/seccomp_filter.py [--header FILE] [--rounds 300] [--calls 1000000]

Compare two builds by running it with each header (e.g. one generated on main).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# The smoke run's tiny sizes (tests/integration/test_bench_smoke.py): it works, nothing timed
SMOKE_ARGS = ["--rounds", "3", "--calls", "1000"]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = r"""
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "seccomp_bpf.h"
extern char **environ;
static const struct sock_filter one[] = {{0x06, 0, 0, SECCOMP_RET_ALLOW}};
static struct sock_filter uncached[2048]; /* ld args[0] (unused) + the default: never cached */
static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static void sample(const char *mode, long calls) {
    int fd[2];
    if (pipe(fd) != 0) exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        struct sock_fprog p = {0, NULL};
        if (!strcmp(mode, "one")) p.len = 1, p.filter = (struct sock_filter *)one;
        if (!strcmp(mode, "default"))
            p.len = sizeof sandpod_filter_default / sizeof *sandpod_filter_default,
            p.filter = (struct sock_filter *)sandpod_filter_default;
        if (!strcmp(mode, "uncached")) {
            p.len = 1 + sizeof sandpod_filter_default / sizeof *sandpod_filter_default;
            uncached[0] = (struct sock_filter){0x20, 0, 0, 16};
            memcpy(uncached + 1, sandpod_filter_default, sizeof sandpod_filter_default);
            p.filter = uncached;
        }
        if (!strcmp(mode, "nested"))
            p.len = sizeof sandpod_filter_nested / sizeof *sandpod_filter_nested,
            p.filter = (struct sock_filter *)sandpod_filter_nested;
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) _exit(1);
        long long t0 = now();
        if (p.len && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p, 0, 0) != 0) _exit(2);
        long long t1 = now();
        for (long i = 0; i < calls; i++) syscall(SYS_getppid);
        long long t2 = now();
        for (long i = 0; i < calls / 10; i++) syscall(SYS_personality, 0xffffffffUL);
        long long t3 = now();
        dprintf(fd[1], "%s %lld %.2f %.2f\n", mode, t1 - t0, calls ? (double)(t2 - t1) / calls : 0,
                calls ? (double)(t3 - t2) / (calls / 10) : 0);
        _exit(0);
    }
    close(fd[1]);
    char buf[256];
    ssize_t n = read(fd[0], buf, sizeof buf - 1);
    close(fd[0]);
    int st;
    waitpid(pid, &st, 0);
    if (n <= 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "%s failed\n", mode);
        exit(1);
    }
    buf[n] = 0;
    fputs(buf, stdout);
}
static void entry(const char *helper, const char *mode) {
    char arg[64];
    snprintf(arg, sizeof arg, "--seccomp=%s", mode);
    char *argv[] = {(char *)helper, arg, "--filter-only", "/bin/true", NULL};
    long long t0 = now();
    pid_t pid;
    if (posix_spawn(&pid, helper, NULL, NULL, argv, environ) != 0) exit(1);
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "entry %s failed\n", mode); exit(1); }
    printf("entry-%s %lld\n", mode, now() - t0);
}
int main(int argc, char **argv) {
    int rounds = atoi(argv[1]);
    long calls = atol(argv[2]);
    const char *modes[] = {"none", "one", "default", "nested", "uncached"};
    for (int r = 0; r < rounds; r++)
        for (int m = 0; m < 5; m++) sample(modes[m], r < 5 ? calls : 0);
    for (int r = 0; r < rounds; r++) entry(argv[3], "default"), entry(argv[3], "unconfined");
    return 0;
}
"""


NATIVE_ARCH = 0xC000003E  # AUDIT_ARCH_X86_64
Insn = tuple[int, int, int, int]


def programs(header: str) -> dict[str, list[Insn]]:
    """The header's filters, by name."""
    out: dict[str, list[Insn]] = {}
    name = ""
    for line in header.splitlines():
        if line.startswith("static const struct sock_filter "):
            name = line.split()[4].rstrip("[]")
            out[name] = []
        elif line.startswith("    {") and name:
            code, jt, jf, k = (int(v, 0) for v in line.strip(" {},").split(","))
            out[name].append((code, jt, jf, k))
    return out


def const_allow(prog: list[Insn], nr: int) -> bool:
    """The kernel's seccomp_is_const_allow (kernel/seccomp.c) for the native architecture."""
    a, pc = 0, 0
    while pc < len(prog):
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x20:  # ld [k]: only the number and the architecture are known
            if k not in (0, 4):
                return False
            a = nr if k == 0 else NATIVE_ARCH
        elif code == 0x06:
            return k == 0x7FFF0000
        elif code == 0x05:
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):
            hit = {0x15: a == k, 0x25: a > k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if hit else jf
        elif code == 0x54:
            a &= k
        else:
            return False
    return False


def ranges(nrs: set[int]) -> str:
    out: list[str] = []
    for nr in sorted(nrs):
        if out and out[-1].split("-")[-1] == str(nr - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{nr}"
        else:
            out.append(str(nr))
    return ",".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--header", type=Path, default=ROOT / ".venv/build/seccomp/seccomp_bpf.h")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--calls", type=int, default=1_000_000)
    args = ap.parse_args()
    cc = shutil.which("cc")
    if cc is None or not args.header.is_file():
        print(f"needs a C compiler and {args.header} (make install with libseccomp-dev)")
        return 2
    with tempfile.TemporaryDirectory(prefix="sandpod-seccomp-bench-") as tmp:
        work = Path(tmp)
        shutil.copy(args.header, work / "seccomp_bpf.h")
        (work / "harness.c").write_text(HARNESS)
        helper = work / "sandpod-jail-exec"
        native = ROOT / "services/execd/native"
        # the helper is jail_exec.c plus root_ops.c (its --root-ops mode), as the Makefile builds it
        helper_src = (native / "jail_exec.c", native / "root_ops.c")
        for out, srcs in ((work / "harness", (work / "harness.c",)), (helper, helper_src)):
            argv = [cc, "-O2", "-static", f"-I{work}", "-o", str(out), *map(str, srcs)]
            subprocess.run(argv, check=True)
        res = subprocess.run(
            [str(work / "harness"), str(args.rounds), str(args.calls), str(helper)],
            check=True,
            capture_output=True,
            text=True,
        )
    load: dict[str, list[float]] = {}
    getppid: dict[str, list[float]] = {}
    pers: dict[str, list[float]] = {}
    for line in res.stdout.splitlines():
        mode, *vals = line.split()
        load.setdefault(mode, []).append(float(vals[0]) / 1000)
        if len(vals) > 1 and float(vals[1]) > 0:
            getppid.setdefault(mode, []).append(float(vals[1]))
            pers.setdefault(mode, []).append(float(vals[2]))
    med = statistics.median
    best = min
    n = sum(1 for line in args.header.read_text().splitlines() if line.startswith("    {"))
    print(f"header {args.header} ({n} instructions, both modes), {args.rounds} rounds")
    print(f"{'mode':10} {'load p50 us':>12} {'getppid ns':>11} {'personality ns':>15}")
    for mode in ("none", "one", "default", "nested", "uncached"):
        row = f"{med(load[mode]):12.1f} {best(getppid[mode]):11.1f} {best(pers[mode]):15.1f}"
        print(f"{mode:10} {row}")
    print(f"{'entry':10} {'p50 us':>12}")
    for mode in ("entry-unconfined", "entry-default"):
        print(f"{mode:10} {med(load[mode]):12.1f}")
    floor, d, u = best(getppid["none"]), best(getppid["default"]), best(getppid["uncached"])
    print(
        f"getppid inside/outside the default filter: {d / floor:.2f}x "
        f"(cached when ~1.0; uncached {u / floor:.2f}x)"
    )
    for name, prog in programs(args.header.read_text()).items():
        allowed = [nr for nr in range(512) if const_allow(prog, nr)]
        rest = ranges(set(range(512)) - set(allowed))
        print(f"{name}: {len(allowed)} of 0..511 cached as allowed; not: {rest}")
    entry = med(load["entry-default"]) - med(load["entry-unconfined"])
    print(
        f"load default - one-instruction floor: {med(load['default']) - med(load['one']):.1f} us; "
        f"entry default - unconfined: {entry:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
