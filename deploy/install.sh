#!/bin/sh
# Installs pleg-nri's host files under a root directory, or removes them. No service is started and no
# kubelet setting is changed: node.sh (the Helm chart's DaemonSet) and docs/operations.md do that.
#
#   install.sh [--root DIR] [--mode systemd|nri] [--binary FILE] [--config FILE] [--uninstall]
#
#   --root DIR     the file system root to install under (default /; make install PREFIX=DIR)
#   --mode systemd the host service: DIR/usr/local/bin/pleg-nri, DIR/etc/systemd/system/pleg-nri.service,
#                  DIR/etc/systemd/system/kubelet.service.d/10-pleg-nri.conf, DIR/etc/pleg-nri/config.yaml
#   --mode nri     pre-registered with containerd: DIR/opt/nri/plugins/10-pleg-nri and
#                  DIR/etc/nri/conf.d/10-pleg-nri.conf
#   --binary FILE  the pleg-nri binary (default: the one next to this script's files, else on PATH)
#   --config FILE  the configuration to install; without it an existing one is kept, and a new install
#                  gets the defaults (systemd: nri.conf.example; nri: nri/10-pleg-nri.conf)
#   --uninstall    remove what this mode installs (the configuration and the state directory stay)
#
# Files are replaced atomically (written next to the target, then renamed), so a running pleg-nri is
# never overwritten in place and an interrupted install leaves the old version whole.
set -eu

root=/
mode=systemd
binary=
config=
uninstall=false
src=$(cd "$(dirname "$0")" && pwd)

die() { echo "install.sh: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
	case $1 in
	--root) root=$2; shift 2 ;;
	--mode) mode=$2; shift 2 ;;
	--binary) binary=$2; shift 2 ;;
	--config) config=$2; shift 2 ;;
	--uninstall) uninstall=true; shift ;;
	*) die "unknown argument $1" ;;
	esac
done
case $mode in systemd | nri) ;; *) die "--mode: want systemd or nri, got $mode" ;; esac
root=${root%/}

# The data files: in the repository (deploy/, nri.conf.example) or in the image (/opt/pleg-nri).
if [ -f "$src/config.yaml" ]; then default_config=$src/config.yaml; else default_config=$src/../nri.conf.example; fi
if [ -z "$binary" ]; then
	for b in "$src/../bin/pleg-nri" /usr/local/bin/pleg-nri; do
		if [ -x "$b" ]; then binary=$b; break; fi
	done
fi

# put SRC DST MODE: install SRC as DST atomically.
put() {
	mkdir -p "$(dirname "$2")"
	cp "$1" "$2.pleg-nri-new"
	chmod "$3" "$2.pleg-nri-new"
	mv -f "$2.pleg-nri-new" "$2"
	echo "installed $2"
}
# put_config SRC DST: install a configuration unless one is there and no --config was given.
put_config() {
	if [ -n "$config" ]; then
		put "$config" "$2" 0644
	elif [ -e "$2" ]; then
		echo "kept $2"
	else
		put "$1" "$2" 0644
	fi
}
remove() {
	for f in "$@"; do
		if [ -e "$f" ]; then rm -f "$f" && echo "removed $f"; fi
	done
}

if [ "$mode" = systemd ]; then
	bin=$root/usr/local/bin/pleg-nri
	unit=$root/etc/systemd/system/pleg-nri.service
	dropin=$root/etc/systemd/system/kubelet.service.d/10-pleg-nri.conf
	if $uninstall; then
		remove "$dropin" "$unit" "$bin"
		exit 0
	fi
	[ -n "$binary" ] && [ -x "$binary" ] || die "no pleg-nri binary (give --binary FILE)"
	put "$binary" "$bin" 0755
	put "$src/systemd/pleg-nri.service" "$unit" 0644
	put "$src/systemd/kubelet.service.d/10-pleg-nri.conf" "$dropin" 0644
	put_config "$default_config" "$root/etc/pleg-nri/config.yaml"
else
	bin=$root/opt/nri/plugins/10-pleg-nri
	conf=$root/etc/nri/conf.d/10-pleg-nri.conf
	if $uninstall; then
		remove "$bin" "$conf"
		exit 0
	fi
	[ -n "$binary" ] && [ -x "$binary" ] || die "no pleg-nri binary (give --binary FILE)"
	put "$binary" "$bin" 0755
	put_config "$src/nri/10-pleg-nri.conf" "$conf"
fi
