package framework

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ports of the processes a test starts (etcd, kube-apiserver,
// kube-controller-manager, a driver's --http-endpoint) all come from
// FreePort, so that tests running side by side (t.Parallel) never get the
// same one: it hands out each port once per test binary. Before, each
// picked a free port of its own (hack/controlplane.sh at random, the
// others by bind(":0")), and until the process that was to listen on it
// had bound it, a test starting beside it could pick the same one.
var ports = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// portRangeLow is where FreePort's ports start: above the well-known and
// common service ports.
const portRangeLow = 10000

// FreePort returns a loopback TCP port that was free a moment ago and that
// no other caller in this test binary has had. It lies below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), from which outgoing
// connections take their local ports at any moment: a port picked there
// could be taken by a connection before its listener binds it.
func FreePort() (int, error) {
	hi := ephemeralLow() - 1
	ports.Lock()
	defer ports.Unlock()
	for range 1000 {
		p := portRangeLow + rand.IntN(hi-portRangeLow+1)
		if ports.given[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue // in use, by us or by anyone else on the machine
		}
		l.Close()
		ports.given[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free loopback port in %d-%d after 1000 tries", portRangeLow, hi)
}

// ephemeralLow is the first port of the kernel's ephemeral range, 32768
// when it cannot be read or leaves FreePort too few ports.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo < portRangeLow+1000 {
		return 32768
	}
	return lo
}
