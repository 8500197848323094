package framework

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

// The driver's controller identity when manifests/ is not there: the
// names manifests/base uses.
const (
	fallbackNamespace = "rds-csi"
	ControllerSA      = "rds-csi-controller"
)

// ManifestFiles are the files of manifests/base whose objects Deploy
// creates: what the controller Deployment would run under (the Deployment
// itself is replaced by processes started by the harness).
var ManifestFiles = []string{"namespace.yaml", "controller-rbac.yaml", "csidriver.yaml"}

// Deployment is the driver's identity in the cluster: namespace,
// ServiceAccount with its RBAC, the CSIDriver object, and a kubeconfig that
// authenticates as the ServiceAccount (a TokenRequest token), for the
// sidecars and the driver.
type Deployment struct {
	Namespace      string
	ServiceAccount string
	Kubeconfig     string
	FromManifests  bool // false: the harness's built-in RBAC (manifests/base missing)
}

// fallbackRules are used only when manifests/base is missing: what the
// controller's sidecars need.
var fallbackRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses", "csinodes", "volumeattributesclasses"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments"}, Verbs: []string{"get", "list", "watch", "patch"}},
	{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{"snapshot.storage.k8s.io"}, Resources: []string{"volumesnapshots"}, Verbs: []string{"get", "list", "watch", "update"}},
	{APIGroups: []string{"snapshot.storage.k8s.io"}, Resources: []string{"volumesnapshotclasses"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"snapshot.storage.k8s.io"}, Resources: []string{"volumesnapshotcontents"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
	{APIGroups: []string{"snapshot.storage.k8s.io"}, Resources: []string{"volumesnapshotcontents/status"}, Verbs: []string{"update", "patch"}},
}

func fallbackObjects() []runtime.Object {
	ns, name := fallbackNamespace, ControllerSA
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}
	return []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: fallbackRules},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
			Subjects:   subject,
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects:   subject,
		},
		&rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-heartbeats", Namespace: "kube-node-lease"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
				Verbs: []string{"get", "list", "watch"}}},
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-heartbeats", Namespace: "kube-node-lease"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name + "-heartbeats"},
			Subjects:   subject,
		},
		&storagev1.CSIDriver{
			ObjectMeta: metav1.ObjectMeta{Name: DriverName},
			Spec: storagev1.CSIDriverSpec{
				AttachRequired:       ptr.To(true),
				PodInfoOnMount:       ptr.To(false),
				VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
			},
		},
	}
}

// LoadManifests decodes the objects of ManifestFiles in root/manifests/base.
// It returns (nil, nil) when that directory does not exist.
func LoadManifests(root string) ([]runtime.Object, error) {
	base := filepath.Join(root, "manifests", "base")
	if _, err := os.Stat(base); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var objs []runtime.Object
	for _, name := range ManifestFiles {
		o, err := decodeFile(filepath.Join(base, name))
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// DeployFile creates the objects of a manifest file under the repository
// root (for example the storage-fencing component's RBAC), as an operator
// applying that component would.
func DeployFile(ctx context.Context, tb testing.TB, tl *Timeline, cp *ControlPlane, rel string) {
	tb.Helper()
	objs, err := decodeFile(filepath.Join(cp.Root, rel))
	if err != nil {
		tb.Fatalf("%s: %v", rel, err)
	}
	for _, obj := range objs {
		what, err := createObject(ctx, cp.Client, obj)
		if err != nil {
			tb.Fatalf("create %s: %v", what, err)
		}
		tl.Logf("created %s (%s)", what, rel)
	}
}

// decodeFile decodes the built-in-kind objects of a multi-document YAML file.
func decodeFile(path string) ([]runtime.Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	decoder := scheme.Codecs.UniversalDeserializer()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		if err != nil {
			if runtime.IsMissingKind(err) {
				continue // a document of only comments
			}
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		objs = append(objs, obj)
	}
}

// createObject creates one object of the kinds ManifestFiles hold.
func createObject(ctx context.Context, c kubernetes.Interface, obj runtime.Object) (string, error) {
	o := metav1.CreateOptions{}
	var err error
	switch x := obj.(type) {
	case *corev1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, x, o)
		return "Namespace " + x.Name, err
	case *corev1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(x.Namespace).Create(ctx, x, o)
		return "ServiceAccount " + x.Namespace + "/" + x.Name, err
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, x, o)
		return "ClusterRole " + x.Name, err
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, x, o)
		return "ClusterRoleBinding " + x.Name, err
	case *rbacv1.Role:
		_, err = c.RbacV1().Roles(x.Namespace).Create(ctx, x, o)
		return "Role " + x.Namespace + "/" + x.Name, err
	case *rbacv1.RoleBinding:
		_, err = c.RbacV1().RoleBindings(x.Namespace).Create(ctx, x, o)
		return "RoleBinding " + x.Namespace + "/" + x.Name, err
	case *storagev1.CSIDriver:
		_, err = c.StorageV1().CSIDrivers().Create(ctx, x, o)
		return "CSIDriver " + x.Name, err
	case *admissionregistrationv1.ValidatingAdmissionPolicy:
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, x, o)
		return "ValidatingAdmissionPolicy " + x.Name, err
	case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
		_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, x, o)
		return "ValidatingAdmissionPolicyBinding " + x.Name, err
	}
	return fmt.Sprintf("%T", obj), fmt.Errorf("the harness does not create %T objects", obj)
}

// Deploy creates the driver's namespace, controller ServiceAccount, RBAC
// and CSIDriver from manifests/base (so e2e proves the shipped RBAC is
// enough for the sidecars), and writes dir/controller.kubeconfig that
// authenticates as that ServiceAccount.
func Deploy(ctx context.Context, tb testing.TB, tl *Timeline, cp *ControlPlane, dir string) *Deployment {
	tb.Helper()
	done := tl.Step("create the driver's namespace, ServiceAccount, RBAC and CSIDriver")
	objs, err := LoadManifests(cp.Root)
	if err != nil {
		tb.Fatalf("manifests/base: %v", err)
	}
	dep := &Deployment{FromManifests: objs != nil}
	if objs == nil {
		tl.Logf("manifests/base not found: using the harness's built-in RBAC")
		objs = fallbackObjects()
	}
	for _, obj := range objs {
		if sa, ok := obj.(*corev1.ServiceAccount); ok && sa.Name == ControllerSA {
			dep.Namespace, dep.ServiceAccount = sa.Namespace, sa.Name
		}
		what, err := createObject(ctx, cp.Client, obj)
		if err != nil {
			tb.Fatalf("create %s: %v", what, err)
		}
		tl.Logf("created %s", what)
	}
	if dep.ServiceAccount == "" {
		tb.Fatalf("no ServiceAccount %s in %v", ControllerSA, ManifestFiles)
	}
	tok, err := cp.Client.CoreV1().ServiceAccounts(dep.Namespace).CreateToken(ctx, dep.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64((6 * time.Hour).Seconds()))},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("token for %s/%s: %v", dep.Namespace, dep.ServiceAccount, err)
	}
	dep.Kubeconfig = filepath.Join(dir, "controller.kubeconfig")
	tb.Cleanup(func() { _ = os.Remove(dep.Kubeconfig) }) // a bearer token
	if err := writeTokenKubeconfig(dep.Kubeconfig, cp, "system:serviceaccount:"+dep.Namespace+":"+dep.ServiceAccount, tok.Status.Token); err != nil {
		tb.Fatal(err)
	}
	done()
	return dep
}

func writeTokenKubeconfig(path string, cp *ControlPlane, user, token string) error {
	ca, err := os.ReadFile(cp.Env["KUBE_CA_FILE"])
	if err != nil {
		return err
	}
	// JSON is YAML: no YAML library needed, and %q quotes safely.
	data := fmt.Sprintf(`{"apiVersion": "v1", "kind": "Config",
 "clusters": [{"name": "e2e", "cluster": {"server": %q, "certificate-authority-data": %q}}],
 "users": [{"name": %q, "user": {"token": %q}}],
 "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": %q}}],
 "current-context": "e2e"}
`, cp.Env["KUBE_APISERVER_URL"], base64.StdEncoding.EncodeToString(ca), user, token, user)
	return os.WriteFile(path, []byte(data), 0o600)
}
