#!/bin/sh
# The holder of a sandbox (see holder.py for the whole chain): pid 1 of its namespaces, run by
# the host's sh as
#   sh -c <this file> sandpod-holder lower upper work root workspace name tmp_bytes uid gid \
#     rootless helper seccomp shm_bytes tmp_in_upper overlay_options ws_lower ws_work \
#     nvolumes [volume_source mount_path ro|rw]... <masked path>...
# lower is overlayfs' lowerdir: one base directory, or an image's layers (top first, ":"-joined).
# It prints "pid <host pid>" on stdout, builds the sandbox's root with host tools, pivots into
# it and waits forever, after printing "ready <host pid> [skipped dir]..." on stdout. Every value is a positional argument,
# never spliced into shell text; any error (set -eu) ends it, with the reason on stderr.
set -eu
base=$1 upper=$2 work=$3 root=$4 ws=$5 name=$6 tmpsize=$7 uid=$8 gid=$9
rootless=${10} helper=${11} seccomp=${12} shmsize=${13} tmp_in_upper=${14} ovlopts=${15}
ws_lower=${16} ws_work=${17}
shift 17
# Our host pid (this /proc is still the host's), said at once: the driver gives the network
# namespace its link while the root is built (nothing but this script runs in it until ready).
read -r hostpid _ < /proc/self/stat
echo "pid $hostpid"
skipped=
# As root with the helper, the mounts, directories and links below are made by the helper
# (sandpod-jail-exec --root-ops: the same steps as system calls), batched: one process instead
# of one per step, most of a create's cost otherwise. Without it, or rootless, the host's tools.
fast=
if [ "$rootless" = 0 ] && [ -n "$helper" ]; then fast=y; fi
ovldata="${ovlopts:+$ovlopts,}lowerdir=$base,upperdir=$upper,workdir=$work"
if [ -n "$fast" ]; then
  if [ "$1" != 0 ]; then  # volumes go on the root before the rest: mount it now
    "$helper" --root-ops mount overlay overlay "$root" nosuid,nodev "$ovldata" 2>/dev/null ||
      { echo "cannot mount the overlay root over $base" >&2; exit 1; }
  fi
elif ! mount -t overlay overlay -o "nosuid,nodev,$ovldata" "$root" 2>/dev/null; then
  [ "$rootless" = 1 ] || { echo "cannot mount the overlay root over $base" >&2; exit 1; }
  case "$base" in  # an image's layers have no mounts below them: no fallback can help
    *:*) echo "cannot mount the image's layers as the overlay root ($base)" >&2; exit 1 ;;
  esac
  # Rootless, a base with mounts below it (the host root) cannot be one overlay's lower layer:
  # layer each top-level directory of it on its own (upper/<name>), in a tmpfs root.
  mount -t tmpfs -o "nosuid,nodev,mode=0755,size=$tmpsize" sandpod-root "$root"
  # A glob, never ls: a name with a space or a newline stays one name. Each name the overlay
  # options cannot carry (only [A-Za-z0-9._-] pass) is left out and reported, its other
  # characters as "?" (the ready line is space-separated, one line).
  b=${base%/}
  for p in "$b"/* "$b"/.[!.]* "$b"/..?*; do
    [ -e "$p" ] || [ -L "$p" ] || continue  # a pattern that matched nothing
    e=${p##*/}
    case "$e" in
      proc|sys|dev|tmp|run) mkdir -p "$root/$e"; continue ;;
      lost+found) continue ;;
      *[!A-Za-z0-9._-]*)
        skipped="$skipped /$(printf '%s' "$e" | tr -c 'A-Za-z0-9._-' '?')"
        continue ;;
    esac
    if [ -L "$p" ]; then
      ln -s -- "$(readlink "$p")" "$root/$e"  # --: a target may start with a dash
    elif [ -d "$p" ]; then
      mkdir -p "$root/$e" "$upper/$e" "$work/layers/$e"
      mount -t overlay overlay \
        -o "nosuid,nodev,lowerdir=$p,upperdir=$upper/$e,workdir=$work/layers/$e" \
        "$root/$e" 2>/dev/null || skipped="$skipped /$e"
    elif [ -f "$p" ]; then
      : > "$root/$e"
      mount --bind "$p" "$root/$e"
      mount -o remount,bind,ro,nosuid,nodev "$root/$e"
    fi
  done
fi
# SandboxVolumes: "$1" triples (host source, mount path, ro|rw) after their count, before the
# masked paths (the driver refuses a mount path under one). Each component of a mount path is
# made in the new root without following a symlink of the base (an image could point one at a
# host directory: we still see the host here); nothing runs in the sandbox yet, so nothing can
# swap one in between the check and the mount.
nvol=$1 nvolumes=$1
shift
while [ "$nvol" -gt 0 ]; do
  src=$1 dst=$2 mode=$3
  shift 3
  nvol=$((nvol - 1))
  cur=$root
  set -f
  IFS=/
  for c in $dst; do
    [ -n "$c" ] || continue
    cur=$cur/$c
    if [ -L "$cur" ]; then
      echo "volume mount path $dst crosses a symlink of the base (/${cur#"$root"/})" >&2
      exit 1
    fi
    [ -d "$cur" ] || mkdir "$cur"
  done
  unset IFS
  set +f
  mount --bind "$src" "$cur"
  if [ "$mode" = ro ]; then
    mount -o remount,bind,ro,nosuid,nodev "$cur"
  else
    mount -o remount,bind,nosuid,nodev "$cur"
  fi
done
if [ -n "$fast" ]; then
  # "$@" (the masked paths) becomes the batch of steps: each path is shifted off as its own
  # step is appended (the loop's list was expanded before). A mask step checks that its path
  # is a directory when it runs: the root may be mounted by the same batch.
  for m in "$@"; do
    shift
    set -- "$@" mask "$root$m"
  done
  if [ "$nvolumes" = 0 ]; then
    set -- mount overlay overlay "$root" nosuid,nodev "$ovldata" "$@"
  fi
  for d in proc tmp run dev workspace; do set -- "$@" mkdir "$root/$d"; done
  set -- "$@" mount proc proc "$root/proc" nosuid,nodev,noexec ""
  if [ "$tmp_in_upper" = 0 ]; then
    set -- "$@" mount tmpfs sandpod-tmp "$root/tmp" nosuid,nodev "mode=1777,size=$tmpsize"
  fi
  set -- "$@" mount tmpfs sandpod-run "$root/run" nosuid,nodev,noexec mode=0755,size=1m
  if [ -n "$ws_lower" ]; then
    set -- "$@" mount overlay overlay "$root/workspace" nosuid,nodev \
      "${ovlopts:+$ovlopts,}lowerdir=$ws_lower,upperdir=$ws,workdir=$ws_work"
  else
    set -- "$@" mount "" "$ws" "$root/workspace" bind "" \
      mount "" "" "$root/workspace" remount,bind,nosuid,nodev ""
  fi
  set -- "$@" mount tmpfs sandpod-dev "$root/dev" nosuid,nodev,noexec mode=0755,size=64k
  for d in null zero full random urandom tty; do
    set -- "$@" bindfile "/dev/$d" "$root/dev/$d"
  done
  set -- "$@" mkdir "$root/dev/pts" mkdir "$root/dev/shm" \
    mount devpts devpts "$root/dev/pts" nosuid,noexec newinstance,ptmxmode=0666,mode=0620 \
    mount tmpfs sandpod-shm "$root/dev/shm" nosuid,nodev "mode=1777,size=$shmsize" \
    symlink pts/ptmx "$root/dev/ptmx" symlink /proc/self/fd "$root/dev/fd" \
    symlink /proc/self/fd/0 "$root/dev/stdin" symlink /proc/self/fd/1 "$root/dev/stdout" \
    symlink /proc/self/fd/2 "$root/dev/stderr" lo-up
  "$helper" --root-ops "$@"
else
  for m in "$@"; do
    if [ -d "$root$m" ]; then
      mount -t tmpfs -o ro,nosuid,nodev,noexec,size=4k,mode=0755 sandpod-masked "$root$m"
    fi
  done
  mkdir -p "$root/proc" "$root/tmp" "$root/run" "$root/dev" "$root/workspace"
  mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
  if [ "$tmp_in_upper" = 0 ]; then  # else /tmp is the upper layer's (on the disk quota)
    mount -t tmpfs -o "nosuid,nodev,mode=1777,size=$tmpsize" sandpod-tmp "$root/tmp"
  fi
  mount -t tmpfs -o nosuid,nodev,noexec,mode=0755,size=1m sandpod-run "$root/run"
  if [ -n "$ws_lower" ]; then  # a restored workspace: the snapshot's layers under its own
    mount -t overlay overlay \
      -o "nosuid,nodev,${ovlopts:+$ovlopts,}lowerdir=$ws_lower,upperdir=$ws,workdir=$ws_work" \
      "$root/workspace"
  else
    mount --bind "$ws" "$root/workspace"
    mount -o remount,bind,nosuid,nodev "$root/workspace"
  fi
  # nodev: a device node that appears here (the sandbox cannot mknod; root could) opens as
  # nothing; each node bound below keeps the flags of the host's /dev mount, so it still works.
  mount -t tmpfs -o nosuid,nodev,noexec,mode=0755,size=64k sandpod-dev "$root/dev"
  for d in null zero full random urandom tty; do
    : > "$root/dev/$d"
    mount --bind "/dev/$d" "$root/dev/$d"
  done
  mkdir "$root/dev/pts" "$root/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,nosuid,noexec devpts "$root/dev/pts"
  mount -t tmpfs -o "nosuid,nodev,mode=1777,size=$shmsize" sandpod-shm "$root/dev/shm"
  ln -s pts/ptmx "$root/dev/ptmx"
  ln -s /proc/self/fd "$root/dev/fd"
  ln -s /proc/self/fd/0 "$root/dev/stdin"
  ln -s /proc/self/fd/1 "$root/dev/stdout"
  ln -s /proc/self/fd/2 "$root/dev/stderr"
fi
# Add a line to a file of the base. Rootless, the base's files belong to a uid unmapped in our
# user namespace (no copy-up allowed): a copy in the sandbox's /run is bound over the file.
add_line() {
  if [ "$rootless" = 1 ]; then
    copy="$root/run/sandpod$(echo "$1" | tr / -)"
    { cat "$root$1"; echo "$2"; } > "$copy"
    mount --bind "$copy" "$root$1"
  else
    echo "$2" >> "$root$1"
  fi
}
# Whether file $1 has a line whose third field is $2 (a uid or gid): the shell's read, no grep.
has_id() {
  while IFS=: read -r _ _ id _ || [ -n "${id:-}" ]; do
    [ "$id" != "$2" ] || return 0
    id=
  done < "$1"
  return 1
}
if [ -f "$root/etc/passwd" ] && ! has_id "$root/etc/passwd" "$uid"; then
  add_line /etc/passwd "sandbox:x:$uid:$gid:sandpod sandbox:/workspace:/bin/sh"
fi
if [ -f "$root/etc/group" ] && ! has_id "$root/etc/group" "$gid"; then
  add_line /etc/group "sandbox:x:$gid:"
fi
if [ -f "$root/etc/hosts" ]; then
  add_line /etc/hosts "127.0.1.1 $name"
fi
if [ "$rootless" = 1 ]; then hostname "$name"; else echo "$name" > /proc/sys/kernel/hostname; fi
[ -n "$fast" ] || ip link set lo up  # the helper's batch brought it up
# SysV shared memory outlives its processes too: bound it like /dev/shm (this ipc namespace's).
# Rootless, a kernel that keeps ipc sysctls from the user namespace's root leaves them as they are.
{ echo "$shmsize" > /proc/sys/kernel/shmmax && echo $((shmsize / 4096)) > /proc/sys/kernel/shmall
} 2>/dev/null || [ "$rootless" = 1 ]
for tool in sh sleep umount; do
  found=
  IFS=:
  for d in $PATH; do [ -x "$root$d/$tool" ] && found=y; done
  unset IFS
  if [ -z "$found" ]; then
    echo "the sandbox's base has no $tool command (in $PATH)" >&2
    exit 1
  fi
done
# Rootless, util-linux's umount (run below as a non-zero uid: its "user umount" mode) fails
# with ENOENT without an /etc/fstab. Images often lack one; their layers are ours, so an empty
# one goes in the writable layer. A base of unmapped owners without one still fails there.
if [ "$rootless" = 1 ] && [ ! -e "$root/etc/fstab" ]; then
  { mkdir -p "$root/etc" && : > "$root/etc/fstab"; } 2>/dev/null || true
fi
# The seccomp helper (a static binary) is opened now and executed after pivot_root through
# its descriptor: it loads the filter and becomes the waiting shell, which says ready, so the
# driver reads the filter's state once ready. Without it the shell waits unfiltered.
[ -z "$helper" ] || exec 9< "$helper"
cd "$root"
if [ -n "$fast" ]; then
  "$helper" --root-ops pivot .
else
  pivot_root . .
  umount -l .
fi
cd /
# shellcheck disable=SC2016 # the waiting shell expands $1, not this one
hold='echo "ready $1"; exec </dev/null >/dev/null 2>&1; while :; do sleep 2147483647 & wait; done'
[ -z "$helper" ] || exec /proc/self/fd/9 --seccomp="$seccomp" --filter-only sh -c "$hold" "$0" \
  "$hostpid$skipped"
exec sh -c "$hold" "$0" "$hostpid$skipped"
