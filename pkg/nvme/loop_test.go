package nvme

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These run anywhere: losetup is faked, so they cover the guards and the
// parsing, not the kernel.

func TestLoopConnectorGuards(t *testing.T) {
	noCommands := RunnerFunc(func(_ context.Context, name string, args ...string) ([]byte, error) {
		t.Errorf("unexpected command %s %v", name, args)
		return nil, errors.New("unexpected")
	})
	l, err := NewLoopConnector(LoopConfig{
		NQNPrefix: testPrefix,
		Resolve:   loopVolumes{}.resolve,
		Runner:    noCommands,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Connect(ctx, Target{NQN: nqnForeign}); !errors.Is(err, ErrForeignNQN) {
		t.Errorf("Connect(foreign) = %v", err)
	}
	// A loop device presents no host, but a malformed host NQN is refused
	// as by the NVMe/TCP connector.
	if _, err := l.Connect(ctx, Target{NQN: nqnA, HostNQN: "nqn.2024-01.lan.example:a,b"}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Connect(malformed host NQN) = %v", err)
	}
	if err := l.Disconnect(ctx, nqnForeign, notInUse); !errors.Is(err, ErrForeignNQN) {
		t.Errorf("Disconnect(foreign) = %v", err)
	}
	if err := l.Disconnect(ctx, nqnA, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Disconnect without in-use check = %v", err)
	}
	if err := l.RefreshSize(ctx, nqnForeign); !errors.Is(err, ErrForeignNQN) {
		t.Errorf("RefreshSize(foreign) = %v", err)
	}
	if _, err := NewLoopConnector(LoopConfig{NQNPrefix: testPrefix}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewLoopConnector without resolver = %v", err)
	}
	if _, err := NewLoopConnector(LoopConfig{Resolve: loopVolumes{}.resolve}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("NewLoopConnector without prefix = %v", err)
	}
}

// loopVolumes is a stand-in for the simulator: NQN -> backing file.
type loopVolumes map[string]string

func (v loopVolumes) resolve(_ context.Context, nqn string) (string, error) {
	if f, ok := v[nqn]; ok {
		return f, nil
	}
	return "", fmt.Errorf("volume %s: %w", nqn, os.ErrNotExist)
}

func TestLoopConnectorParsesLosetup(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "vol-a.img")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	file, _ = filepath.EvalSymlinks(file)
	for _, tt := range []struct {
		name       string
		associated string // losetup --associated output
		all        string // losetup --list output
		want       string
		wantErr    error
	}{
		{
			name:       "attached twice: lowest number wins",
			associated: `{"loopdevices": [{"name": "/dev/loop10", "back-file": "` + file + `"}, {"name": "/dev/loop9", "back-file": "` + file + `"}]}`,
			want:       "/dev/loop9",
		},
		{name: "old losetup prints nothing", associated: "", wantErr: ErrNotConnected},
		{name: "empty list", associated: `{"loopdevices": [ ]}`, wantErr: ErrNotConnected},
		{name: "garbage", associated: `loop0: x`, wantErr: errors.New("parsing")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run := RunnerFunc(func(_ context.Context, name string, args ...string) ([]byte, error) {
				if name != "losetup" {
					t.Fatalf("ran %s", name)
				}
				if strings.Contains(strings.Join(args, " "), "--associated "+file) {
					return []byte(tt.associated), nil
				}
				return []byte(tt.all), nil
			})
			l, err := NewLoopConnector(LoopConfig{NQNPrefix: testPrefix, Resolve: loopVolumes{nqnA: file}.resolve, Runner: run})
			if err != nil {
				t.Fatal(err)
			}
			got, err := l.DevicePath(context.Background(), nqnA)
			switch {
			case tt.wantErr == nil && (err != nil || got != tt.want):
				t.Fatalf("DevicePath = %q, %v; want %q", got, err, tt.want)
			case tt.wantErr != nil && err == nil:
				t.Fatalf("DevicePath = %q, want an error", got)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr) && !strings.Contains(err.Error(), tt.wantErr.Error()):
				t.Fatalf("DevicePath err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}
