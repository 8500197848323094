//go:build !race

package csi

const raceDetector = false
