package front

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/log"

	"github.com/pleg-nri/pleg-nri/eventbridge/kubelet"
	"github.com/pleg-nri/pleg-nri/internal/dial"
)

// handOff sends the listening sockets to a successor and waits until it serves on them. On success the
// socket files are left in place when this front closes its listeners.
func (f *front) handOff(ctx context.Context, c *net.UnixConn, info []byte) error {
	lf, err := kubelet.ListenerFile(f.lis)
	if err != nil {
		return err
	}
	defer lf.Close()
	cf, err := kubelet.ListenerFile(f.ctl)
	if err != nil {
		return err
	}
	defer cf.Close()
	if err := kubelet.SendFiles(c, info, lf, cf); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(startTimeout))
	ack, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(ack) != "serving" {
		return fmt.Errorf("the successor did not confirm it serves (%q): %w", ack, err)
	}
	kubelet.KeepSocketFile(f.lis)
	kubelet.KeepSocketFile(f.ctl)
	log.G(ctx).Info("sockets handed over to the successor: ending this front's streams and stopping")
	return nil
}

// takeOver asks the front running in cfg.RunDir for its sockets. The returned connection stays open
// until this front serves: it then writes "serving" on it.
func takeOver(ctx context.Context, cfg Config) (lis, ctl net.Listener, conn *net.UnixConn, err error) {
	conn, err = dialControl(filepath.Join(cfg.RunDir, ControlSocketName))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	if _, err := conn.Write([]byte(`{"op":"handoff"}` + "\n")); err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(controlTimeout))
	msg, files, err := kubelet.ReceiveFiles(conn, 4096, 2)
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	_ = conn.SetReadDeadline(time.Time{})
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	var old Info
	if err := json.Unmarshal(msg, &old); err != nil || len(files) != 2 {
		closeAll()
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: bad answer from the running front (%d sockets): %q", len(files), msg)
	}
	if old.Listen != cfg.Listen {
		closeAll()
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: the running front serves %s, not %s", old.Listen, cfg.Listen)
	}
	defer closeAll()
	// The paths are this front's configuration's (the same as the running front's, checked above).
	_, lisPath, err := dial.ParseEndpoint(cfg.Listen)
	if err != nil {
		conn.Close()
		return nil, nil, nil, fmt.Errorf("takeover: %w", err)
	}
	if lis, err = kubelet.FileListener(ctx, files[0], lisPath); err != nil {
		conn.Close()
		return nil, nil, nil, err
	}
	if ctl, err = kubelet.FileListener(ctx, files[1], filepath.Join(cfg.RunDir, ControlSocketName)); err != nil {
		kubelet.KeepSocketFile(lis) // the previous front serves on
		_ = lis.Close()
		conn.Close()
		return nil, nil, nil, err
	}
	log.G(ctx).WithField("previous", old.PID).WithField("previous-version", old.Version).Info("took the sockets over from the running front")
	return lis, ctl, conn, nil
}
