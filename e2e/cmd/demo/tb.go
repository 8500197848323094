package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"testing"
)

// runner gives the e2e framework, whose helpers take a testing.TB, what a
// test would give it, in an ordinary program: Fatal ends the scenario's
// goroutine (runtime.Goexit, as in a test), cleanups run last-registered
// first after the scenario, and Context ends on Ctrl-C or before the
// cleanups. Everything logged goes to a sink (the demo's printer).
//
// testing.TB has an unexported method so that only package testing can
// implement it; the embedded nil TB provides that one, and every exported
// method is implemented here, so the nil is never reached.
type runner struct {
	testing.TB

	name   string
	log    func(string) // every Log/Error line
	ctx    context.Context
	cancel context.CancelFunc

	mu          sync.Mutex
	interrupted bool // Ctrl-C: errors of the scenario's cancelled waits are not failures
	cleaning    bool
	failed      bool
	skipped     bool
	cleanups    []func()
	running     string // the cleanup being run, for "still stopping" messages
}

func newRunner(parent context.Context, name string, log func(string)) *runner {
	ctx, cancel := context.WithCancel(parent)
	return &runner{name: name, log: log, ctx: ctx, cancel: cancel}
}

// run calls body in its own goroutine, as testing runs a test, and waits
// for it to return, call Fatal/FailNow/Skip, or panic (reported as a
// failure). It does not run the cleanups: see runCleanups.
func (r *runner) run(body func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				r.Errorf("panic: %v", p)
			}
		}()
		body()
	}()
	<-done
}

// runCleanups ends Context, then runs the cleanups, newest first, each in
// its own goroutine so that a Fatal inside one does not skip the rest.
// before is told each cleanup's position (from len down to 1).
func (r *runner) runCleanups(before func(left int)) {
	r.mu.Lock()
	r.cleaning = true
	r.mu.Unlock()
	r.cancel()
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		if before != nil {
			before(n)
		}
		r.run(f)
	}
}

// pendingCleanups is how many cleanups have not run yet.
func (r *runner) pendingCleanups() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cleanups)
}

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

func (r *runner) Log(args ...any) { r.log(fmt.Sprintln(args...)) }
func (r *runner) Logf(format string, args ...any) {
	r.log(fmt.Sprintf(format, args...))
}

func (r *runner) Error(args ...any) { r.report(fmt.Sprintln(args...)) }

func (r *runner) Errorf(format string, args ...any) { r.report(fmt.Sprintf(format, args...)) }

// report records a failure; after Ctrl-C, what the cancelled scenario
// reports is the interruption, not a failure (a cleanup's error still is).
func (r *runner) report(msg string) {
	r.mu.Lock()
	quiet := r.interrupted && !r.cleaning
	if !quiet {
		r.failed = true
	}
	r.mu.Unlock()
	if quiet {
		r.log("interrupted: " + msg)
		return
	}
	r.log("ERROR: " + msg)
}

// interrupt ends Context: every wait of the scenario returns.
func (r *runner) interrupt() {
	r.mu.Lock()
	r.interrupted = true
	r.mu.Unlock()
	r.cancel()
}

func (r *runner) wasInterrupted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.interrupted
}

func (r *runner) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}

func (r *runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *runner) FailNow() {
	r.Fail()
	runtime.Goexit()
}

func (r *runner) Fatal(args ...any) {
	r.Error(args...)
	runtime.Goexit()
}

func (r *runner) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *runner) Skip(args ...any) {
	r.log("SKIP: " + fmt.Sprintln(args...))
	r.SkipNow()
}

func (r *runner) Skipf(format string, args ...any) {
	r.log("SKIP: " + fmt.Sprintf(format, args...))
	r.SkipNow()
}

func (r *runner) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *runner) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

func (r *runner) Helper()                  {}
func (r *runner) Name() string             { return r.name }
func (r *runner) Context() context.Context { return r.ctx }
func (r *runner) Attr(key, value string)   { r.Logf("%s=%s", key, value) }
func (r *runner) Output() io.Writer        { return logWriter{r} }
func (r *runner) ArtifactDir() string      { return r.TempDir() }

func (r *runner) Setenv(key, value string) {
	old, had := os.LookupEnv(key)
	r.Cleanup(func() {
		if had {
			_ = os.Setenv(key, old)
		} else {
			_ = os.Unsetenv(key)
		}
	})
	_ = os.Setenv(key, value)
}

func (r *runner) Chdir(dir string) {
	old, err := os.Getwd()
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { _ = os.Chdir(old) })
	if err := os.Chdir(dir); err != nil {
		r.Fatal(err)
	}
}

func (r *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "rds-csi-demo-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// logWriter is Output(): what is written is logged.
type logWriter struct{ r *runner }

func (w logWriter) Write(p []byte) (int, error) {
	w.r.log(string(p))
	return len(p), nil
}
