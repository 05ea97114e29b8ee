package front

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingFront answers "metrics" on a control socket in dir, slowly, and counts the requests it
// serves at once.
type countingFront struct {
	requests, inFlight, maxInFlight atomic.Int32
}

func (cf *countingFront) serve(t *testing.T, dir string) {
	l, err := net.Listen("unix", filepath.Join(dir, ControlSocketName))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				cf.requests.Add(1)
				n := cf.inFlight.Add(1)
				for m := cf.maxInFlight.Load(); n > m && !cf.maxInFlight.CompareAndSwap(m, n); m = cf.maxInFlight.Load() {
				}
				time.Sleep(50 * time.Millisecond)
				cf.inFlight.Add(-1)
				_, _ = c.Write([]byte("# TYPE pleg_nri_front_test gauge\npleg_nri_front_test 1\n"))
			}()
		}
	}()
}

// TestGathererAsksOnceAtATime: concurrent scrapes make at most one request at a time to the front,
// and share its answer; a scrape that follows them asks again (an answer is never older than its
// scrape).
func TestGathererAsksOnceAtATime(t *testing.T) {
	dir := t.TempDir()
	cf := &countingFront{}
	cf.serve(t, dir)
	g := &Gatherer{RunDir: dir}
	const scrapes = 32
	var wg sync.WaitGroup
	errs := make(chan string, scrapes)
	for range scrapes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fams, err := g.Gather()
			if err != nil || len(fams) != 1 || fams[0].GetName() != "pleg_nri_front_test" {
				errs <- fmt.Sprintf("%v (%d families)", err, len(fams))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a scrape did not get the front's metric: %v", e)
	}
	if n := cf.maxInFlight.Load(); n != 1 {
		t.Errorf("the front served %d metrics requests at once, want 1", n)
	}
	if n := cf.requests.Load(); n > 2 {
		t.Errorf("%d concurrent scrapes made %d requests to the front, want them to share one or two", scrapes, n)
	}
	before := cf.requests.Load()
	if _, err := g.Gather(); err != nil {
		t.Fatal(err)
	}
	if n := cf.requests.Load(); n != before+1 {
		t.Errorf("a scrape after the others made %d requests to the front, want 1", n-before)
	}
}
