package pleg

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
)

// maxCheckpointSize bounds what is read: 100k containers with large statuses stay far below it.
const maxCheckpointSize = 256 << 20

func readCheckpointFile(path string) ([]byte, error) {
	// Not through a symbolic link: the checkpoint is pleg-nri's own file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
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

// removeCheckpointTemps removes the temporary files of checkpoint writes that a crash interrupted
// (atomicfile's, beside path).
func removeCheckpointTemps(path string) ([]string, error) {
	return atomicfile.RemoveTemps(path)
}

// writeCheckpointFile replaces the checkpoint at path with data durably (0600).
func writeCheckpointFile(path string, data []byte) error {
	return atomicfile.WriteFile(path, data, 0o600)
}
