package rds

import (
	"context"
	"errors"
	"testing"
)

// TestCreateRecoversOrphanedFile: a double fault (the add ran but its reply
// was lost, then the cleanup's /file remove failed) leaves a backing file
// without a disk. The path is derived from the volume ID, so the next
// create of that volume removes it and succeeds, instead of answering
// "file already exists" for ever.
func TestCreateRecoversOrphanedFile(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, func(cfg *Config) { cfg.MaxAttempts = 1 })
	ctx := context.Background()
	r := wrapReq()
	r.OwnsFilePath = true

	env.sim.DropAfterExecNth(1, "/disk add")
	env.sim.FailNth(1, "/file remove", "failure: could not remove file")
	if _, err := c.CreateDisk(ctx, r); !errors.Is(err, ErrTransient) {
		t.Fatalf("first create: %v, want the transport failure", err)
	}
	if len(env.sim.Disks()) != 0 || !env.fileExists(t, r.FilePath) {
		t.Fatalf("setup: want an orphaned file and no disk, have disks %+v", env.sim.Disks())
	}

	// Not owned: the file is refused as someone else's.
	notOwned := r
	notOwned.OwnsFilePath = false
	if _, err := c.CreateDisk(ctx, notOwned); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("create without ownership: %v, want ErrAlreadyExists", err)
	}
	d, err := c.CreateDisk(ctx, r)
	if err != nil {
		t.Fatalf("create after the double fault: %v", err)
	}
	if d.FilePath != r.FilePath || d.Size != GiB {
		t.Fatalf("created %+v", *d)
	}

	// A file that another disk uses is never taken.
	other := CreateDiskRequest{Slot: "pvc-other", FilePath: r.FilePath, Size: GiB, OwnsFilePath: true}
	if _, err := c.CreateDisk(ctx, other); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("create on a file in use: %v, want ErrAlreadyExists", err)
	}
	if got, err := c.GetDisk(ctx, r.Slot); err != nil || got.FilePath != r.FilePath {
		t.Fatalf("the first disk after the refused create: %+v, %v", got, err)
	}
}

func TestFilesWithPrefix(t *testing.T) {
	env := startSim(t, 10*GiB)
	c := env.client(t, nil)
	ctx := context.Background()
	for _, slot := range []string{"snap-a", "snap-ab", "snap-b"} {
		file := wrapBase + "/snapshots/" + slot + ".src-v.t-1.img"
		if _, err := c.CreateDisk(ctx, CreateDiskRequest{Slot: slot, FilePath: file, Size: MiB}); err != nil {
			t.Fatal(err)
		}
	}
	files, err := c.FilesWithPrefix(ctx, wrapBase+"/snapshots/snap-a.")
	if err != nil || len(files) != 1 || files[0].Name != "storage-pool/kubernetes-volumes/snapshots/snap-a.src-v.t-1.img" {
		t.Fatalf("FilesWithPrefix = %+v, %v", files, err)
	}
	if files, err := c.FilesWithPrefix(ctx, wrapBase+"/snapshots/snap-c."); err != nil || len(files) != 0 {
		t.Fatalf("no match: %+v, %v", files, err)
	}
	if _, err := c.FilesWithPrefix(ctx, wrapBase+"/snap[shots"); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad prefix: %v", err)
	}
}
