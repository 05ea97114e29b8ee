package pleg

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// maxCheckpointSize bounds what is read: 100k containers with large statuses stay far below it.
const maxCheckpointSize = 256 << 20

func readCheckpointFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCheckpointSize+1))
	if err != nil {
		return nil, fmt.Errorf("failed to read checkpoint %s: %w", path, err)
	}
	if len(data) > maxCheckpointSize {
		return nil, fmt.Errorf("checkpoint %s is larger than the %d bytes allowed", path, maxCheckpointSize)
	}
	return data, nil
}

// writeFileAtomic replaces path with data durably: a temporary file beside it, fsync, rename, fsync of
// the directory. A crash at any point leaves either the old file or the new one, never a mix.
func writeFileAtomic(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
