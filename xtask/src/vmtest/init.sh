#!/bin/busybox sh
# PID 1 of the vm-test initramfs (written by xtask/src/vmtest.rs). It prepares a minimal
# system, runs checks.sh (the same script the host runs), sends the results to the host as a
# tar stream over the virtio-serial port named scorch.results, and powers off. It judges
# nothing: the host reads the results. Should anything here hang, the host's timeout ends it.
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
# scorch run's HTTP server listens on 127.0.0.1.
ip link set lo up
# virtio, virtio_pci and virtio_console are modules on some kernels (6.1 cloud) and built in
# on others (6.12 cloud); the xtask lists the ones to load, dependencies first.
for module in $(cat /lib/modules/order); do
    insmod "/lib/modules/$module" || echo "vm-test: insmod $module failed"
done
mkdir -p /results
echo "vm-test: running the checks"
SCORCH=/usr/bin/scorch WORKLOADS=/workloads RESULTS=/results PORT=7071 STORE=/tmp/store \
    sh /checks.sh
dmesg >/results/dmesg.txt
# The port's device appears once virtio_console has probed: look it up by name.
port=
tries=0
while [ -z "$port" ] && [ $tries -lt 100 ]; do
    for p in /sys/class/virtio-ports/*; do
        [ "$(cat "$p/name" 2>/dev/null)" = scorch.results ] && port="/dev/${p##*/}"
    done
    [ -n "$port" ] || sleep 0.1
    tries=$((tries + 1))
done
if [ -n "$port" ]; then
    # Blocking writes to a virtio-serial port return once the host has taken the data.
    tar -cf "$port" -C /results .
    echo "vm-test: results sent"
else
    echo "vm-test: no virtio-serial port named scorch.results"
fi
poweroff -f
