package framework

import (
	"slices"
	"testing"
	"time"
)

// A Ginkgo JUnit report as e2e.test writes it, one spec of each kind.
const junitSample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="7" disabled="1" errors="0" failures="2" time="61.5">
  <testsuite name="Kubernetes e2e suite" package="/x" tests="7" disabled="1" skipped="3" errors="0" failures="2" time="61.5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="0.1"></testcase>
    <testcase name="[It] External Storage [Driver: d] volumes should store data" classname="Kubernetes e2e suite" status="passed" time="28.4"></testcase>
    <testcase name="[It] External Storage [Driver: d] provisioning should provision correct filesystem size" classname="Kubernetes e2e suite" status="failed" time="31.8">
      <failure message="Filesystem resize failed" type="failed">[FAILED] Filesystem resize failed
In [It] at: provisioning.go:557</failure>
    </testcase>
    <testcase name="[It] External Storage [Driver: d] volumeLimits should verify" classname="Kubernetes e2e suite" status="skipped" time="0.2">
      <skipped message="skipped - Driver d does not support volume limits"></skipped>
    </testcase>
    <testcase name="[It] External Storage [Driver: d] [Testpattern: Pre-provisioned PV] volumes" classname="Kubernetes e2e suite" status="skipped" time="0.1">
      <skipped message="skipped - Driver d does not support volume limits"></skipped>
    </testcase>
    <testcase name="[It] In-tree Volumes [Driver: nfs] volumes" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] External Storage [Driver: d] ephemeral expansion" classname="Kubernetes e2e suite" status="interrupted" time="1.0">
      <failure message="Interrupted by User" type="interrupted"></failure>
    </testcase>
  </testsuite>
</testsuites>`

func TestJUnitReportCountsWhatFailedPassedAndSkipped(t *testing.T) {
	cases, err := ParseJUnit([]byte(junitSample))
	if err != nil {
		t.Fatal(err)
	}
	s := SummarizeJUnit(cases)
	want := JUnitSummary{Passed: 1, Failed: 2, Skipped: 2, Filtered: 1, Duration: s.Duration}
	if s != want {
		t.Errorf("summary %+v, want %+v", s, want)
	}
	if s.Duration < 61*time.Second {
		t.Errorf("duration %s, want the cases' 61.6 s", s.Duration)
	}
	var failed []string
	for _, c := range cases {
		if c.Failed() {
			failed = append(failed, c.Message)
		}
	}
	if !slices.Equal(failed, []string{"Filesystem resize failed", "Interrupted by User"}) {
		t.Errorf("failures %q", failed)
	}
	if r := SkipReasons(cases); !slices.Equal(r, []string{"Driver d does not support volume limits (2)"}) {
		t.Errorf("skip reasons %q", r)
	}
}

// A <failure> means the spec failed whatever its status attribute says,
// and a failed suite node (a setup) counts as a failure.
func TestJUnitFailureElementAndFailedSetupCountAsFailures(t *testing.T) {
	cases, err := ParseJUnit([]byte(`<testsuite>
  <testcase name="[SynchronizedBeforeSuite]" status="failed" time="3"><failure message="nodes not ready"></failure></testcase>
  <testcase name="[It] a spec" status="passed" time="1"><failure message="but it failed"></failure></testcase>
</testsuite>`))
	if err != nil {
		t.Fatal(err)
	}
	if s := SummarizeJUnit(cases); s.Failed != 2 || s.Passed != 0 {
		t.Errorf("summary %+v, want 2 failed", s)
	}
}

// A report without a single case proves nothing.
func TestJUnitReportWithoutCasesIsAnError(t *testing.T) {
	for _, r := range []string{`<testsuites></testsuites>`, `<testsuites><testsuite></testsuite></testsuites>`, `not xml`} {
		if _, err := ParseJUnit([]byte(r)); err == nil {
			t.Errorf("%q: no error", r)
		}
	}
}
