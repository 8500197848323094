package manifests

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The driver's Go runtime gets a soft memory limit (GOMEMLIMIT) below its
// container's memory limit, through the downward API, so that it follows
// whatever limit an overlay or the chart's values set: for the shipped
// limits and others, GOMEMLIMIT expands (as the kubelet does it) to a byte
// count the runtime accepts, with 3-10 % of the limit left for memory the
// runtime does not count.
func TestGoMemLimitUnderTheContainerLimit(t *testing.T) {
	s := load(t)
	specs := map[string]*corev1.PodSpec{
		"controller": &mustGet[*appsv1.Deployment](t, s, "Deployment", namespace, controllerName).Spec.Template.Spec,
		"node":       &mustGet[*appsv1.DaemonSet](t, s, "DaemonSet", namespace, nodeName).Spec.Template.Spec,
	}
	for which, spec := range specs {
		shipped := container(t, spec, pluginName)
		if shipped.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: the driver has no memory limit; GOMEMLIMIT would follow the node's allocatable memory", which)
			continue
		}
		for _, limit := range []string{shipped.Resources.Limits.Memory().String(), "300Mi", "1Gi", "1500M", "6Gi"} {
			c := shipped.DeepCopy()
			c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse(limit)
			vars := env(t, s, c)
			raw, ok := vars["GOMEMLIMIT"]
			if !ok {
				t.Errorf("%s: the driver container sets no GOMEMLIMIT", which)
				break
			}
			value := varRef.ReplaceAllStringFunc(raw, func(m string) string {
				v, ok := vars[varRef.FindStringSubmatch(m)[1]]
				if !ok {
					t.Errorf("%s: GOMEMLIMIT=%q uses %s, which is not defined before it", which, raw, m)
				}
				return v
			})
			got, err := goByteCount(value)
			if err != nil {
				t.Errorf("%s, limit %s: GOMEMLIMIT=%q: %v", which, limit, value, err)
				continue
			}
			lim := c.Resources.Limits.Memory().Value()
			if share := float64(got) / float64(lim); share < 0.90 || share > 0.97 {
				t.Errorf("%s, limit %s (%d bytes): GOMEMLIMIT=%s is %.1f %% of it, want 90-97 %%", which, limit, lim, value, 100*share)
			}
		}
	}
}

// resourceFieldValue is what the kubelet puts in an env var from a
// container's resource (the downward API): the quantity divided by the
// divisor, rounded up (as k8s.io/kubernetes/pkg/api/v1/resource does).
func resourceFieldValue(t *testing.T, c *corev1.Container, ref *corev1.ResourceFieldSelector) string {
	t.Helper()
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		t.Errorf("container %s: resourceFieldRef names container %q, not its own", c.Name, ref.ContainerName)
	}
	var q resource.Quantity
	switch ref.Resource {
	case "limits.memory":
		q = *c.Resources.Limits.Memory()
	case "requests.memory":
		q = *c.Resources.Requests.Memory()
	default:
		t.Errorf("container %s: unexpected resourceFieldRef %s", c.Name, ref.Resource)
		return ""
	}
	divisor := int64(1)
	if !ref.Divisor.IsZero() {
		divisor = ref.Divisor.Value()
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor))), 10)
}

// goByteCount parses GOMEMLIMIT as the Go runtime does: a count of bytes
// with an optional B, KiB, MiB, GiB or TiB (anything else stops the
// runtime at start).
func goByteCount(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}
	shift := uint(0)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, shift = n, u.shift
			break
		}
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("not a byte count the Go runtime accepts")
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a byte count the Go runtime accepts: %w", err)
	}
	return n << shift, nil
}
