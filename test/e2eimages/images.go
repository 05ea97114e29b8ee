// Package e2eimages builds, offline, the test images upstream's e2e suites ask for (e2e_node.test and
// e2e.test --list-images), under exactly the names the suites use, from the Go module proxy and
// Debian's packages: make e2e-node imports them into the harness's containerd, make
// e2e-cluster-conformance loads them into every node of the kind cluster.
package e2eimages

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/pleg-nri/pleg-nri/test/containerd-it/harness"
)

// Result is one image the suite names, and what became of it here.
type Result struct {
	Name string `json:"name"`
	// Built says it was built offline and imported under Name; else Why says why not.
	Built bool   `json:"built"`
	Why   string `json:"why,omitempty"`
}

// List asks a suite's binary (e2e_node.test or e2e.test) for every image it uses (--list-images: the
// names at its version, registries and tags as upstream's tests ask for them).
func List(ctx context.Context, suite string) ([]string, error) {
	out, err := exec.CommandContext(ctx, suite, "--list-images").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list-images: %w", filepath.Base(suite), err)
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "I") && strings.Contains(l, "/") {
			names = append(names, l)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s --list-images listed no image:\n%s", filepath.Base(suite), out)
	}
	sort.Strings(names)
	return names, nil
}

// Builder builds a suite's images.
type Builder struct {
	// Root is the repository's root (this package's hack/build-rootfs.sh and nmeter are under it).
	Root string
	// Cache is the dependency cache (busybox, pause, the built programs and the image archives).
	Cache string
	// Agnhost is upstream's agnhost program built at the suite's version (the suite's build makes it).
	Agnhost string
	// Version is the suite's k8s.io/kubernetes version: its module's test/images are read.
	Version string
}

// Build builds, from the module proxy and Debian's packages only, every image of names this project
// knows how to make the way upstream does, writes each as an OCI archive under the cache, and returns
// every name with what became of it, and the archives (for ctr images import or kind load).
//
//   - agnhost (every tag the suite names): upstream's agnhost program built from
//     k8s.io/kubernetes/test/images/agnhost at the suite's version, on a Debian bookworm root with the
//     tools upstream's alpine image installs (agnhostPackages), with the entrypoint, the agnhost-2
//     link, /uploads, porter's key pair and the user and group upstream's Dockerfile adds, and the
//     nmeter stand-in (below: alpine's busybox has the applet, and specs run it in agnhost);
//   - busybox (by tag): Debian's static busybox with every applet, each also linked in /bin as in
//     upstream's image, and a stand-in for the one applet the tests call that Debian's build leaves
//     out, nmeter (./nmeter). Built from Debian's source without the patch that reverts upstream's
//     9c143ce5 (hack/build-busybox.sh): Debian's binary drops environment variables whose names are
//     not shell identifiers, upstream's keeps them, and the ConfigMap and Secrets specs read them;
//   - nginx (every tag): Debian bookworm's nginx-light on a minbase root (upstream: the official
//     nginx alpine image), serving its welcome page on port 80, logging to the container's stdout and
//     stderr, stopped with SIGQUIT, as upstream's;
//   - glibc-dns-testing: Debian bookworm with dnsutils, as upstream's (without its CoreDNS);
//   - ipc-utils: Debian bookworm's util-linux (ipcs, ipcmk) and awk (upstream: alpine's util-linux);
//   - nonewprivs: upstream's nnp program, setuid root, on the busybox root (upstream: on alpine);
//   - nonroot: the busybox root run as user 1234 (upstream: debian-base, USER 1234);
//   - pause: the harness's pause image under the suite's name.
//
// An image pinned by digest cannot be rebuilt (its content would differ): it is listed, not built.
func (b Builder) Build(ctx context.Context, names []string) ([]Result, []string, error) {
	bbPath, err := b.script(ctx, "build-busybox.sh")
	if err != nil {
		return nil, nil, err
	}
	bb, err := harness.BusyboxFilesOf(ctx, bbPath)
	if err != nil {
		return nil, nil, err
	}
	bb = withEveryAppletInBin(bb)
	pause, err := harness.PauseFiles(ctx, b.Cache)
	if err != nil {
		return nil, nil, err
	}
	var agnhost []harness.File
	var nginxBase, agnhostBase string
	var nmeter []byte
	nmeterFile := func(name string) (harness.File, error) {
		if nmeter == nil {
			var err error
			if nmeter, err = harness.BuildStatic(ctx, b.Cache, filepath.Join(b.Root, "test", "e2eimages", "nmeter"), "nmeter"); err != nil {
				return harness.File{}, err
			}
		}
		return harness.File{Name: name, Mode: 0o755, Type: harness.Reg, Data: nmeter}, nil
	}
	var images []harness.Image
	var out []Result
	for _, name := range names {
		repo, tag, ok := SplitTag(name)
		switch {
		case !ok:
			out = append(out, Result{Name: name, Why: "pinned by digest: no rebuild has that digest"})
		case strings.HasPrefix(name, "gcr.io/k8s-authenticated-test/") || strings.HasPrefix(name, "invalid."):
			out = append(out, Result{Name: name, Why: "never built: the specs that name it expect its pull to fail (a private or an invalid registry)"})
		case repo == e2eImages+"agnhost" || repo == e2eImages+"kitten" || repo == e2eImages+"nautilus":
			if agnhost == nil {
				if agnhostBase, err = b.rootfs(ctx, "agnhost", agnhostPackages...); err != nil {
					return nil, nil, err
				}
				if agnhost, err = b.agnhostImage(agnhostBase); err != nil {
					return nil, nil, err
				}
				// Upstream's agnhost is on alpine, whose busybox has nmeter; the Containers
				// Lifecycle specs run their timestamped logging script (nmeter for the
				// milliseconds) in agnhost too, the alternate image they change a container to.
				// In /usr/bin: the Debian root's /bin is a link to it.
				nm, err := nmeterFile("usr/bin/nmeter")
				if err != nil {
					return nil, nil, err
				}
				agnhost = append(agnhost, nm)
			}
			im := harness.Image{Name: name, Base: agnhostBase, Files: agnhost, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}
			if repo != e2eImages+"agnhost" {
				// Upstream's kitten and nautilus: agnhost with a picture and data.json at the root,
				// serving them (the ImageVolume specs mount the image and read data.json).
				extra, err := b.webserverFiles(strings.TrimPrefix(repo, e2eImages))
				if err != nil {
					return nil, nil, err
				}
				im.Files = append(append([]harness.File{}, agnhost...), extra...)
				im.Cmd = []string{"test-webserver"}
			}
			images = append(images, im)
			out = append(out, Result{Name: name, Built: true})
		case repo == e2eImages+"busybox" && !strings.Contains(tag, "windows"):
			nm, err := nmeterFile("bin/nmeter")
			if err != nil {
				return nil, nil, err
			}
			files := append(append([]harness.File{}, bb...), nm)
			images = append(images, harness.Image{Name: name, Files: files, Cmd: []string{"sh"}})
			out = append(out, Result{Name: name, Built: true})
		case repo == e2eImages+"nginx":
			if nginxBase == "" {
				if nginxBase, err = b.rootfs(ctx, "nginx", "nginx-light"); err != nil {
					return nil, nil, err
				}
			}
			images = append(images, harness.Image{Name: name, Base: nginxBase, Files: []harness.File{
				{Name: "var/log/nginx/access.log", Mode: 0o777, Type: harness.Symlink, Link: "/dev/stdout"},
				{Name: "var/log/nginx/error.log", Mode: 0o777, Type: harness.Symlink, Link: "/dev/stderr"},
			}, Cmd: []string{"nginx", "-g", "daemon off;"}, StopSignal: "SIGQUIT"})
			out = append(out, Result{Name: name, Built: true})
		case repo == e2eImages+"glibc-dns-testing":
			// Upstream: debian bookworm-slim with dnsutils, and CoreDNS 1.5.0 downloaded from
			// GitHub, which no spec of the node suite runs (left out: not on the module proxy at
			// that version). The Hostname specs run hostname and hostname -f in sh.
			base, err := b.rootfs(ctx, "glibc-dns-testing", "dnsutils")
			if err != nil {
				return nil, nil, err
			}
			images = append(images, harness.Image{Name: name, Base: base, Cmd: []string{"bash"}})
			out = append(out, Result{Name: name, Built: true})
		case repo == e2eImages+"ipc-utils":
			// Upstream: alpine with util-linux (ipcs, ipcmk); here Debian's util-linux, the same
			// programs, with awk (mawk), which the HostIPC specs pipe ipcs into.
			base, err := b.rootfs(ctx, "ipc-utils", "util-linux", "mawk")
			if err != nil {
				return nil, nil, err
			}
			images = append(images, harness.Image{Name: name, Base: base, Cmd: []string{"sh"}})
			out = append(out, Result{Name: name, Built: true})
		case repo == e2eImages+"nonewprivs":
			// Upstream: alpine with nnp (test/images/nonewprivs/nnp.go, printing its effective
			// uid) setuid root at /usr/local/bin/nnp, run by default; here on the busybox root.
			nnp, err := b.buildUpstreamProgram(ctx, "nonewprivs", "nnp.go")
			if err != nil {
				return nil, nil, err
			}
			files := append(append([]harness.File{}, bb...),
				harness.File{Name: "usr/local", Mode: 0o755, Type: harness.Dir},
				harness.File{Name: "usr/local/bin", Mode: 0o755, Type: harness.Dir},
				harness.File{Name: "usr/local/bin/nnp", Mode: 0o4755, Type: harness.Reg, Data: nnp})
			images = append(images, harness.Image{Name: name, Files: files, Cmd: []string{"nnp"},
				Env: []string{"PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}})
			out = append(out, Result{Name: name, Built: true})
		case repo == e2eImages+"nonroot":
			// Upstream: debian-base with USER 1234; here the busybox root (the specs run id).
			images = append(images, harness.Image{Name: name, Files: bb, Cmd: []string{"sh"}, User: "1234"})
			out = append(out, Result{Name: name, Built: true})
		case repo == "registry.k8s.io/pause":
			images = append(images, harness.Image{Name: name, Files: pause, Entrypoint: []string{"/pause"}})
			out = append(out, Result{Name: name, Built: true})
		default:
			out = append(out, Result{Name: name, Why: "no offline build yet"})
		}
	}
	// Every name its own image. Upstream's tags of one repository are different images (other
	// content, another ID); built here from the same sources, two tags would be one image under two
	// names, and containerd reports a container's image as its image's first name: the specs that
	// change a container's image (busybox 1.36.1-1 to 1.37.0-2, agnhost 2.55 to 2.66.1) would wait
	// for the new name forever, in every setup. A label naming the image gives each its own config,
	// so its own ID; the layers stay shared.
	for i := range images {
		images[i].Labels = map[string]string{imageLabel: images[i].Name}
	}
	archives, err := harness.WriteImages(b.Cache, images)
	if err != nil {
		return nil, nil, err
	}
	return out, archives, nil
}

// rootfs is hack/build-rootfs.sh's Debian root of packages, a tar (cached by the script).
func (b Builder) rootfs(ctx context.Context, name string, packages ...string) (string, error) {
	return b.script(ctx, "build-rootfs.sh", append([]string{name}, packages...)...)
}

// script runs one of this package's hack scripts with the cache, and returns the path it prints.
func (b Builder) script(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(b.Root, "test", "e2eimages", "hack", name)}, args...)...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), "PLEG_NRI_CACHE="+b.Cache)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// e2eImages is the registry and path of upstream's test images. The suite also names agnhost in a
// private registry (gcr.io/k8s-authenticated-test) and images in an invalid one: the tests that use them
// expect the pull to fail, so they are never built.
const e2eImages = "registry.k8s.io/e2e-test-images/"

// imageLabel is the label of every image built here: the name it was built for.
const imageLabel = "io.pleg-nri.e2e-image"

// SplitTag splits "registry/repo:tag"; ok is false for a name pinned by digest.
func SplitTag(name string) (repo, tag string, ok bool) {
	if strings.Contains(name, "@") {
		return "", "", false
	}
	i := strings.LastIndex(name, ":")
	if i < 0 || strings.Contains(name[i:], "/") {
		return name, "latest", true
	}
	return name[:i], name[i+1:], true
}

// agnhostPackages are the Debian packages of the agnhost image's root: the tools upstream's alpine
// image installs that tests call (curl, nc, dig and nslookup, ip and ss, ping, socat, ps, bash).
var agnhostPackages = []string{"curl", "netcat-openbsd", "iproute2", "iputils-ping", "dnsutils", "socat", "procps", "bash"}

// agnhostImage is the agnhost image's layer: a Debian root with agnhostPackages (base), the agnhost
// program, its agnhost-2 link, /uploads, porter's key pair, and the user and group upstream's
// Dockerfile adds.
func (b Builder) agnhostImage(base string) ([]harness.File, error) {
	bin, err := os.ReadFile(b.Agnhost)
	if err != nil {
		return nil, err
	}
	src, err := ModuleDir(b.Version)
	if err != nil {
		return nil, err
	}
	passwd, err := readTarFile(base, "etc/passwd")
	if err != nil {
		return nil, err
	}
	group, err := readTarFile(base, "etc/group")
	if err != nil {
		return nil, err
	}
	files := []harness.File{
		// Upstream's Dockerfile adds user-defined-in-image (1000) in group-defined-in-image (50000).
		{Name: "etc/passwd", Mode: 0o644, Type: harness.Reg,
			Data: append(passwd, "user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n"...)},
		{Name: "etc/group", Mode: 0o644, Type: harness.Reg,
			Data: append(group, "user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n"...)},
		{Name: "home/user-defined-in-image", Mode: 0o755, Type: harness.Dir},
		{Name: "agnhost", Mode: 0o755, Type: harness.Reg, Data: bin},
		{Name: "agnhost-2", Mode: 0o777, Type: harness.Symlink, Link: "agnhost"},
		{Name: "uploads", Mode: 0o755, Type: harness.Dir},
	}
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		data, err := os.ReadFile(filepath.Join(src, "test", "images", "agnhost", "porter", f))
		if err != nil {
			return nil, err
		}
		files = append(files, harness.File{Name: f, Mode: 0o644, Type: harness.Reg, Data: data})
	}
	return files, nil
}

// withEveryAppletInBin adds a /bin link for every busybox applet linked elsewhere (Debian's build
// puts top in /usr/bin, say): upstream's busybox image has every applet in /bin, and specs call
// /bin/top.
func withEveryAppletInBin(files []harness.File) []harness.File {
	have := map[string]bool{}
	for _, f := range files {
		have[f.Name] = true
	}
	out := slices.Clone(files)
	for _, f := range files {
		if f.Type != harness.Symlink || f.Link != "/bin/busybox" {
			continue
		}
		if bin := "bin/" + path.Base(f.Name); !have[bin] {
			have[bin] = true
			out = append(out, harness.File{Name: bin, Mode: 0o777, Type: harness.Symlink, Link: "/bin/busybox"})
		}
	}
	return out
}

// buildUpstreamProgram builds test/images/<dir>/<file> of k8s.io/kubernetes at the suite's version,
// a program of one file using only the standard library, as a static binary (cached by its source).
func (b Builder) buildUpstreamProgram(ctx context.Context, dir, file string) ([]byte, error) {
	src, err := ModuleDir(b.Version)
	if err != nil {
		return nil, err
	}
	code, err := os.ReadFile(filepath.Join(src, "test", "images", dir, file))
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "e2e-node-"+dir)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for name, data := range map[string][]byte{"main.go": code, "go.mod": []byte("module " + dir + "\n\ngo 1.24\n")} {
		if err := os.WriteFile(filepath.Join(tmp, name), data, 0o644); err != nil {
			return nil, err
		}
	}
	return harness.BuildStatic(ctx, b.Cache, tmp, strings.TrimSuffix(file, ".go"))
}

// webserverFiles are the files upstream's kitten or nautilus Dockerfile adds to agnhost: the picture
// and data.json from test/images/<name>/html, at the root.
func (b Builder) webserverFiles(name string) ([]harness.File, error) {
	src, err := ModuleDir(b.Version)
	if err != nil {
		return nil, err
	}
	var files []harness.File
	for _, f := range []string{name + ".jpg", "data.json"} {
		data, err := os.ReadFile(filepath.Join(src, "test", "images", name, "html", f))
		if err != nil {
			return nil, err
		}
		files = append(files, harness.File{Name: f, Mode: 0o644, Type: harness.Reg, Data: data})
	}
	return files, nil
}

// readTarFile returns the content of the regular file name (no leading "./" or "/") in a tar.
func readTarFile(path, name string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s has no %s", path, name)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if strings.TrimPrefix(strings.TrimPrefix(hdr.Name, "./"), "/") == name && hdr.Typeflag == tar.TypeReg {
			return io.ReadAll(tr)
		}
	}
}

// ModuleDir is k8s.io/kubernetes at version in the module cache (the suite's build downloaded it).
func ModuleDir(version string) (string, error) {
	modcache, err := GoEnv("GOMODCACHE")
	if err != nil {
		return "", err
	}
	dir := filepath.Join(modcache, "k8s.io", "kubernetes@"+version)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("k8s.io/kubernetes@%s is not in the module cache: %w", version, err)
	}
	return dir, nil
}

// GoEnv is the go command's setting name (go env name).
func GoEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}
