package backends

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flagsBox is the box of the --rds-* flags as csi.Options makes it.
func flagsBox() Backend {
	return Backend{
		Name: "rack-a", Address: "10.0.0.10", Port: 22, User: "csi",
		KeyFile: "/etc/rds-csi/ssh/id_ed25519", KnownHostsFile: "/etc/rds-csi/ssh/known_hosts",
		Pool: "storage-pool", VolumePath: "/storage-pool/kubernetes-volumes",
		NVMeAddress: "10.0.0.10", NVMePort: 4420, CommandTimeout: 30 * time.Second,
	}
}

func TestAnEmptyConfigFileKeepsTheBoxOfTheFlags(t *testing.T) {
	for _, text := range []string{"", "# no more RDS\n", "rds: []\n"} {
		boxes, err := Parse("rds.yaml", []byte(text), flagsBox())
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if len(boxes) != 1 || !boxes[0].Default || boxes[0].Name != "rack-a" {
			t.Fatalf("%q: got %+v, want the flags' box alone, as the default", text, boxes)
		}
		if err := Validate(boxes, ForController); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
	}
}

func TestABoxOfTheFileTakesWhatItLeavesOutFromTheFlags(t *testing.T) {
	text := `
rds:
  - name: rack-b
    address: 10.0.1.10
    knownHostsFile: /etc/rds-csi/ssh-rack-b/known_hosts
    nvmeAddress: 10.0.3.10
    commandTimeout: 5s
    maxSessions: 2
    nodes: ["rack-b-*"]
  - name: rack-c
    address: rds-c.example.net
    port: 2222
    user: other
    keyFile: /etc/rds-csi/ssh-rack-c/id_ed25519
    pool: pool2
    volumePath: /pool2/k8s
    nvmePort: 4421
`
	boxes, err := Parse("rds.yaml", []byte(text), flagsBox())
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(boxes, ForController); err != nil {
		t.Fatal(err)
	}
	b, c := boxes[1], boxes[2]
	if b.Default || c.Default {
		t.Fatal("a box of the file is never the default")
	}
	if b.Port != 22 || b.User != "csi" || b.KeyFile != "/etc/rds-csi/ssh/id_ed25519" || b.Pool != "storage-pool" ||
		b.VolumePath != "/storage-pool/kubernetes-volumes" || b.NVMeAddress != "10.0.3.10" || b.NVMePort != 4420 ||
		b.CommandTimeout != 5*time.Second || b.MaxSessions != 2 || b.KnownHostsFile != "/etc/rds-csi/ssh-rack-b/known_hosts" {
		t.Errorf("rack-b: %+v", b)
	}
	if c.Port != 2222 || c.User != "other" || c.Pool != "pool2" || c.VolumePath != "/pool2/k8s" || c.NVMeAddress != "rds-c.example.net" ||
		c.NVMePort != 4421 || c.CommandTimeout != 30*time.Second || c.KnownHostsFile != "/etc/rds-csi/ssh/known_hosts" {
		t.Errorf("rack-c: %+v", c)
	}
	if !b.Reaches("rack-b-7") || b.Reaches("rack-a-1") || !c.Reaches("anything") {
		t.Error("nodes patterns")
	}
}

func TestBadConfigurationIsRefusedNamingTheEntry(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"duplicate name", "rds:\n- {name: rack-b, address: 10.0.1.10}\n- {name: rack-b, address: 10.0.2.10}\n",
			[]string{`rds[1] ("rack-b"): name "rack-b" is taken by --rds-config rds[0] ("rack-b")`}},
		{"the flags' name again, in other case", "rds:\n- {name: RACK-A, address: 10.0.1.10}\n",
			[]string{`rds[0] ("RACK-A"): name "RACK-A" is taken by the RDS of the --rds-* flags ("rack-a")`}},
		{"no host key", "rds:\n- {name: rack-b, address: 10.0.1.10, knownHostsFile: \"\"}\n", nil}, // inherits the flags' file
		{"two boxes at one address", "rds:\n- {name: rack-b, address: 10.0.0.10}\n",
			[]string{`rds[0] ("rack-b"): SSH address 10.0.0.10:22 is the RDS of the --rds-* flags ("rack-a")'s already`}},
		{"one address spelt two ways", "rds:\n- {name: b, address: RDS.example.net., nvmeAddress: 10.9.9.1}\n- {name: c, address: rds.example.net, nvmeAddress: 10.9.9.2}\n",
			[]string{`rds[1] ("c"): SSH address rds.example.net:22 is --rds-config rds[0] ("b")'s already`}},
		{"one NVMe target", "rds:\n- {name: rack-b, address: 10.0.1.10, nvmeAddress: 10.0.0.10}\n",
			[]string{`rds[0] ("rack-b"): NVMe/TCP target 10.0.0.10:4420`}},
		{"not a label value", "rds:\n- {name: \"rack b\", address: 10.0.1.10}\n",
			[]string{`rds[0] ("rack b"): name "rack b" is not a Kubernetes label value`}},
		{"too long for the node label", "rds:\n- {name: " + strings.Repeat("x", 60) + ", address: 10.0.1.10}\n",
			[]string{"is 60 characters; with several RDS at most 59"}},
		{"no name", "rds:\n- {address: 10.0.1.10}\n", []string{"--rds-config rds[0]: a name is required"}},
		{"no address", "rds:\n- {name: rack-b}\n", []string{`rds[0] ("rack-b"): an address is required`}},
		{"address with a port", "rds:\n- {name: rack-b, address: \"10.0.1.10:22\"}\n", []string{`rds[0] ("rack-b"): address: `, "has a port"}},
		{"limits", "rds:\n- {name: rack-b, address: 10.0.1.10, commandTimeout: 20m, maxSessions: 65}\n",
			[]string{"commandTimeout 20m0s is outside 1s..10m0s", "maxSessions 65 is outside 1..64"}},
		{"pool path", "rds:\n- {name: rack-b, address: 10.0.1.10, pool: p, volumePath: /p}\n", []string{"volumePath must be a directory inside the pool"}},
		{"node pattern", "rds:\n- {name: rack-b, address: 10.0.1.10, nodes: [\"[a-\"]}\n", []string{`nodes: "[a-" is not a node name pattern`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			def := flagsBox()
			if tc.name == "no host key" {
				def.KnownHostsFile = ""
				def.InsecureSkipHostKeyCheck = true // a lab's default box; the file's box must still pin its own
				tc.want = []string{`rds[0] ("rack-b"): no pinned host key`}
			}
			boxes, err := Parse("rds.yaml", []byte(tc.text), def)
			if err != nil {
				t.Fatal(err)
			}
			err = Validate(boxes, ForController)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestAConfigFileWithAnUnknownKeyIsRefused(t *testing.T) {
	_, err := Parse("rds.yaml", []byte("rds:\n- {name: rack-b, address: 10.0.1.10, knownHosts: x}\n"), flagsBox())
	if err == nil || !strings.Contains(err.Error(), "knownHosts") {
		t.Fatalf("got %v, want the misspelt key named", err)
	}
}

func TestANodePluginChecksOnlyNamesAndPatterns(t *testing.T) {
	// The node plugin never logs in: no address or key is needed there.
	def := Backend{Name: "rack-a", Default: true}
	boxes, err := Parse("rds.yaml", []byte("rds:\n- {name: rack-b, nodes: [\"b-*\"]}\n"), def)
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(boxes, ForNode); err != nil {
		t.Fatal(err)
	}
	if err := Validate(boxes, ForController); err == nil {
		t.Fatal("a controller accepted a box without an address")
	}
}

func TestLoadNamesAnUnreadableFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"), flagsBox())
	if err == nil || !strings.Contains(err.Error(), "--rds-config") {
		t.Fatalf("got %v", err)
	}
	name := filepath.Join(t.TempDir(), "rds.yaml")
	if err := os.WriteFile(name, []byte("rds:\n- {name: rack-b, address: 10.0.1.10}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	boxes, err := Load(name, flagsBox())
	if err != nil || len(boxes) != 2 {
		t.Fatalf("got %v, %v", boxes, err)
	}
}
