// Package atomicfile replaces files so that a crash at any point leaves either the old content or the
// new one, never a mix or nothing.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces path with data durably: a temporary file beside it, written and synced, renamed
// over path, then the directory synced. The file keeps the mode of the one it replaces; a new one gets
// perm. On failure path is as it was and the temporary file is gone.
func WriteFile(path string, data []byte, perm os.FileMode) (err error) {
	if fi, err := os.Stat(path); err == nil {
		perm = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("failed to sync the directory of %s: %w", path, err)
	}
	return nil
}

// syncDir makes the entries of dir durable (a rename in it).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
