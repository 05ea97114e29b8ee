package harness

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/pleg-nri/pleg-nri/internal/atomicfile"
)

// The images every test can use. None comes from a registry: they are built offline by BuildImages and
// imported into containerd's k8s.io namespace by Env.Start.
const (
	// PauseImage is containerd v2.4's default sandbox image name, tagged onto the local pause image.
	PauseImage = "registry.k8s.io/pause:3.10.2"
	// BusyboxImage is a static busybox with every applet linked in /bin and /usr/bin.
	BusyboxImage = "docker.io/library/busybox:plegit"
)

// image is one single-layer image to build.
type image struct {
	name       string
	files      []tarFile
	entrypoint []string
	cmd        []string
}

// tarFile is one entry of a layer.
type tarFile struct {
	name     string
	mode     int64
	typ      byte
	data     []byte
	linkname string
}

// fixedTime keeps layers byte-identical between builds, so their digests (and the cache key) are stable.
var fixedTime = time.Unix(0, 0).UTC()

// BuildImages builds the pause and busybox images as OCI archives under cache/images and returns their
// paths. A build is reused when its inputs have not changed.
func BuildImages(ctx context.Context, cache string) ([]string, error) {
	pause, err := buildPause(ctx, cache)
	if err != nil {
		return nil, err
	}
	bbPath, err := filepath.EvalSymlinks(filepath.Join(cache, "bin", "busybox"))
	if err != nil {
		return nil, fmt.Errorf("busybox is not installed in %s (run install-deps.sh): %w", cache, err)
	}
	busybox, err := os.ReadFile(bbPath)
	if err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(ctx, bbPath)
	if err != nil {
		return nil, err
	}

	base := []tarFile{
		dir("etc"), dir("proc"), dir("sys"), dir("dev"), dir("tmp"), dir("run"), dir("var"), dir("root"),
		file("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
		file("etc/group", 0o644, "root:x:0:\nnogroup:x:65534:\n"),
	}
	bb := append([]tarFile{}, base...)
	bb = append(bb, dir("bin"), dir("sbin"), dir("usr"), dir("usr/bin"), dir("usr/sbin"),
		tarFile{name: "bin/busybox", mode: 0o755, typ: tar.TypeReg, data: busybox})
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		bb = append(bb, tarFile{name: a, mode: 0o777, typ: tar.TypeSymlink, linkname: "/bin/busybox"})
	}

	images := []image{
		{name: PauseImage, files: append(append([]tarFile{}, base...),
			tarFile{name: "pause", mode: 0o755, typ: tar.TypeReg, data: pause}), entrypoint: []string{"/pause"}},
		{name: BusyboxImage, files: bb, cmd: []string{"sh"}},
	}
	dir := filepath.Join(cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for _, img := range images {
		archive, err := ociArchive(img)
		if err != nil {
			return nil, fmt.Errorf("failed to build image %s: %w", img.name, err)
		}
		sum := sha256.Sum256(archive)
		path := filepath.Join(dir, sanitize(img.name)+"-"+hex.EncodeToString(sum[:6])+".tar")
		if _, err := os.Stat(path); err != nil {
			if err := atomicfile.WriteFile(path, archive, 0o644); err != nil {
				return nil, err
			}
		}
		out = append(out, path)
	}
	return out, nil
}

// buildPause compiles ./pause (next to this package) as a static binary, cached by its source hash.
func buildPause(ctx context.Context, cache string) ([]byte, error) {
	_, self, _, _ := runtime.Caller(0)
	srcDir := filepath.Join(filepath.Dir(self), "..", "pause")
	src, err := os.ReadFile(filepath.Join(srcDir, "main.go"))
	if err != nil {
		return nil, fmt.Errorf("failed to read the pause source: %w", err)
	}
	sum := sha256.Sum256(append(src, runtime.Version()...))
	bin := filepath.Join(cache, "pause-"+hex.EncodeToString(sum[:6]), "pause")
	if data, err := os.ReadFile(bin); err == nil {
		return data, nil
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin+".tmp", ".")
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("failed to build pause: %w: %s", err, out)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		return nil, err
	}
	return os.ReadFile(bin)
}

// busyboxApplets lists the applet paths (bin/sh, usr/bin/env, ...) the static busybox provides.
func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("failed to list busybox applets: %w", err)
	}
	var applets []string
	for _, l := range strings.Split(string(out), "\n") {
		l = strings.TrimPrefix(strings.TrimSpace(l), "/")
		if l != "" && !strings.Contains(l, "..") {
			applets = append(applets, l)
		}
	}
	sort.Strings(applets)
	return applets, nil
}

// ociArchive renders img as an OCI image layout in a tar stream, the format `ctr images import` reads.
// The index carries containerd's image name annotation, so the import creates the image under that name.
func ociArchive(img image) ([]byte, error) {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	for _, f := range img.files {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Typeflag: f.typ, Linkname: f.linkname,
			Size: int64(len(f.data)), ModTime: fixedTime, Format: tar.FormatPAX}
		if f.typ == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	diffID := digest(layerTar.Bytes())
	var layerGz bytes.Buffer
	gz, _ := gzip.NewWriterLevel(&layerGz, gzip.BestSpeed)
	if _, err := gz.Write(layerTar.Bytes()); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}

	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      fixedTime.Format(time.RFC3339),
		"config": map[string]any{
			"Env":        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
			"Entrypoint": img.entrypoint,
			"Cmd":        img.cmd,
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return nil, err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers": []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layerGz.Bytes(),
			nil)},
	})
	if err != nil {
		return nil, err
	}
	tag := img.name[strings.LastIndex(img.name, ":")+1:]
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
		"io.containerd.image.name":          img.name,
		"org.opencontainers.image.ref.name": tag,
	})
	manifestDesc["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{manifestDesc},
	})
	if err != nil {
		return nil, err
	}

	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(config), config},
		{blobPath(layerGz.Bytes()), layerGz.Bytes()},
		{blobPath(manifest), manifest},
	}
	for _, dirName := range []string{"blobs/", "blobs/sha256/"} {
		if err := ow.WriteHeader(&tar.Header{Name: dirName, Mode: 0o755, Typeflag: tar.TypeDir,
			ModTime: fixedTime}); err != nil {
			return nil, err
		}
	}
	for _, e := range entries {
		if err := ow.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)),
			Typeflag: tar.TypeReg, ModTime: fixedTime}); err != nil {
			return nil, err
		}
		if _, err := ow.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := ow.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:")
}

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}

func dir(name string) tarFile { return tarFile{name: name, mode: 0o755, typ: tar.TypeDir} }

func file(name string, mode int64, data string) tarFile {
	return tarFile{name: name, mode: mode, typ: tar.TypeReg, data: []byte(data)}
}

func sanitize(s string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(s)
}
