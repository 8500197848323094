package framework

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/srvlab/rds-csi/pkg/rds/rdssim"
)

// FaultControl sends one request of the simulator's fault control
// protocol (pkg/rds/rdssim/faultcontrol.go) to socket, served by
// StartSim's simulator (Sim.FaultSocket) or by a separate rds-sim
// --fault-control=<socket>, and returns the answer after "ok". An
// "error: ..." answer is an error.
func FaultControl(ctx context.Context, socket, request string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return "", fmt.Errorf("fault control %s: %w", socket, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := fmt.Fprintln(c, request); err != nil {
		return "", fmt.Errorf("fault control %q: %w", request, err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("fault control %q: no answer: %w", request, err)
	}
	answer = strings.TrimSuffix(answer, "\n")
	if rest, ok := strings.CutPrefix(answer, "ok"); ok {
		return strings.TrimSpace(rest), nil
	}
	return "", fmt.Errorf("fault control %q: %s", request, answer)
}

// LateFault is a request that holds the RDS commands containing Match
// and lands them late: after Delay, or when released (Delay 0: only
// then), after the commands that ran meanwhile, even when the driver's
// command timeout gave up on them. Count of them (0: one; negative: every
// one until cleared).
func LateFault(match string, delay time.Duration, count int) string {
	f := rdssim.Fault{Kind: rdssim.FaultLate, Match: match, Delay: delay, Count: max(count, 1)}
	if count < 0 {
		f.Count = -1
	}
	return f.String()
}

// ArmFault sends a fault request (e.g. LateFault) to the simulator over
// its fault control socket, as a test would to a separate rds-sim.
func (s *Sim) ArmFault(ctx context.Context, tl *Timeline, request string) error {
	answer, err := FaultControl(ctx, s.FaultSocket, request)
	if err != nil {
		return err
	}
	tl.Logf("rds-sim fault control: %s -> %s", request, answer)
	return nil
}

// ReleaseLate lands every command a late fault holds, over the fault
// control socket, and returns how many once they have landed.
func (s *Sim) ReleaseLate(ctx context.Context, tl *Timeline) (int, error) {
	answer, err := FaultControl(ctx, s.FaultSocket, "release")
	if err != nil {
		return 0, err
	}
	tl.Logf("rds-sim fault control: release -> %s", answer)
	n, err := strconv.Atoi(strings.TrimPrefix(answer, "released="))
	if err != nil {
		return 0, fmt.Errorf("release: answer %q", answer)
	}
	return n, nil
}

// ClearFaults disarms every fault over the fault control socket.
func (s *Sim) ClearFaults(ctx context.Context) error {
	_, err := FaultControl(ctx, s.FaultSocket, "clear")
	return err
}

// FaultStatus is the simulator's "status" answer: faults armed and
// commands held by late faults.
func FaultStatus(ctx context.Context, socket string) (armed, held int, err error) {
	answer, err := FaultControl(ctx, socket, "status")
	if err != nil {
		return 0, 0, err
	}
	if _, err := fmt.Sscanf(answer, "armed=%d held=%d", &armed, &held); err != nil {
		return 0, 0, fmt.Errorf("status: answer %q", answer)
	}
	return armed, held, nil
}

// HeldAtLeast holds once the simulator holds at least n commands of a
// late fault.
func (s *Sim) HeldAtLeast(n int) Condition {
	return func(ctx context.Context) (bool, string, error) {
		armed, held, err := FaultStatus(ctx, s.FaultSocket)
		if err != nil {
			return false, err.Error(), nil
		}
		return held >= n, fmt.Sprintf("%d commands held, %d faults armed", held, armed), nil
	}
}

// LateCommands are the commands of the simulator's log that a late fault
// held (landed or not).
func (s *Sim) LateCommands() []rdssim.Command {
	var out []rdssim.Command
	for _, c := range s.Commands() {
		if c.Fault == rdssim.FaultLate {
			out = append(out, c)
		}
	}
	return out
}

// ExportChangesOf are the simulator's export changes of one disk, in the
// order they were made.
func (s *Sim) ExportChangesOf(slot string) []rdssim.ExportChange {
	var out []rdssim.ExportChange
	for _, c := range s.ExportLog() {
		if c.Slot == slot {
			out = append(out, c)
		}
	}
	return out
}
