package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// FileLines counts the lines of the file at path: Options.LogLines of a runtime that logs to a file
// (`pleg-nri conformance --runtime-log`).
func FileLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	buf := make([]byte, 64<<10)
	for {
		k, err := f.Read(buf)
		n += bytes.Count(buf[:k], []byte("\n"))
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("failed to read %s: %w", path, err)
		}
	}
}
