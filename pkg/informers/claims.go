package informers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// ClaimsAnnotation on a PersistentVolume records the nodes this driver has
// published the volume to: {"node-a":"2026-11-22T10:00:00Z"}. Every change
// is a merge patch carrying the resourceVersion the change was computed
// from, which the API server enforces like a conditional update: two
// controller replicas deciding at once cannot both commit.
const ClaimsAnnotation = "rds.csi.srvlab.io/claims"

// ErrConflict: the PV changed since the decision was made; the caller
// answers ABORTED and the CO retries against the fresh state.
var ErrConflict = errors.New("the volume's claims changed concurrently")

// decodeClaims reads the annotation. An unreadable annotation is an error:
// the caller must not treat a corrupted claim as no claim.
func decodeClaims(annotations map[string]string) (map[string]time.Time, error) {
	raw, ok := annotations[ClaimsAnnotation]
	if !ok || raw == "" {
		return nil, nil
	}
	var m map[string]time.Time
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", ClaimsAnnotation, err)
	}
	return m, nil
}

// Claims commits and releases claims on PersistentVolumes.
type Claims struct {
	client kubernetes.Interface
}

// NewClaims returns a Claims writing through client.
func NewClaims(client kubernetes.Interface) *Claims { return &Claims{client: client} }

// Commit writes the claims of v (as the decision saw them) plus node's
// claim, minus the fenced nodes' claims, conditional on v's resourceVersion.
// One API call; a concurrent change is ErrConflict.
func (c *Claims) Commit(ctx context.Context, v *Volume, node string, fenced []string, now time.Time) error {
	next := map[string]time.Time{}
	for n, t := range v.Claims {
		next[n] = t
	}
	for _, n := range fenced {
		delete(next, n)
	}
	if _, ok := next[node]; !ok {
		next[node] = now.UTC().Truncate(time.Second)
	}
	return c.patch(ctx, v.PVName, v.ResourceVersion, next)
}

// Release removes the given nodes' claims and leaves every other claim
// alone (a late unpublish from a former holder must not disturb the current
// one). It re-reads and retries on conflict: dropping a claim is always
// safe.
func (c *Claims) Release(ctx context.Context, pvName string, nodes ...string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		claims, err := decodeClaims(pv.Annotations)
		if err != nil {
			return fmt.Errorf("PV %s: %w", pvName, err)
		}
		changed := false
		for _, n := range nodes {
			if _, ok := claims[n]; ok {
				delete(claims, n)
				changed = true
			}
		}
		if !changed {
			return nil
		}
		err = c.patch(ctx, pvName, pv.ResourceVersion, claims)
		if errors.Is(err, ErrConflict) {
			return apierrors.NewConflict(corev1.Resource("persistentvolumes"), pvName, err)
		}
		return err
	})
}

func (c *Claims) patch(ctx context.Context, pvName, resourceVersion string, claims map[string]time.Time) error {
	var value any // JSON null deletes the annotation
	if len(claims) > 0 {
		b, err := json.Marshal(claims)
		if err != nil {
			return err
		}
		value = string(b)
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": resourceVersion,
		"annotations":     map[string]any{ClaimsAnnotation: value},
	}})
	if err != nil {
		return err
	}
	_, err = c.client.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType, body, metav1.PatchOptions{})
	if apierrors.IsConflict(err) {
		return fmt.Errorf("%w: PV %s changed after resourceVersion %s", ErrConflict, pvName, resourceVersion)
	}
	return err
}
