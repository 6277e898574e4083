#!/bin/sh
# The launcher of a sandbox's holder (see holder.py): run by the host's sh as
#   sh -c <this file> sandpod-launch <cgroup.procs file>... -- <unshare argv>...
# It joins the sandbox's cgroups (writing 0 moves the writer), asks the OOM killer to spare it
# (best effort: a host without CAP_SYS_RESOURCE refuses), then becomes unshare.
echo -1000 2>/dev/null > /proc/self/oom_score_adj || :
while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done
shift
exec "$@"
