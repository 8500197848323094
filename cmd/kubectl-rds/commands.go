package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/srvlab/rds-csi/pkg/diagnose"
)

// why explains kind/name; run has checked both and put a namespace given
// as NAMESPACE/NAME into g.
func why(ctx context.Context, cl clients, g globalOptions, kind, name string, stdout, stderr io.Writer) int {
	c, ns, err := gatherFor(ctx, cl, g, kind, name)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl rds why: %v\n", err)
		return exitError
	}
	ex := diagnose.Why(c, kind, ns, name)
	if g.output == "json" {
		return writeJSON(stdout, stderr, ex, exitOK)
	}
	printExplanation(stdout, c.Now, ex)
	return exitOK
}

func check(ctx context.Context, cl clients, g globalOptions, stdout, stderr io.Writer) int {
	c, err := gatherAll(ctx, cl, g)
	if err == nil {
		err = driverInUse(ctx, cl, c)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kubectl rds check: %v\n", err)
		return exitError
	}
	r := diagnose.Check(c)
	code := exitOK
	if !r.OK {
		code = exitFindings
	}
	if g.output == "json" {
		return writeJSON(stdout, stderr, r, code)
	}
	printReport(stdout, r)
	return code
}

// driverInUse refuses an audit of a driver the cluster does not know: a
// misspelt --driver matches no PV, and "OK: nothing wrong" would then be
// about nothing. A driver is known by a PV or VolumeAttachment that names
// it or, before its first volume, by its CSIDriver object.
func driverInUse(ctx context.Context, cl clients, c *diagnose.Cluster) error {
	others := map[string]bool{}
	for _, pv := range c.PVs {
		if pv.Spec.CSI != nil {
			if pv.Spec.CSI.Driver == c.DriverName {
				return nil
			}
			others[pv.Spec.CSI.Driver] = true
		}
	}
	for _, va := range c.Attachments {
		if va.Spec.Attacher == c.DriverName {
			return nil
		}
		others[va.Spec.Attacher] = true
	}
	_, err := cl.kube.StorageV1().CSIDrivers().Get(ctx, c.DriverName, metav1.GetOptions{})
	if err == nil {
		return nil
	}
	seen := "no CSI volumes at all"
	if len(others) > 0 {
		seen = "volumes of " + strings.Join(slices.Sorted(maps.Keys(others)), ", ") + " only"
	}
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("driver %s is not installed here (no CSIDriver %s) and no PV or VolumeAttachment names it (the cluster has %s): check --driver (kubectl get csidrivers)", c.DriverName, c.DriverName, seen)
	}
	return fmt.Errorf("no PV or VolumeAttachment names driver %s (the cluster has %s), and its CSIDriver could not be read (%v): check --driver (kubectl get csidrivers)", c.DriverName, seen, err)
}

func release(ctx context.Context, cl clients, g globalOptions, pvName, node string, yes bool, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "kubectl rds release: %v\n", err)
		return exitError
	}
	c := &diagnose.Cluster{Now: time.Now(), DriverName: g.driver}
	pv, err := cl.kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		return fail(fmt.Errorf("reading PV %s: %w", pvName, err))
	}
	c.PVs = []corev1.PersistentVolume{*pv}
	if err := gatherAttachmentsAndNodes(ctx, cl, c); err != nil {
		return fail(err)
	}
	plan, err := diagnose.PlanRelease(c, pvName, node)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "PV %s: node %s has claimed it since %s and has no VolumeAttachment for it; %s.\n",
		pvName, node, plan.Claim.At.UTC().Format(time.RFC3339), plan.NodeState)
	fmt.Fprintf(stdout, "Releasing the claim lets another node attach the volume. If %s still writes to it, data is lost.\n", node)
	if !yes {
		fmt.Fprintf(stdout, "Release the claim of %s on %s? [y/N] ", node, pvName)
		answer, _ := bufio.NewReader(stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			fmt.Fprintln(stdout, "Nothing changed.")
			return exitError
		}
	}
	updated, err := cl.kube.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, plan.Patch, metav1.PatchOptions{})
	if apierrors.IsConflict(err) {
		return fail(fmt.Errorf("PV %s changed since it was checked (resourceVersion %s); nothing was released: run the command again to check the new state", pvName, plan.ResourceVersion))
	}
	if err != nil {
		return fail(fmt.Errorf("removing the claim of %s from PV %s: %w", node, pvName, err))
	}
	who := whoAmI(ctx, cl)
	if err := recordRelease(ctx, cl, updated, node, plan, who); err != nil {
		fmt.Fprintf(stderr, "kubectl rds release: the claim is released, but recording the event on PV %s failed: %v\n", pvName, err)
	}
	fmt.Fprintf(stdout, "Released: node %s no longer claims PV %s (remaining claims: %s). Event ClaimReleased recorded on the PV.\n",
		node, pvName, orNone(strings.Join(plan.Remaining, ", ")))
	return exitOK
}

// whoAmI names the caller for the event; the API server's audit log has
// the authoritative record.
func whoAmI(ctx context.Context, cl clients) string {
	r, err := cl.kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil || r.Status.UserInfo.Username == "" {
		return "an unknown user"
	}
	return r.Status.UserInfo.Username
}

// recordRelease records a Warning event on the PV: a claim dropped by hand
// is an operator's decision that the driver's safety relied on.
func recordRelease(ctx context.Context, cl clients, pv *corev1.PersistentVolume, node string, plan diagnose.ReleasePlan, who string) error {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pv.Name + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "PersistentVolume", APIVersion: "v1", Name: pv.Name, UID: pv.UID,
			ResourceVersion: pv.ResourceVersion},
		Reason: "ClaimReleased",
		Message: fmt.Sprintf("claim of node %s (since %s) released by hand with kubectl rds release by %s; the node had no VolumeAttachment and %s",
			node, plan.Claim.At.UTC().Format(time.RFC3339), who, plan.NodeState),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: "kubectl-rds"},
		ReportingController: "kubectl-rds",
		ReportingInstance:   who,
		Action:              "Release",
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
	}
	_, err := cl.kube.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

func writeJSON(stdout, stderr io.Writer, v any, code int) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "kubectl rds: %v\n", err)
		return exitError
	}
	return code
}

func printExplanation(w io.Writer, now time.Time, ex diagnose.Explanation) {
	for i, s := range ex.Stories {
		if i > 0 {
			fmt.Fprintln(w)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if s.Pod != "" {
			fmt.Fprintf(tw, "Pod\t%s\ton %s\n", s.Pod, orNone(s.WantNode))
		}
		if s.PVC != "" {
			fmt.Fprintf(tw, "PVC\t%s\t%s\n", s.PVC, orNone(s.PVCPhase))
		}
		if s.PV != "" {
			fmt.Fprintf(tw, "PV\t%s\t%s, volume %s\n", s.PV, orNone(s.AccessModes), orNone(s.Handle))
		}
		if len(s.Users) > 0 {
			fmt.Fprintf(tw, "used by\t%s\t\n", strings.Join(s.Users, ", "))
		}
		for _, a := range s.Attachments {
			state := "not attached"
			if a.Attached {
				state = "attached"
			}
			if a.Deleting {
				state += ", being deleted"
			}
			if a.Error != "" {
				state += ": " + a.Error
			}
			fmt.Fprintf(tw, "VolumeAttachment\t%s\t%s %s\n", a.Name, a.Node, state)
		}
		for _, n := range s.Nodes {
			fmt.Fprintf(tw, "Node\t%s\t%s\n", n.Name, nodeState(now, n))
		}
		for _, c := range s.Claims {
			va := "no VolumeAttachment"
			if c.Attachment != "" {
				va = "VolumeAttachment " + c.Attachment
			}
			uid := ""
			if c.UID != "" {
				uid = ", node UID " + c.UID
			}
			fmt.Fprintf(tw, "claim\t%s\tsince %s (%s ago)%s, %s\n", c.Node, c.At.UTC().Format("15:04:05Z"), diagnose.Ago(now.Sub(c.At)), uid, va)
		}
		switch {
		case s.Disk != nil:
			d := s.Disk
			export := "not exported"
			if d.Exported {
				export = fmt.Sprintf("exported on port %d as %s, allowed host %s", d.Port, d.NQN, orAny(d.AllowHost))
			}
			on := ""
			if d.RDS != "" {
				on = "on RDS " + d.RDS + ", "
			}
			fmt.Fprintf(tw, "disk\t%s\t%s%d bytes, %s, %s\n", d.Slot, on, d.SizeBytes, d.File, export)
		case s.Handle != "" && s.DiskNote != "":
			fmt.Fprintf(tw, "disk\t%s\tnot checked: %s\n", s.Handle, s.DiskNote)
		case s.Handle != "" && s.Box != "":
			fmt.Fprintf(tw, "disk\t%s\tNOT ON RDS %s\n", s.Handle, s.Box)
		case s.Handle != "":
			fmt.Fprintf(tw, "disk\t%s\tNOT ON THE RDS\n", s.Handle)
		}
		tw.Flush()
		fmt.Fprintf(w, "\nVerdict (%s): %s.\nNext: %s\n", s.Verdict.Code, s.Verdict.Summary, s.Verdict.Next)
	}
}

func nodeState(now time.Time, n diagnose.NodeFact) string {
	if !n.Exists {
		return "does not exist"
	}
	ready := "Ready"
	if n.Ready != "True" {
		ready = "NotReady (" + n.Ready + ")"
	}
	s := fmt.Sprintf("%s since %s (%s ago)", ready, n.ReadySince.UTC().Format("15:04:05Z"), diagnose.Ago(now.Sub(n.ReadySince)))
	if len(n.Taints) > 0 {
		s += ", taints " + strings.Join(n.Taints, " ")
	}
	return s
}

func printReport(w io.Writer, r diagnose.Report) {
	fmt.Fprintf(w, "checked %d PVs, %d VolumeAttachments, %d Nodes, %d disks, %d VolumeSnapshotContents\n",
		r.Checked.PVs, r.Checked.Attachments, r.Checked.Nodes, r.Checked.Disks, r.Checked.Snapshots)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range []string{diagnose.FindingMultiHeld, diagnose.FindingClaimWithoutVA, diagnose.FindingVAToMissingNode,
		diagnose.FindingOrphanDisk, diagnose.FindingMissingDisk, diagnose.FindingOrphanSnapshot, diagnose.FindingClaimsUnreadable, diagnose.FindingRetiringUnreadable, diagnose.FindingExportMismatch} {
		fmt.Fprintf(tw, "  %s\t%d\n", k, r.Counts[k])
	}
	tw.Flush()
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "not checked: %s\n", s)
	}
	for _, f := range r.Findings {
		fmt.Fprintf(w, "\n%s %s: %s\n  next: %s\n", f.Kind, f.Object, f.Message, f.Next)
	}
	if r.OK {
		fmt.Fprintln(w, "\nOK: nothing wrong.")
	} else {
		fmt.Fprintf(w, "\n%d problem(s).\n", len(r.Findings))
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orAny(s string) string {
	if s == "" {
		return "any"
	}
	return s
}
