package metrics

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestNodeMetrics(t *testing.T) {
	reg := NewProcessRegistry()
	n := NewNodeMetrics(reg, func() float64 { return 2 })
	n.Observe(NodeStage, 300*time.Millisecond, nil)
	n.Observe(NodeStage, time.Second, status.Error(codes.FailedPrecondition, "holds another filesystem"))
	n.Observe(NodeStage, time.Second, errors.New("plain"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var stage []string
	ops, connected := 0, -1.0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "rds_csi_node_connected_subsystems":
			connected = mf.GetMetric()[0].GetGauge().GetValue()
		case "rds_csi_node_operation_duration_seconds":
			for _, m := range mf.GetMetric() {
				ops++
				var op, res string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "operation":
						op = l.GetValue()
					case "result":
						res = l.GetValue()
					}
				}
				if op == NodeStage {
					stage = append(stage, res+"="+strconv.FormatUint(m.GetHistogram().GetSampleCount(), 10))
				}
			}
		}
	}
	if connected != 2 {
		t.Errorf("rds_csi_node_connected_subsystems = %v, want 2", connected)
	}
	// Every operation exists from the start (success), plus stage's two failures.
	if ops != 7 || strings.Join(stage, " ") != "failedprecondition=1 success=1 unknown=1" {
		t.Errorf("%d series; stage: %v", ops, stage)
	}
}
