//go:build race

package csi

// raceDetector: the race detector slows the model check about tenfold;
// under it `make unit` runs a tenth of the operations and `make model`
// runs the full count without it.
const raceDetector = true
