#!/bin/busybox sh
# /init of the NVMe/TCP test VM (built into the initramfs by
# hack/nvme-vm.sh; booted by e2e/vm). Loads the modules, mounts the host's
# root read-only over 9p at /host and the writable results directory at the
# same path inside it, then runs $RESULTS/run.sh chrooted into the host's
# root and writes its exit status to $RESULTS/exit-status. Kernel
# command-line words it reads:
#   rdsvm.results=<host path>   the results directory (required)
#   <module>.<param>=<value>    passed to insmod of <module> (insmod, unlike
#                               modprobe, does not read /proc/cmdline)
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "rdsvm: $*" >/dev/console; }
halt() { sync; poweroff -f; sleep 5; }

results=
for w in $(cat /proc/cmdline); do
  case "$w" in rdsvm.results=*) results=${w#rdsvm.results=} ;; esac
done
[ -n "$results" ] || { say "no rdsvm.results= on the kernel command line"; halt; }

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
mount -t 9p -o trans=virtio,version=9p2000.L,rw,msize=262144 results "/host$results" || { say "mounting $results failed"; halt; }
for m in "proc proc /host/proc" "sysfs sysfs /host/sys" "configfs none /host/sys/kernel/config" \
  "devtmpfs devtmpfs /host/dev" "devpts devpts /host/dev/pts" "tmpfs tmpfs /host/dev/shm" \
  "tmpfs tmpfs /host/tmp" "tmpfs tmpfs /host/run"; do
  set -- $m
  mkdir -p "$3" 2>/dev/null
  mount -t "$1" "$2" "$3" || say "mounting $1 at $3 failed"
done
chmod 1777 /host/tmp
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
