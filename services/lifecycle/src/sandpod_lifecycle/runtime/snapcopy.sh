#!/bin/sh
# Copy a sandbox's files out of it for a snapshot (see snapdiff.py), run by the host's sh as
#   sh -c <this file> sandpod-snapcopy <scratch> <src> <dst> [<path>...]
# in a private mount namespace (unshare -m --propagation private): with no paths, all of <src>;
# else those paths below <src> with their parent directories (cp --parents).
# The copy runs chrooted into <scratch>, an empty tmpfs holding only <src> (read-only), <dst>
# and the host's /usr and /lib* (read-only, for cp itself): the sandbox can change its tree
# while it is copied (its file API works while it is frozen), and a directory swapped for a
# symlink mid-copy then resolves inside this root -- never to the host's /etc or /root.
set -eu
scratch=$1 src=$2 dst=$3
shift 3
mount -t tmpfs -o mode=0755,size=1m sandpod-snapcopy "$scratch"
mkdir "$scratch/src" "$scratch/dst"
mount --bind "$src" "$scratch/src"
mount -o remount,bind,ro "$scratch/src"
mount --bind "$dst" "$scratch/dst"
for d in /usr /lib /lib64 /lib32 /libx32 /bin; do
  if [ -L "$d" ]; then
    ln -s "$(readlink "$d")" "$scratch$d"
  elif [ -d "$d" ]; then
    mkdir "$scratch$d"
    mount --bind "$d" "$scratch$d"
    mount -o remount,bind,ro "$scratch$d"
  fi
done
if [ "$#" -eq 0 ]; then
  exec chroot "$scratch" /bin/sh -c 'cd /src && exec cp -a -- . /dst'
fi
exec chroot "$scratch" /bin/sh -c 'cd /src && exec cp -a --parents -- "$@" /dst/' sandpod-cp "$@"
