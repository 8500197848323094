package framework

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// DriverLease is the Lease of the driver's controller leader election
// (cmd/rds-csi-driver: the driver name with dots as dashes, "-controller").
var DriverLease = strings.NewReplacer(".", "-", "/", "-").Replace(DriverName) + "-controller"

// Leases of the kubernetes-csi sidecars (csi-lib-utils: the lock name with
// every character that is not alphanumeric as a dash).
var (
	ProvisionerLease = sidecarLease(DriverName)
	AttacherLease    = sidecarLease("external-attacher-leader-" + DriverName)
)

func sidecarLease(name string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
}

// LeaderElectionTimings are --leader-election-lease-duration,
// -renew-deadline and -retry-period, for the driver and the sidecars alike.
type LeaderElectionTimings struct {
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// FastLeaderElection keeps a failover short enough for a test: a dead
// leader's Lease is taken over within about LeaseDuration+RetryPeriod.
var FastLeaderElection = LeaderElectionTimings{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: time.Second}

// Args are the flags, the same for the driver and the kubernetes-csi sidecars.
func (l LeaderElectionTimings) Args() []string {
	return []string{
		"--leader-election-lease-duration=" + l.LeaseDuration.String(),
		"--leader-election-renew-deadline=" + l.RenewDeadline.String(),
		"--leader-election-retry-period=" + l.RetryPeriod.String(),
	}
}

// Replica is one controller replica, as one pod of the controller
// Deployment runs it: the driver with csi-provisioner and csi-attacher on
// its socket, all in one UTS namespace whose host name is the replica's
// name (every leader election identifies a candidate by host name), and
// the driver's /healthz, /readyz and /metrics on a loopback port.
type Replica struct {
	Name        string
	Driver      *Driver
	Provisioner *Process
	Attacher    *Process
	HTTPAddr    string // host:port of the driver's --http-endpoint
	opts        ReplicaOptions
}

// ReplicaOptions configure StartReplica.
type ReplicaOptions struct {
	Name           string // host name and suffix of the process names
	LeaderElection LeaderElectionTimings
	DriverArgs     []string
	SidecarArgs    []string // for both sidecars
	NoProvisioner  bool
	// DriverBin runs this driver binary (another release's: BuildRelease)
	// instead of BuildDriver's.
	DriverBin string
}

// StartReplica starts a replica against sim under dep's ServiceAccount and
// waits until its driver answers Probe with ready. Its processes are
// stopped in e.T's cleanup; Kill or Stop them earlier to crash or restart
// the replica.
func (e *Env) StartReplica(sim *Sim, dep *Deployment, opts ReplicaOptions) *Replica {
	e.T.Helper()
	done := e.TL.Step("start controller replica " + opts.Name)
	port, err := FreePort()
	if err != nil {
		e.T.Fatal(err)
	}
	r := &Replica{Name: opts.Name, HTTPAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), opts: opts}
	le := opts.LeaderElection.Args()
	driverArgs := append(append([]string{"--http-endpoint=" + r.HTTPAddr}, le...), opts.DriverArgs...)
	bin := opts.DriverBin
	if bin == "" {
		bin = BuildDriver(e.T, e.TL, e.Root)
	}
	r.Driver = StartDriver(e.T, e.TL, bin, e.Dir, sim, dep, DriverOptions{
		Name: "rds-csi-driver-" + opts.Name, Hostname: opts.Name, ExtraArgs: driverArgs,
	})
	sidecarArgs := append(append([]string{}, le...), opts.SidecarArgs...)
	if !opts.NoProvisioner {
		r.Provisioner = StartProvisioner(e.T, e.TL, e.Root, e.Dir, r.Driver, dep, SidecarOptions{
			Name: "csi-provisioner-" + opts.Name, Hostname: opts.Name, ExtraArgs: sidecarArgs,
		})
	}
	r.Attacher = StartAttacher(e.T, e.TL, e.Root, e.Dir, r.Driver, dep, SidecarOptions{
		Name: "csi-attacher-" + opts.Name, Hostname: opts.Name, ExtraArgs: sidecarArgs,
	})
	done()
	return r
}

// Restart stops the replica (sidecars first, then the driver, each with
// SIGTERM: a rolling update of the pod) and starts it again with the same
// options; the driver's HTTP endpoint moves to a new port.
func (r *Replica) Restart(e *Env, sim *Sim, dep *Deployment) *Replica {
	e.T.Helper()
	if err := r.Stop(); err != nil {
		e.T.Fatal(err)
	}
	return e.StartReplica(sim, dep, r.opts)
}

// Stop ends the replica's processes with SIGTERM, sidecars first.
func (r *Replica) Stop() error {
	for _, p := range []*Process{r.Attacher, r.Provisioner, r.Driver.Process} {
		if p == nil {
			continue
		}
		if err := p.Stop(15 * time.Second); err != nil {
			return err
		}
	}
	return nil
}

// Processes are the replica's running parts: the driver and its sidecars.
func (r *Replica) Processes() []*Process {
	var out []*Process
	for _, p := range []*Process{r.Driver.Process, r.Provisioner, r.Attacher} {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// Pause freezes the whole replica (SIGSTOP to the driver and both
// sidecars, as a frozen pod): its leases expire, its calls in flight stay
// in flight, its connections stay open.
func (r *Replica) Pause() error {
	for _, p := range r.Processes() {
		if err := p.Pause(); err != nil {
			return err
		}
	}
	return nil
}

// Resume continues every paused process of the replica (SIGCONT).
func (r *Replica) Resume() error {
	for _, p := range r.Processes() {
		if err := p.Resume(); err != nil {
			return err
		}
	}
	return nil
}

// Metric scrapes the driver's /metrics and returns the value of the sample
// whose name (with labels, as exposed) is series, e.g. "rds_csi_leader".
func (r *Replica) Metric(ctx context.Context, series string) (float64, error) {
	return ScrapeMetric(ctx, "http://"+r.HTTPAddr+"/metrics", series)
}

// ScrapeMetric reads one sample from a Prometheus text exposition.
func ScrapeMetric(ctx context.Context, url, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || name != series {
			continue
		}
		// An optional timestamp may follow the value.
		value, _, _ = strings.Cut(value, " ")
		return strconv.ParseFloat(value, 64)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no series %s at %s", series, url)
}

// MetricEquals holds once the replica's metric series has value want.
func (r *Replica) MetricEquals(series string, want float64) Condition {
	return func(ctx context.Context) (bool, string, error) {
		v, err := r.Metric(ctx, series)
		if err != nil {
			return false, err.Error(), nil
		}
		return v == want, fmt.Sprintf("%s %s = %g", r.Name, series, v), nil
	}
}

// GetLease reads a Lease.
func GetLease(ctx context.Context, c kubernetes.Interface, ns, name string) (*coordinationv1.Lease, error) {
	return c.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
}

// LeaseHolder is the Lease's holderIdentity ("" when none).
func LeaseHolder(ctx context.Context, c kubernetes.Interface, ns, name string) (string, error) {
	l, err := GetLease(ctx, c, ns, name)
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// HolderIs reports whether a holder identity belongs to the replica: the
// driver's identity is "<host>_<pid>", a sidecar's is the host name.
func HolderIs(holder, replica string) bool {
	return holder == replica || strings.HasPrefix(holder, replica+"_")
}

// LeasesHeldBy holds once every Lease in ns is held by replica and there
// are at least min of them (the driver's and each sidecar's).
func LeasesHeldBy(c kubernetes.Interface, ns, replica string, min int) Condition {
	return func(ctx context.Context) (bool, string, error) {
		list, err := c.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		var seen []string
		held := 0
		for _, l := range list.Items {
			h := ""
			if l.Spec.HolderIdentity != nil {
				h = *l.Spec.HolderIdentity
			}
			seen = append(seen, l.Name+"="+h)
			if HolderIs(h, replica) {
				held++
			}
		}
		return held == len(list.Items) && held >= min, strings.Join(seen, ", "), nil
	}
}

// LeaseHeldBy holds once every named Lease is held by replica.
func LeaseHeldBy(c kubernetes.Interface, ns, replica string, names ...string) Condition {
	return func(ctx context.Context) (bool, string, error) {
		var seen []string
		ok := true
		for _, name := range names {
			h, err := LeaseHolder(ctx, c, ns, name)
			if err != nil {
				return false, err.Error(), nil
			}
			seen = append(seen, name+"="+h)
			ok = ok && HolderIs(h, replica)
		}
		return ok, strings.Join(seen, ", "), nil
	}
}

// Controller dials the driver's CSI Controller service; close the
// connection when done.
func (d *Driver) Controller() (csipb.ControllerClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return csipb.NewControllerClient(conn), conn, nil
}
