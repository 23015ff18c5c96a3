package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/services/vmagent/backend"
	"github.com/berth-ci/berth/services/vmagent/backends/vz"
)

func TestVZSectionDefaultsAndKind(t *testing.T) {
	c, err := Parse([]byte(`data_dir: /var/lib/berth
agents:
  - host: mac-1
    pools: {macos: {labels: [self-hosted, macos], slots: 2}}
    backend:
      vz: {base_image: /Users/ci/berth/base}
`))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Agents[0]
	want := vz.Settings{BaseImage: "/Users/ci/berth/base", ClonesRoot: "/var/lib/berth/agents/mac-1/vz", CPUs: 4, Memory: 8 << 30,
		Steps:     backend.Steps{CreateTimeout: 10 * time.Minute, StopTimeout: 2 * time.Minute},
		StopGrace: time.Minute, ForceTimeout: 30 * time.Second}
	if got, ok := a.Backend.Settings.(*vz.Settings); a.Backend.Kind != "vz" || !ok || !reflect.DeepEqual(*got, want) {
		t.Errorf("kind %q, vz %+v; want vz, %+v", a.Backend.Kind, a.Backend.Settings, want)
	}
}

func TestVZSectionProblemsSayWhatToChange(t *testing.T) {
	_, err := Parse([]byte(`agents:
  - host: mac-1
    physical_cap: 3
    pools: {macos: {labels: [self-hosted, macos], slots: 3}}
    backend:
      kind: vz
      vz: {memory: 1GiB}
      exec: {create: [x], stop: [y]}
  - host: mac-2
    pools: {macos: {labels: [self-hosted, macos], slots: 1}}
    backend:
      kind: exec
      exec: {create: [x], stop: [y]}
      vz: {base_image: /b}
`))
	if err == nil {
		t.Fatal("Parse accepted a broken vz section")
	}
	for _, want := range []string{"backend.vz.base_image is required", "physical_cap 3", "memory 1GiB", "vz and exec sections given",
		"exec and vz sections given"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestExampleVZAgentLoads(t *testing.T) {
	b, err := os.ReadFile("../../deploy/berth.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(b), "# (config/vz_test.go loads this block uncommented: keep it valid.)\n")
	if !ok {
		t.Fatal("the vz example is gone from deploy/berth.example.yaml")
	}
	var yaml strings.Builder
	yaml.WriteString("agents:\n")
	for _, line := range strings.Split(block, "\n") {
		rest, ok := strings.CutPrefix(line, "  # ")
		if !ok { // the block ends at its first line that is not a comment
			break
		}
		yaml.WriteString("  " + rest + "\n")
	}
	c, err := Parse([]byte(yaml.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml.String())
	}
	if v, ok := c.Agents[0].Backend.Settings.(*vz.Settings); !ok || v.BaseImage == "" || v.Memory != 8<<30 {
		t.Errorf("example vz agent parsed as %+v", c.Agents[0].Backend)
	}
}

// A vz agent's shapes are checked against its images when the config is
// read: a shape naming an image the section does not list is refused with
// the pool and the images it has, not at a job's boot.
func TestVZShapesNameImagesTheHostHas(t *testing.T) {
	conf := `agents:
  - host: mac-1
    physical_cap: 2
    pools:
      macos:
        labels: [self-hosted, macos]
        slots: 2
        shapes:
          xcode16: {labels: [berth-image-xcode-16], image: xcode-16, cpu: 8, memory: 16GiB}
          old: {labels: [berth-image-xcode-15], image: xcode-15}
    backend:
      vz:
        base_image: /b
        images: {xcode-16: /images/xcode-16}
`
	_, err := Parse([]byte(conf))
	if err == nil || !strings.Contains(err.Error(), "pool macos-old") || !strings.Contains(err.Error(), `image "xcode-15", which this host does not have (vz.images: xcode-16)`) {
		t.Fatalf("Parse = %v; want the shape's unknown image refused", err)
	}
	if strings.Contains(err.Error(), "macos-xcode16") {
		t.Errorf("the shape with a listed image was refused too: %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(conf, "{xcode-16: /images/xcode-16}", "{xcode-16: /images/xcode-16, xcode-15: /images/xcode-15}", 1))); err != nil {
		t.Errorf("with both images listed: %v", err)
	}
}
