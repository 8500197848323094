package backends

import (
	"reflect"
	"sort"
	"testing"
)

const driver = "rds.csi.srvlab.io"

func TestANodeReportsTheBoxesItReaches(t *testing.T) {
	one := []Backend{{Name: "rack-a", Default: true}}
	if got, want := Segments(driver, one, "n1"), map[string]string{"topology.rds.csi.srvlab.io/rds": "rack-a"}; !reflect.DeepEqual(got, want) {
		t.Errorf("one box: %v, want %v (as before there were several)", got, want)
	}
	three := []Backend{{Name: "rack-a", Default: true}, {Name: "rack-b", Nodes: []string{"b-*"}}, {Name: "rack-c"}}
	got := Segments(driver, three, "b-1")
	want := map[string]string{
		"topology.rds.csi.srvlab.io/rds": "rack-a", "topology.rds.csi.srvlab.io/rds.rack-a": "true",
		"topology.rds.csi.srvlab.io/rds.rack-b": "true", "topology.rds.csi.srvlab.io/rds.rack-c": "true",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("b-1: %v, want %v", got, want)
	}
	if _, ok := Segments(driver, three, "a-1")["topology.rds.csi.srvlab.io/rds.rack-b"]; ok {
		t.Error("a-1 reports rack-b, which it does not reach")
	}
	for _, b := range three {
		names := NamedIn(driver, Accessible(driver, &b))
		if len(names) != 1 || names[0] != b.Name {
			t.Errorf("a volume on %s is accessible from %v", b.Name, names)
		}
	}
	names := NamedIn(driver, got)
	sort.Strings(names)
	if !reflect.DeepEqual(names, []string{"rack-a", "rack-a", "rack-b", "rack-c"}) {
		t.Errorf("NamedIn: %v", names)
	}
	if n := NamedIn(driver, map[string]string{"topology.kubernetes.io/zone": "z1", "topology.other.example/rds": "rack-a"}); len(n) != 0 {
		t.Errorf("keys of others name boxes: %v", n)
	}
}
