package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteFile: a new file gets perm, a replaced one keeps its mode, and nothing else is left in the
// directory; a write that fails (its directory is gone) leaves nothing.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(want string, mode os.FileMode) {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil || string(got) != want {
			t.Fatalf("content %q (%v), want %q", got, err, want)
		}
		fi, _ := os.Stat(path)
		if fi.Mode().Perm() != mode {
			t.Errorf("mode %s, want %s", fi.Mode().Perm(), mode)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Errorf("directory holds %d entries, want only the file", len(entries))
		}
	}
	check("one", 0o600)
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	check("two", 0o640)
	if err := WriteFile(filepath.Join(dir, "gone", "f"), []byte("x"), 0o600); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
	check("two", 0o640)
}

// TestWriteFileRenameFails: a path that names a directory is not replaced, and no temporary file is
// left beside it.
func TestWriteFileRenameFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d")
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "inside"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("x"), 0o600); err == nil {
		t.Fatal("WriteFile over a directory: no error")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || !entries[0].IsDir() {
		t.Errorf("left in the directory: %v", entries)
	}
}

func TestSyncDir(t *testing.T) {
	if err := syncDir(t.TempDir()); err != nil {
		t.Errorf("syncDir of a directory: %v", err)
	}
	if err := syncDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("syncDir of a missing directory: no error")
	}
}

// TestRemoveTemps: the temporary files of writes to path that never reached their rename are removed,
// those of another path and other files are not; a missing directory is no error.
func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A crash between WriteFile's CreateTemp and its rename leaves this.
	tmp, err := os.CreateTemp(dir, tempPrefix(path))
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	other, err := os.CreateTemp(dir, tempPrefix(filepath.Join(dir, "g")))
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	removed, err := RemoveTemps(path)
	if err != nil || len(removed) != 1 || removed[0] != filepath.Base(tmp.Name()) {
		t.Errorf("RemoveTemps: %v, %v; want [%s]", removed, err, filepath.Base(tmp.Name()))
	}
	for _, keep := range []string{path, other.Name()} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("%s: %v", keep, err)
		}
	}
	if _, err := os.Stat(tmp.Name()); !os.IsNotExist(err) {
		t.Errorf("%s is still there (%v)", tmp.Name(), err)
	}
	if removed, err := RemoveTemps(filepath.Join(dir, "gone", "f")); err != nil || removed != nil {
		t.Errorf("RemoveTemps in a missing directory: %v, %v", removed, err)
	}
}
