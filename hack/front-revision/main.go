// Command front-revision writes eventbridge/front/revision.go from the front's sources
// (internal/frontrev); run it from the module's root: go run ./hack/front-revision.
package main

import (
	"fmt"
	"os"

	"github.com/pleg-nri/pleg-nri/internal/frontrev"
)

func main() {
	rev, err := frontrev.Compute(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "front-revision:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(frontrev.RevisionFile, frontrev.Source(rev), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "front-revision:", err)
		os.Exit(1)
	}
	fmt.Println(rev)
}
