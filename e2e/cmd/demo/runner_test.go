package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
)

type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.l = append(l.l, s)
}

func (l *lines) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.l, "\n")
}

// The runner behaves as testing does for the framework: Fatal ends the
// body at once, cleanups run newest first, a Fatal inside one cleanup does
// not skip the others, and Context ends before the cleanups run.
func TestRunnerFatalAndCleanups(t *testing.T) {
	var log lines
	r := newRunner(context.Background(), "demo", log.add)
	var order []string
	reached := false
	r.run(func() {
		r.Cleanup(func() { order = append(order, "first") })
		r.Cleanup(func() {
			if r.Context().Err() == nil {
				t.Error("Context still live while the cleanups run")
			}
			order = append(order, "second")
			r.Fatal("cleanup fails")
		})
		r.Cleanup(func() { order = append(order, "third") })
		r.Fatalf("step %d failed", 5)
		reached = true
	})
	if reached {
		t.Error("the body went on after Fatal")
	}
	if !r.Failed() {
		t.Error("Failed() = false after Fatal")
	}
	r.runCleanups(nil)
	if want := []string{"third", "second", "first"}; !slices.Equal(order, want) {
		t.Errorf("cleanup order %v, want %v", order, want)
	}
	if got := log.all(); !strings.Contains(got, "ERROR: step 5 failed") || !strings.Contains(got, "ERROR: cleanup fails") {
		t.Errorf("log:\n%s", got)
	}
}

// After Ctrl-C, the errors of the cancelled scenario are an interruption,
// not a failure; an error in a cleanup still is one.
func TestRunnerInterrupt(t *testing.T) {
	var log lines
	r := newRunner(context.Background(), "demo", log.add)
	r.run(func() {
		r.Cleanup(func() { r.Error("stop failed") })
		r.interrupt()
		<-r.Context().Done()
		r.Fatal(r.Context().Err())
	})
	if r.Failed() || !r.wasInterrupted() {
		t.Errorf("after an interrupted wait: Failed=%t interrupted=%t, want false, true", r.Failed(), r.wasInterrupted())
	}
	r.runCleanups(nil)
	if !r.Failed() {
		t.Error("a cleanup's error after Ctrl-C is not a failure")
	}
	got := log.all()
	if !strings.Contains(got, "interrupted: context canceled") || !strings.Contains(got, "ERROR: stop failed") {
		t.Errorf("log:\n%s", got)
	}
}

func TestRunnerPanicIsAFailure(t *testing.T) {
	var log lines
	r := newRunner(context.Background(), "demo", log.add)
	r.run(func() { panic("boom") })
	if !r.Failed() || !strings.Contains(log.all(), "panic: boom") {
		t.Errorf("Failed=%t log %q", r.Failed(), log.all())
	}
}

// The printer counts object changes per kind (events it hides do not
// count), drops an event's own name and abbreviates generated names.
func TestPrinterTimelineLines(t *testing.T) {
	var out bytes.Buffer
	p := &printer{w: &out, tally: map[string]int{}}
	for _, l := range []string{
		"    7.223s  PVC e2e/data created: phase=Pending",
		"   10.945s  VolumeAttachment csi-52443e8e5edcbb5f0059b611c55c14254d6148f4b1731e9a9da3fa9e681f8570 created: pv=pvc-04d09a66-25f4-44d6-bd24-40bcae778a6e node=node-a attached=false",
		"   11.000s  Event rds-csi/x.1 created: Normal Lease/external-attacher-leader LeaderElection (x1): \"became leader\"",
		"   18.891s  Event default/pvc-04d09a66-25f4-44d6-bd24-40bcae778a6e.18eaa166c6a23016 created: Warning PersistentVolume/pvc-04d09a66-25f4-44d6-bd24-40bcae778a6e StaleAttachmentFenced (x1): \"fenced\"",
		"   19.000s  waiting for something: gave up",
		"   19.100s  == start the controller",
		"artifacts (timeline.log, component logs): /tmp/a",
	} {
		p.line(l)
	}
	got := out.String()
	for _, want := range []string{
		"VolumeAttachment csi-52443e8e… created: pv=pvc-04d09a66… node=node-a",
		"Event Warning PersistentVolume/pvc-04d09a66… StaleAttachmentFenced (x1)",
		"PVC e2e/data created",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, hidden := range []string{"LeaderElection", "waiting for", "== start", ".18eaa166c6a23016"} {
		if strings.Contains(got, hidden) {
			t.Errorf("output shows %q:\n%s", hidden, got)
		}
	}
	if tally := p.takeTally(); tally != "VolumeAttachment 1, PVC 1, Event 1" {
		t.Errorf("tally %q", tally)
	}
	if p.takeTally() != "-" {
		t.Error("takeTally did not reset")
	}
	if p.artifactDir() != "/tmp/a" {
		t.Errorf("artifact dir %q", p.artifactDir())
	}
}
