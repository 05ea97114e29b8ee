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
	"io"
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

// Image is one single-layer image to build, named as containerd will know it.
type Image struct {
	Name string
	// Base is a tar of a root filesystem (a Debian one, say) the layer starts with; Files come after
	// it, so they replace its entries of the same name.
	Base       string
	Files      []File
	Entrypoint []string
	Cmd        []string
	// Env is the image config's environment (default PATH=/usr/sbin:/usr/bin:/sbin:/bin).
	Env []string
	// User and WorkingDir are the image config's (empty: root, /).
	User, WorkingDir string
	// StopSignal is the image config's (empty: SIGTERM, the runtime's default).
	StopSignal string
	// Labels are the image config's labels (none if empty).
	Labels map[string]string
}

// File is one entry of a layer: a directory (Dir), a regular file (Reg) or a symlink (Symlink).
type File struct {
	Name string
	Mode int64
	Type byte
	Data []byte
	Link string
}

// The entry types of a File.
const (
	Dir     = tar.TypeDir
	Reg     = tar.TypeReg
	Symlink = tar.TypeSymlink
)

// fixedTime keeps layers byte-identical between builds, so their digests (and the cache key) are stable.
var fixedTime = time.Unix(0, 0).UTC()

// BuildImages builds the pause and busybox images as OCI archives under cache/images and returns their
// paths. A build is reused when its inputs have not changed.
func BuildImages(ctx context.Context, cache string) ([]string, error) {
	pause, err := PauseFiles(ctx, cache)
	if err != nil {
		return nil, err
	}
	bb, err := BusyboxFiles(ctx, cache)
	if err != nil {
		return nil, err
	}
	return WriteImages(cache, []Image{
		{Name: PauseImage, Files: pause, Entrypoint: []string{"/pause"}},
		{Name: BusyboxImage, Files: bb, Cmd: []string{"sh"}},
	})
}

// BaseFiles are the directories and account files every test image has.
func BaseFiles() []File {
	return []File{
		dir("etc"), dir("proc"), dir("sys"), dir("dev"), dir("run"), dir("var"), dir("root"),
		// Everyone's, sticky, as in upstream's images: a container run as a user (the restricted
		// pod security of upstream's specs runs uid 1000) writes its markers there.
		{Name: "tmp", Mode: 0o1777, Type: Dir},
		file("etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
		file("etc/group", 0o644, "root:x:0:\nnogroup:x:65534:\n"),
	}
}

// PauseFiles are the pause image's files: BaseFiles and /pause.
func PauseFiles(ctx context.Context, cache string) ([]File, error) {
	pause, err := buildPause(ctx, cache)
	if err != nil {
		return nil, err
	}
	return append(BaseFiles(), File{Name: "pause", Mode: 0o755, Type: Reg, Data: pause}), nil
}

// BusyboxFiles are the busybox image's files: BaseFiles, Debian's static busybox as /bin/busybox and a
// link to it for each of its applets (/bin/sh, /usr/bin/env, ...).
func BusyboxFiles(ctx context.Context, cache string) ([]File, error) {
	bbPath, err := filepath.EvalSymlinks(filepath.Join(cache, "bin", "busybox"))
	if err != nil {
		return nil, fmt.Errorf("busybox is not installed in %s (run install-deps.sh): %w", cache, err)
	}
	return BusyboxFilesOf(ctx, bbPath)
}

// BusyboxFilesOf are BusyboxFiles with the static busybox binary at bbPath instead of Debian's.
func BusyboxFilesOf(ctx context.Context, bbPath string) ([]File, error) {
	busybox, err := os.ReadFile(bbPath)
	if err != nil {
		return nil, err
	}
	applets, err := busyboxApplets(ctx, bbPath)
	if err != nil {
		return nil, err
	}
	bb := append(BaseFiles(), dir("bin"), dir("sbin"), dir("usr"), dir("usr/bin"), dir("usr/sbin"),
		File{Name: "bin/busybox", Mode: 0o755, Type: Reg, Data: busybox})
	for _, a := range applets {
		if a == "bin/busybox" {
			continue
		}
		bb = append(bb, File{Name: a, Mode: 0o777, Type: Symlink, Link: "/bin/busybox"})
	}
	return bb, nil
}

// WriteImages writes each image as an OCI archive under cache/images, named by the image and a hash of
// its content (an archive already there is kept), and returns their paths in order.
func WriteImages(cache string, images []Image) ([]string, error) {
	dir := filepath.Join(cache, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for _, img := range images {
		archive, err := ociArchive(img)
		if err != nil {
			return nil, fmt.Errorf("failed to build image %s: %w", img.Name, err)
		}
		sum := sha256.Sum256(archive)
		path := filepath.Join(dir, sanitize(img.Name)+"-"+hex.EncodeToString(sum[:6])+".tar")
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
	return BuildStatic(ctx, cache, filepath.Join(filepath.Dir(self), "..", "pause"), "pause")
}

// BuildStatic compiles the one-file Go command in srcDir (its main.go) as a static binary named name
// into the cache, keyed by the source and the Go version, and returns the binary.
func BuildStatic(ctx context.Context, cache, srcDir, name string) ([]byte, error) {
	src, err := os.ReadFile(filepath.Join(srcDir, "main.go"))
	if err != nil {
		return nil, fmt.Errorf("failed to read the %s source: %w", name, err)
	}
	sum := sha256.Sum256(append(src, runtime.Version()...))
	bin := filepath.Join(cache, name+"-"+hex.EncodeToString(sum[:6]), name)
	if data, err := os.ReadFile(bin); err == nil {
		return data, nil
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin+".tmp", ".")
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("failed to build %s: %w: %s", name, err, out)
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
func ociArchive(img Image) ([]byte, error) {
	var layerTar bytes.Buffer
	tw := tar.NewWriter(&layerTar)
	if img.Base != "" {
		if err := copyTar(tw, img.Base); err != nil {
			return nil, err
		}
	}
	for _, f := range img.Files {
		hdr := &tar.Header{Name: f.Name, Mode: f.Mode, Typeflag: f.Type, Linkname: f.Link,
			Size: int64(len(f.Data)), ModTime: fixedTime, Format: tar.FormatPAX}
		if f.Type == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
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

	env := img.Env
	if env == nil {
		env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	imgConfig := map[string]any{
		"Env":        env,
		"Entrypoint": img.Entrypoint,
		"Cmd":        img.Cmd,
	}
	if img.User != "" {
		imgConfig["User"] = img.User
	}
	if img.WorkingDir != "" {
		imgConfig["WorkingDir"] = img.WorkingDir
	}
	if img.StopSignal != "" {
		imgConfig["StopSignal"] = img.StopSignal
	}
	if len(img.Labels) > 0 {
		imgConfig["Labels"] = img.Labels
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      fixedTime.Format(time.RFC3339),
		"config":       imgConfig,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
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
	tag := img.Name[strings.LastIndex(img.Name, ":")+1:]
	manifestDesc := descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
		"io.containerd.image.name":          img.Name,
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

// copyTar copies every entry of the tar at path into tw.
func copyTar(tw *tar.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %s: %w", path, hdr.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return fmt.Errorf("%s: %s: %w", path, hdr.Name, err)
		}
	}
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

func dir(name string) File { return File{Name: name, Mode: 0o755, Type: Dir} }

func file(name string, mode int64, data string) File {
	return File{Name: name, Mode: mode, Type: Reg, Data: []byte(data)}
}

func sanitize(s string) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(s)
}
