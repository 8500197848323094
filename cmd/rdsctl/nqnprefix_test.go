package main

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// -nqn-prefix leaves room under the 223-byte NQN limit for the driver's
// volume IDs (pvc-<uuid>, 40 bytes): checked by forming prefix+"x" only,
// a longer prefix would be accepted and every NQN rdsctl forms with it
// refused later.
func TestRdsctlNQNPrefixLeavesRoomForAVolumeID(t *testing.T) {
	const base = "nqn.2000-02.com.mikrotik:" // 25 bytes
	for _, prefix := range []string{base + strings.Repeat("a", 180), base + strings.Repeat("a", 223-40-len(base)+1)} {
		err := run([]string{"-nqn-prefix=" + prefix, "probe"}, io.Discard, io.Discard)
		var usage usageError
		if !errors.As(err, &usage) || !strings.Contains(err.Error(), "-nqn-prefix") {
			t.Errorf("a %d-byte -nqn-prefix: %v; want a usage error naming -nqn-prefix", len(prefix), err)
		}
	}
	// 183 bytes leave exactly room: the next check (-key) speaks.
	prefix := base + strings.Repeat("a", 223-40-len(base))
	if err := run([]string{"-nqn-prefix=" + prefix, "probe"}, io.Discard, io.Discard); err == nil || strings.Contains(err.Error(), "-nqn-prefix") {
		t.Errorf("a %d-byte -nqn-prefix: %v; want it accepted", len(prefix), err)
	}
}
