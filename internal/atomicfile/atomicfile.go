// Package atomicfile replaces files so that a crash at any point leaves either the old content or the
// new one, never a mix or nothing.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// tempPrefix is the name of WriteFile's temporary files for path, before os.CreateTemp's random part.
func tempPrefix(path string) string {
	return "." + filepath.Base(path) + ".tmp-"
}

// WriteFile replaces path with data durably: a temporary file beside it, written and synced, renamed
// over path, then the directory synced. The file keeps the mode of the one it replaces; a new one gets
// perm. On failure path is as it was and the temporary file is gone.
func WriteFile(path string, data []byte, perm os.FileMode) (err error) {
	if fi, err := os.Stat(path); err == nil {
		perm = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), tempPrefix(path))
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

// RemoveTemps removes the temporary files that WriteFile calls on path left when the process ended
// before their rename (a crash, a kill), and returns their names. Call it only while no WriteFile on
// path runs (the caller owns path: a lock, its startup). Removing none is no error.
func RemoveTemps(path string) (removed []string, err error) {
	dir, prefix := filepath.Dir(path), tempPrefix(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
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
