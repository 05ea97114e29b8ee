package frontrev

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestRevisionIsCurrent: the committed eventbridge/front/revision.go is the one the front's sources
// give. It fails after any change to the front's code until `go run ./hack/front-revision` (part of
// make generate) is run: a core then replaces the fronts of the older code.
func TestRevisionIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..")
	rev, err := Compute(root)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, RevisionFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, Source(rev)) {
		t.Errorf("%s is not current (the front's sources give revision %s): run go run ./hack/front-revision", RevisionFile, rev)
	}
}

// TestRevisionIsDeterministic: two computations over the same tree give the same 16 hex digits (a
// digest that depended on map order or on go list's would replace fronts for nothing).
func TestRevisionIsDeterministic(t *testing.T) {
	base, err := Compute(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if len(base) != 16 {
		t.Fatalf("revision %q, want 16 hex digits", base)
	}
	again, err := Compute(filepath.Join("..", ".."))
	if err != nil || again != base {
		t.Fatalf("a second computation gave %q (%v), want %q", again, err, base)
	}
}
