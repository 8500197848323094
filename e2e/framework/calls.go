package framework

import (
	"regexp"
	"sort"
	"strconv"
)

// The driver's gRPC interceptor logs every call's start ("request", at
// -v=4) and its end ("response" at -v=4, or "failed"), each with the
// method and the call's id.
var callLine = regexp.MustCompile(`\] "(request|response|failed)"(?: .*?)? method="([^"]+)" id=(\d+)`)

// CallsInFlight reads a driver's log and returns the ids of the calls of
// method (e.g. "/csi.v1.Controller/ControllerPublishVolume") that started
// and have not ended, sorted. A restarted driver appends to the same log
// and numbers its calls again: read it only while one process wrote it.
func CallsInFlight(log, method string) ([]int, error) {
	open := map[int]bool{}
	err := scanLogs([]string{log}, func(_, line string) error {
		m := callLine.FindStringSubmatch(line)
		if m == nil || m[2] != method {
			return nil
		}
		id, err := strconv.Atoi(m[3])
		if err != nil {
			return nil
		}
		if m[1] == "request" {
			open[id] = true
		} else {
			delete(open, id)
		}
		return nil
	})
	out := make([]int, 0, len(open))
	for id := range open {
		out = append(out, id)
	}
	sort.Ints(out)
	return out, err
}
