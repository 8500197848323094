package nvme

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestLoadOrCreateHostIdentity(t *testing.T) {
	const (
		id      = "5d8e1f2a-3b4c-4d5e-8f70-819203a4b5c6"
		uuidNQN = uuidNQNPrefix + id
		custom  = "nqn.2024-01.lan.example:node-7"
	)
	tests := []struct {
		name     string
		files    map[string]string // initial contents; absent = missing
		wantNQN  string            // "" = generated, UUID form
		wantID   string            // "" = generated
		sameUUID bool              // hostid must be the UUID in the host NQN
		wantErr  error
	}{
		{name: "both missing", sameUUID: true},
		{name: "both present", files: map[string]string{"hostnqn": custom + "\n", "hostid": id + "\n"}, wantNQN: custom, wantID: id},
		{name: "hostid missing, UUID-form NQN", files: map[string]string{"hostnqn": uuidNQN}, wantNQN: uuidNQN, wantID: id},
		{name: "hostid missing, custom NQN", files: map[string]string{"hostnqn": custom}, wantNQN: custom},
		{name: "hostnqn missing", files: map[string]string{"hostid": strings.ToUpper(id)}, wantNQN: uuidNQN, wantID: id},
		{name: "empty hostnqn file", files: map[string]string{"hostnqn": "\n", "hostid": id}, wantNQN: uuidNQN, wantID: id},
		{name: "hostid not a UUID", files: map[string]string{"hostnqn": custom, "hostid": "node-7"}, wantErr: ErrInvalidArgument},
		{name: "hostnqn not an NQN", files: map[string]string{"hostnqn": "node,7", "hostid": id}, wantErr: ErrInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "etc", "nvme") // may not exist yet
			for name, content := range tt.files {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := LoadOrCreateHostIdentity(dir)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !uuidPattern.MatchString(got.ID) {
				t.Errorf("host ID %q is not a UUID", got.ID)
			}
			if err := validateNQN(got.NQN); err != nil {
				t.Error(err)
			}
			if tt.wantNQN != "" && got.NQN != tt.wantNQN {
				t.Errorf("NQN = %q, want %q", got.NQN, tt.wantNQN)
			}
			if tt.wantID != "" && got.ID != tt.wantID {
				t.Errorf("ID = %q, want %q", got.ID, tt.wantID)
			}
			if tt.sameUUID && got.NQN != uuidNQNPrefix+got.ID {
				t.Errorf("NQN %q does not carry host ID %q", got.NQN, got.ID)
			}
			// What was returned is what is on disk, and stays so.
			for name, want := range map[string]string{"hostnqn": got.NQN, "hostid": got.ID} {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				if s := strings.TrimSpace(string(b)); !strings.EqualFold(s, want) {
					t.Errorf("%s on disk = %q, want %q", name, s, want)
				}
			}
			again, err := LoadOrCreateHostIdentity(dir)
			if err != nil || again != got {
				t.Errorf("reload = %+v, %v; want %+v", again, err, got)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 2 {
				t.Errorf("%d files in %s, want hostnqn and hostid only", len(entries), dir)
			}
		})
	}
}

func TestLoadOrCreateHostIdentityConcurrent(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	results := make([]HostIdentity, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = LoadOrCreateHostIdentity(dir)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if results[i] != results[0] {
			t.Fatalf("racing creators disagree: %+v vs %+v", results[i], results[0])
		}
	}
}

func TestConnectorCachesHostIdentity(t *testing.T) {
	h := newFakeHost(t)
	h.remove(h.etc)
	c := h.connector()
	first, err := c.HostIdentity()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.etc, "hostnqn")); err != nil {
		t.Fatalf("host NQN not persisted: %v", err)
	}
	// A new connector (a restarted plugin) reads the persisted identity.
	second, err := h.connector().HostIdentity()
	if err != nil || second != first {
		t.Fatalf("after restart: %+v, %v; want %+v", second, err, first)
	}
}
