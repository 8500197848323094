package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
)

// controllerManifest is the controller Deployment the sidecars' flags are
// taken from, so e2e runs them as deployed.
const controllerManifest = "controller.yaml"

// ManifestContainerArgs returns the args of container in the controller
// Deployment of manifests/base, or ok=false when there is no such file or
// container.
func ManifestContainerArgs(root, container string) (args []string, ok bool, err error) {
	path := filepath.Join(root, "manifests", "base", controllerManifest)
	if _, err := os.Stat(path); err != nil {
		return nil, false, nil
	}
	objs, err := decodeFile(path)
	if err != nil {
		return nil, false, err
	}
	for _, obj := range objs {
		d, isDeployment := obj.(*appsv1.Deployment)
		if !isDeployment {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == container {
				return c.Args, true, nil
			}
		}
	}
	return nil, false, nil
}

// localizeArgs adapts a container's args to a process on this machine:
// the socket directory /csi becomes the driver's socket, $(NAMESPACE) the
// deployment's namespace, and --http-endpoint is dropped (fixed ports
// would collide between tests; nothing scrapes them here). Capacity
// objects get no owner: there is no pod to walk up from.
func localizeArgs(args []string, socket, namespace string) ([]string, error) {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "--http-endpoint=") || strings.HasPrefix(a, "--metrics-address=") {
			continue
		}
		if strings.HasPrefix(a, "--capacity-ownerref-level=") {
			a = "--capacity-ownerref-level=-1"
		}
		a = strings.ReplaceAll(a, "/csi/csi.sock", socket)
		a = strings.ReplaceAll(a, "$(NAMESPACE)", namespace)
		if strings.Contains(a, "$(") {
			return nil, fmt.Errorf("arg %q refers to an environment variable the harness does not provide", a)
		}
		out = append(out, a)
	}
	return out, nil
}
