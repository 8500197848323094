package manifests

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/srvlab/rds-csi/pkg/nodelease"
)

// nodeHeartbeat checks what the storage-fencing component gives the node
// plugin for its own Lease (byKey: the component on top of the base): the
// --node-lease flag, an API token in the plugin's container alone, and
// nothing but get, create and update of Leases in its namespace; and the
// admission policy that keeps each node plugin to its own node's Lease.
func nodeHeartbeat(t *testing.T, byKey map[string]object) {
	t.Helper()
	ds, ok := byKey["DaemonSet/"+namespace+"/"+nodeName]
	if !ok {
		t.Fatal("no node DaemonSet")
	}
	spec := ds.obj.(*appsv1.DaemonSet).Spec.Template.Spec
	if tok := spec.AutomountServiceAccountToken; tok == nil || *tok {
		t.Error("the node pods mount a ServiceAccount token in every container; only the plugin's needs one")
	}
	token := ""
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				token = v.Name
			}
		}
	}
	if token == "" {
		t.Fatal("no projected ServiceAccount token volume for the node plugin's Lease")
	}
	for _, c := range spec.Containers {
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == token && m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount" && m.ReadOnly
		})
		if c.Name == pluginName {
			if !mounted || !slices.Contains(c.Args, "--node-lease") {
				t.Errorf("the plugin container: token mounted read-only where client-go looks %t, args %v; want both, with --node-lease", mounted, c.Args)
			}
		} else if slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == token }) {
			t.Errorf("container %s mounts the node plugin's API token", c.Name)
		}
	}

	role, ok := byKey["Role/"+namespace+"/rds-csi-node-heartbeat"]
	if !ok {
		t.Fatal("no Role rds-csi-node-heartbeat")
	}
	rules := role.obj.(*rbacv1.Role).Rules
	if len(rules) != 1 || !slices.Equal(rules[0].APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(rules[0].Resources, []string{"leases"}) ||
		!slices.Equal(slices.Sorted(slices.Values(rules[0].Verbs)), []string{"create", "get", "update"}) {
		t.Errorf("the node plugin's Role grants %+v; want get, create and update of leases alone", rules)
	}
	rb, ok := byKey["RoleBinding/"+namespace+"/rds-csi-node-heartbeat"]
	if !ok {
		t.Fatal("no RoleBinding rds-csi-node-heartbeat")
	}
	b := rb.obj.(*rbacv1.RoleBinding)
	if b.RoleRef.Name != "rds-csi-node-heartbeat" || len(b.Subjects) != 1 || b.Subjects[0].Name != nodeName || b.Subjects[0].Namespace != namespace {
		t.Errorf("the node plugin's RoleBinding binds %+v to %+v; want the Role to %s/%s alone", b.RoleRef, b.Subjects, namespace, nodeName)
	}
	// Nothing else is granted to the node plugin.
	for key, o := range byKey {
		var subjects []rbacv1.Subject
		switch x := o.obj.(type) {
		case *rbacv1.RoleBinding:
			subjects = x.Subjects
		case *rbacv1.ClusterRoleBinding:
			subjects = x.Subjects
		}
		if key != "RoleBinding/"+namespace+"/rds-csi-node-heartbeat" && slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool { return s.Name == nodeName }) {
			t.Errorf("%s grants the node plugin more", key)
		}
	}

	pol, ok := byKey["ValidatingAdmissionPolicy//rds-csi-node-lease"]
	if !ok {
		t.Fatal("no ValidatingAdmissionPolicy rds-csi-node-lease")
	}
	p := pol.obj.(*admissionregistrationv1.ValidatingAdmissionPolicy)
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionregistrationv1.Fail || len(p.Spec.Validations) != 1 ||
		!strings.Contains(p.Spec.Validations[0].Expression, "'"+nodelease.Prefix+"' + request.userInfo.extra['authentication.kubernetes.io/node-name'][0]") {
		t.Errorf("the node Lease policy: failurePolicy %v, validations %+v; want Fail, the Lease named %s<node of the token>", p.Spec.FailurePolicy, p.Spec.Validations, nodelease.Prefix)
	}
	pb, ok := byKey["ValidatingAdmissionPolicyBinding//rds-csi-node-lease"]
	if !ok {
		t.Fatal("no ValidatingAdmissionPolicyBinding rds-csi-node-lease")
	}
	if x := pb.obj.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding); x.Spec.PolicyName != p.Name || !slices.Equal(x.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("the node Lease policy's binding: %+v; want Deny of %s", x.Spec, p.Name)
	}
}
