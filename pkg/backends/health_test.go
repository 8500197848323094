package backends

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/srvlab/rds-csi/pkg/rds"
)

func TestABoxIsDownOnlyWhenItFailedToAnswer(t *testing.T) {
	h := NewHealth("rack-b")
	if h.Err() != nil {
		t.Fatal("a box nobody tried is down")
	}
	for _, tc := range []struct {
		name string
		err  error
		down bool
	}{
		{"a refusal is an answer", rds.ErrNoSpace, false},
		{"a timeout", fmt.Errorf("probe: %w", context.DeadlineExceeded), true},
		// Cancelled by its caller (another box answered first, the RPC
		// ended): the box may be fine; it stays as it was.
		{"cancelled by its caller", fmt.Errorf("%w: command timed out after it was sent: %w", rds.ErrOutcomeUnknown, context.Canceled), true},
		{"an answer again", nil, false},
		{"cancelled while up", fmt.Errorf("%w: %w", rds.ErrTransient, context.Canceled), false},
		{"a lost connection", fmt.Errorf("%w: connection reset", rds.ErrTransient), true},
		{"garbage", rds.ErrBadOutput, true},
		{"a wrong host key", rds.ErrHostKey, true},
	} {
		h.Observe(tc.err)
		if down := h.Err() != nil; down != tc.down {
			t.Errorf("%s: down %v, want %v", tc.name, down, tc.down)
		}
	}
	h.Observe(fmt.Errorf("%w: refused", rds.ErrTransient))
	if err := h.Err(); err == nil || !errors.Is(err, rds.ErrTransient) || !strings.Contains(err.Error(), "RDS rack-b unreachable") {
		t.Errorf("the error %v names neither the box nor its cause", err)
	}
}
