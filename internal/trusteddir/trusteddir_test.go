package trusteddir

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeInfo is a directory entry of a given mode and owner.
type fakeInfo struct {
	mode fs.FileMode
	uid  uint32
}

func (f fakeInfo) Name() string       { return "d" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return &syscall.Stat_t{Uid: f.uid} }

// TestCheck: a directory of root's or the process's user, writable by its owner only, passes; a link,
// a file, another user's directory and one its group or others may write to are refused, with the
// path and the reason.
func TestCheck(t *testing.T) {
	const euid = 1000
	for _, tc := range []struct {
		name string
		fi   fakeInfo
		want string // "" passes
	}{
		{"root 0750", fakeInfo{fs.ModeDir | 0o750, 0}, ""},
		{"root 0700", fakeInfo{fs.ModeDir | 0o700, 0}, ""},
		{"root 0755", fakeInfo{fs.ModeDir | 0o755, 0}, ""},
		{"owner 0700", fakeInfo{fs.ModeDir | 0o700, euid}, ""},
		{"symlink", fakeInfo{fs.ModeSymlink | 0o777, 0}, "is a symbolic link"},
		{"file", fakeInfo{0o600, 0}, "is not a directory"},
		{"another user", fakeInfo{fs.ModeDir | 0o700, 65534}, "owned by uid 65534"},
		{"group-writable", fakeInfo{fs.ModeDir | 0o770, 0}, "mode 0770"},
		{"world-writable", fakeInfo{fs.ModeDir | 0o757, 0}, "mode 0757"},
		{"sticky 1777", fakeInfo{fs.ModeDir | fs.ModeSticky | 0o777, 0}, "writable by its group or by others"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := check("/x/d", tc.fi, euid)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "/x/d")):
				t.Errorf("error %v, want one naming /x/d and saying %q", err, tc.want)
			}
		})
	}
}

// TestCheckReal: Check looks at the directory itself, not at what a link names.
func TestCheckReal(t *testing.T) {
	dir := t.TempDir()
	if err := Check(dir); err != nil {
		t.Errorf("a fresh private directory: %v", err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := Check(link); err == nil {
		t.Error("a link to a good directory passed")
	}
	if err := Check(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing directory passed")
	}
}
