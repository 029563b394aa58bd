#!/bin/sh
# Run a command in `ip netns exec NS` with this host's cgroup file systems mounted again
# at /sys/fs/cgroup: `ip netns exec` mounts a fresh /sys for the namespace without them,
# and an OCI runtime (bench --env container) confines its containers with them.
#
#   ip netns exec NS docs/examples/netns-cgroups.sh hpcvm bench --nodes 2 --batch local ...
#
# The hierarchies mounted are the host's own (the same cgroups, seen from here), one per
# line of /proc/self/cgroup; the mounts live in the namespace's private mount namespace.
set -eu
if grep -q ' /sys/fs/cgroup[/ ]' /proc/self/mountinfo; then
  exec "$@"  # already there
fi
if [ "$(grep -vc '^0::' /proc/self/cgroup)" = 0 ]; then
  mount -t cgroup2 none /sys/fs/cgroup  # cgroup v2 only: the unified hierarchy
  exec "$@"
fi
mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
while IFS=: read -r id controllers _path; do
  if [ "$id" = 0 ]; then
    mkdir -p /sys/fs/cgroup/unified
    mount -t cgroup2 none /sys/fs/cgroup/unified
  else
    dir=/sys/fs/cgroup/${controllers#name=}
    options=$controllers
    case $controllers in name=*) options=none,$controllers ;; esac
    mkdir -p "$dir"
    mount -t cgroup -o "$options" cgroup "$dir"
  fi
done < /proc/self/cgroup
exec "$@"
