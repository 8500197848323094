package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKrewManifest checks the krew manifest against the plugin it installs.
func TestKrewManifest(t *testing.T) {
	data, err := os.ReadFile("../../krew/rds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Version          string `json:"version"`
			ShortDescription string `json:"shortDescription"`
			Description      string `json:"description"`
			Homepage         string `json:"homepage"`
			Platforms        []struct {
				Selector struct {
					MatchLabels map[string]string `json:"matchLabels"`
				} `json:"selector"`
				URI    string `json:"uri"`
				SHA256 string `json:"sha256"`
				Bin    string `json:"bin"`
				Files  []struct {
					From string `json:"from"`
					To   string `json:"to"`
				} `json:"files"`
			} `json:"platforms"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		t.Fatal(err)
	}
	if m.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || m.Kind != "Plugin" || m.Metadata.Name != "rds" {
		t.Errorf("header: %s %s %s; the plugin must be named rds (kubectl rds)", m.APIVersion, m.Kind, m.Metadata.Name)
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(m.Spec.Version) || m.Spec.ShortDescription == "" || len(m.Spec.Platforms) == 0 {
		t.Errorf("spec: %+v", m.Spec)
	}
	for _, p := range m.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		if p.Bin != "kubectl-rds" || len(p.Files) == 0 || p.Files[0].From != "kubectl-rds" {
			t.Errorf("%s/%s: bin %q, files %+v; the binary is kubectl-rds", os, arch, p.Bin, p.Files)
		}
		if !strings.Contains(p.URI, "/"+m.Spec.Version+"/") || !strings.HasSuffix(p.URI, "kubectl-rds_"+os+"_"+arch+".tar.gz") {
			t.Errorf("%s/%s: uri %s does not match the version and platform", os, arch, p.URI)
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(p.SHA256) {
			t.Errorf("%s/%s: sha256 %q", os, arch, p.SHA256)
		}
	}
}
