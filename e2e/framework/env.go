package framework

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestNamespace is where scenarios create their claims and pods.
const TestNamespace = "e2e"

// Env is one scenario's world: its own control plane, artifact directory
// and timeline. Components started through it are stopped in t.Cleanup.
type Env struct {
	T      testing.TB
	Ctx    context.Context // ends when the test ends, before its cleanups
	Root   string          // repository
	Dir    string          // artifact directory of this test
	TL     *Timeline
	CP     *ControlPlane
	Client kubernetes.Interface // admin
}

// EnvOptions configure NewEnv.
type EnvOptions struct {
	ControlPlane ControlPlaneOptions
	// QuietObjects leaves object changes off the timeline (scale tests
	// create tens of thousands of objects).
	QuietObjects bool
}

// NewEnv builds what is missing (EnsureBinaries), starts a control plane
// for this test, logs object changes on the timeline, and creates
// TestNamespace.
func NewEnv(t testing.TB, opts EnvOptions) *Env {
	t.Helper()
	root := EnsureBinaries(t)
	dir := newArtifactDir(t, root)
	tl := NewTimeline(t, dir)
	cp := StartControlPlane(t, tl, root, filepath.Join(dir, "controlplane"), opts.ControlPlane)
	e := &Env{T: t, Ctx: t.Context(), Root: root, Dir: dir, TL: tl, CP: cp, Client: cp.Client}
	if !opts.QuietObjects {
		if err := WatchObjects(e.Ctx, tl, cp.Client); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cp.Client.CoreV1().Namespaces().Create(e.Ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: TestNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// StartSim starts the RDS simulator with its pool in the artifact directory.
func (e *Env) StartSim(opts SimOptions) *Sim {
	e.T.Helper()
	return StartSim(e.T, e.TL, e.Dir, opts)
}

// Controller is the driver's controller deployment as it runs in a
// cluster: the driver binary and its sidecars under the driver's
// ServiceAccount.
type Controller struct {
	Deployment  *Deployment
	Driver      *Driver
	Provisioner *Process
	Attacher    *Process
}

// ControllerOptions configure StartController.
type ControllerOptions struct {
	DriverArgs      []string
	ProvisionerArgs []string
	AttacherArgs    []string
	NoAttacher      bool
	// Plain: the driver built without the race detector, for a
	// measurement (the race detector makes its code several times slower).
	Plain bool
}

// StartController creates the driver's RBAC and CSIDriver, builds and
// starts the driver against sim, then csi-provisioner and csi-attacher on
// its socket.
func (e *Env) StartController(sim *Sim, opts ControllerOptions) *Controller {
	e.T.Helper()
	done := e.TL.Step("start the controller: driver, csi-provisioner, csi-attacher")
	dep := Deploy(e.Ctx, e.T, e.TL, e.CP, e.Dir)
	var bin string
	if opts.Plain {
		bin = BuildPlainDriver(e.T, e.TL, e.Root)
	} else {
		bin = BuildDriver(e.T, e.TL, e.Root)
	}
	d := StartDriver(e.T, e.TL, bin, e.Dir, sim, dep, DriverOptions{ExtraArgs: opts.DriverArgs})
	c := &Controller{Deployment: dep, Driver: d}
	c.Provisioner = StartProvisioner(e.T, e.TL, e.Root, e.Dir, d, dep, SidecarOptions{ExtraArgs: opts.ProvisionerArgs})
	if !opts.NoAttacher {
		c.Attacher = StartAttacher(e.T, e.TL, e.Root, e.Dir, d, dep, SidecarOptions{ExtraArgs: opts.AttacherArgs})
	}
	done()
	return c
}

// NewNode registers a fake kubelet whose Lease renewals last until it
// fails or the test ends.
func (e *Env) NewNode(name string) *FakeKubelet {
	e.T.Helper()
	return e.NewNodeWith(name, FastCadence)
}

// NewNodeWith is NewNode with the kubelet's cadence.
func (e *Env) NewNodeWith(name string, cadence KubeletCadence) *FakeKubelet {
	e.T.Helper()
	k, err := NewNodeWith(e.Ctx, e.TL, e.Client, name, cadence)
	if err != nil {
		e.T.Fatal(err)
	}
	return k
}
