package harness

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"testing"
)

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a`:             "/tmp/a",
		`/tmp/with\040space`: "/tmp/with space",
		`/tmp/tab\011x`:      "/tmp/tab\tx",
		`/tmp/back\134slash`: `/tmp/back\slash`,
		`/tmp/short\04`:      `/tmp/short\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCgroupUnder(t *testing.T) {
	const v1 = "12:memory:/plegit-abc/podx/123\n11:cpu:/\n"
	const v2 = "0::/plegit-abc\n"
	for _, tc := range []struct {
		text, parent string
		want         bool
	}{
		{v1, "/plegit-abc", true},
		{v2, "/plegit-abc", true},
		{v1, "/plegit-ab", false},
		{"0::/\n", "/plegit-abc", false},
		{"", "/plegit-abc", false},
		{v1, "/", false},
		{v1, "", false},
	} {
		if got := CgroupUnder(tc.text, tc.parent); got != tc.want {
			t.Errorf("CgroupUnder(%q, %q) = %v, want %v", tc.text, tc.parent, got, tc.want)
		}
	}
}

// TestOCIArchive checks that an image archive is reproducible and is an OCI layout whose index names
// the image the way containerd's importer reads it.
func TestOCIArchive(t *testing.T) {
	img := Image{Name: "example.com/x:tag", Files: []File{dir("bin"), file("bin/x", 0o755, "#!/bin/sh\n")},
		Cmd: []string{"/bin/x"}}
	a, err := ociArchive(img)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ociArchive(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two builds of the same image differ")
	}
	files := archiveEntries(t, a)
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != img.Name {
		t.Fatalf("index = %+v, want one manifest named %s", index, img.Name)
	}
	if _, ok := files["blobs/sha256/"+index.Manifests[0].Digest[len("sha256:"):]]; !ok {
		t.Errorf("manifest blob %s missing", index.Manifests[0].Digest)
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", files["oci-layout"])
	}
}

// TestOCIArchiveLabels: images of the same files that differ by a label are two images (two configs,
// so two image IDs) with one layer, and the label is in the config.
func TestOCIArchiveLabels(t *testing.T) {
	files := []File{dir("bin"), file("bin/x", 0o755, "#!/bin/sh\n")}
	manifest := func(labels map[string]string) (config, layer string, cfg map[string]any) {
		a, err := ociArchive(Image{Name: "example.com/x:tag", Files: files, Labels: labels})
		if err != nil {
			t.Fatal(err)
		}
		blobs := archiveEntries(t, a)
		var index struct{ Manifests []struct{ Digest string } }
		var m struct {
			Config struct{ Digest string }
			Layers []struct{ Digest string }
		}
		if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
			t.Fatalf("index.json: %v", err)
		}
		if err := json.Unmarshal(blobs["blobs/sha256/"+index.Manifests[0].Digest[len("sha256:"):]], &m); err != nil || len(m.Layers) != 1 {
			t.Fatalf("manifest: %v", err)
		}
		if err := json.Unmarshal(blobs["blobs/sha256/"+m.Config.Digest[len("sha256:"):]], &cfg); err != nil {
			t.Fatalf("config: %v", err)
		}
		return m.Config.Digest, m.Layers[0].Digest, cfg
	}
	c1, l1, cfg := manifest(map[string]string{"k": "a"})
	c2, l2, _ := manifest(map[string]string{"k": "b"})
	c0, l0, plain := manifest(nil)
	if c1 == c2 || c1 == c0 {
		t.Errorf("configs %s, %s, %s: want three images", c1, c2, c0)
	}
	if l1 != l2 || l1 != l0 {
		t.Errorf("layers %s, %s, %s: want one", l1, l2, l0)
	}
	if got := cfg["config"].(map[string]any)["Labels"]; !reflect.DeepEqual(got, map[string]any{"k": "a"}) {
		t.Errorf("config labels = %v, want k=a", got)
	}
	if _, ok := plain["config"].(map[string]any)["Labels"]; ok {
		t.Errorf("an image without labels has Labels in its config: %v", plain["config"])
	}
}

// archiveEntries is the content of every entry of a tar, by name.
func archiveEntries(t *testing.T, a []byte) map[string][]byte {
	t.Helper()
	entries := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		entries[hdr.Name] = data
	}
}

// TestBaseFilesTmp: /tmp of every test image is everyone's and sticky, as upstream's busybox has it.
func TestBaseFilesTmp(t *testing.T) {
	for _, f := range BaseFiles() {
		if f.Name == "tmp" {
			if f.Type != Dir || f.Mode != 0o1777 {
				t.Fatalf("tmp: %+v, want a directory of mode 1777", f)
			}
			return
		}
	}
	t.Fatal("no tmp in BaseFiles")
}
