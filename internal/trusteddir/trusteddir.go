// Package trusteddir checks that a directory pleg-nri keeps its sockets or its state in is its own: a
// directory that someone else could change would let them replace a socket (and take the kubelet's
// calls) or a file pleg-nri writes (and have it write elsewhere).
package trusteddir

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// Check returns an error naming dir and what is wrong unless dir is a directory itself (not a symbolic
// link to one), owned by root or by this process's user, and writable by its owner only (0750, 0700,
// 0755, ..., not 0770 or 0777).
func Check(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	return check(dir, fi, os.Geteuid())
}

func check(dir string, fi fs.FileInfo, euid int) error {
	switch {
	case fi.Mode().Type()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link: refusing it (give the directory's own path)", dir)
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != euid {
		return fmt.Errorf("%s is owned by uid %d, not by root or by pleg-nri's user (uid %d): refusing it", dir, st.Uid, euid)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("%s is writable by its group or by others (mode %04o): refusing it (make it 0750 or tighter)", dir, perm)
	}
	return nil
}
