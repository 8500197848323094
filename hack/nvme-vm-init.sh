#!/bin/busybox sh
# /init of the NVMe/TCP test VM (built into the initramfs by
# hack/nvme-vm.sh; booted by e2e/vm). Loads the modules, mounts the host's
# root read-only over 9p at /host, the guest's own tmpfs on its /tmp and
# /run, the writable results share (9p tag "results") at /run/rdsvm/results
# inside it and the host directories under /tmp listed in its tmp-binds,
# then runs run.sh from there chrooted into the host's root and writes its
# exit status next to it.
# Kernel command-line words it reads:
#   rdsvm.probe=1               print the init line and power off at once
#                               (e2e/vm's KVM probe)
#   <module>.<param>=<value>    passed to insmod of <module> (insmod, unlike
#                               modprobe, does not read /proc/cmdline)
# Host paths never travel on the command line: the results share has a
# fixed guest path, so a host path with spaces or commas needs no quoting.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "rdsvm: $*" >/dev/console; }
halt() { sync; poweroff -f; sleep 5; }

# e2e/vm waits for this line: it proves the kernel runs (under a nested KVM
# that cannot run this guest, the firmware and the kernel's real-mode setup
# still print, then nothing).
say "init reached"
case " $(cat /proc/cmdline) " in *" rdsvm.probe=1 "*) halt ;; esac

for m in $(cat /lib/modules/order); do
  params=
  for w in $(cat /proc/cmdline); do
    case "$w" in
      "$m".*=* | "$(echo "$m" | tr _ -)".*=*) params="$params ${w#*.}" ;;
    esac
  done
  # shellcheck disable=SC2086
  insmod "/lib/modules/$m.ko" $params 2>/dev/null || say "insmod $m failed"
done

mount -t configfs none /sys/kernel/config
ip link set lo up
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose host /host || { say "mounting the host root failed"; halt; }
# The host's /tmp, kept in view before the guest's tmpfs covers it.
mkdir -p /hosttmp
mount -o bind /host/tmp /hosttmp || say "cannot keep the host's /tmp in view"
for m in "proc proc /host/proc" "sysfs sysfs /host/sys" "configfs none /host/sys/kernel/config" \
  "devtmpfs devtmpfs /host/dev" "devpts devpts /host/dev/pts" "tmpfs tmpfs /host/dev/shm" \
  "tmpfs tmpfs /host/tmp" "tmpfs tmpfs /host/run"; do
  set -- $m
  mkdir -p "$3" 2>/dev/null
  mount -t "$1" "$2" "$3" || say "mounting $1 at $3 failed"
done
chmod 1777 /host/tmp
# The results share at a fixed path in the guest's own /run (e2e/vm's
# GuestResults): no tmpfs covers it, whatever its host path.
results=/run/rdsvm/results
mkdir -p "/host$results"
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 results "/host$results" || { say "mounting the results share failed"; halt; }
# The host directories under /tmp the command needs (e2e/vm Config.HostDirs:
# a checkout or cache under /tmp), read-only at their own paths over the
# guest's tmpfs; one per line, relative to /tmp, so spaces need no quoting.
# The rest of the guest's /tmp stays a plain tmpfs (nvmet backing files).
if [ -f "/host$results/tmp-binds" ]; then
  while IFS= read -r rel; do
    [ -n "$rel" ] || continue
    { mkdir -p "/host/tmp/$rel" && mount -o bind "/hosttmp/$rel" "/host/tmp/$rel"; } ||
      say "cannot show the host's /tmp/$rel in the guest"
  done <"/host$results/tmp-binds"
fi
# A writable /etc (e.g. /etc/nvme for the host NQN) over the host's.
mkdir -p /overlay
mount -t tmpfs tmpfs /overlay
mkdir -p /overlay/upper /overlay/work
mount -t overlay overlay -o lowerdir=/host/etc,upperdir=/overlay/upper,workdir=/overlay/work /host/etc || say "no writable /etc"
say "ready"

chroot /host /bin/sh "$results/run.sh" </dev/console >/dev/console 2>&1
echo $? >"/host$results/exit-status"
sync
umount "/host$results"
halt
