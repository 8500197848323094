package rdssim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// simFilePrefix marks the simulator's own files in the data directory (the
// state file, temporary files, a default host key). They are invisible to
// `/file print` and do not count against the pool.
const simFilePrefix = ".rdssim"

const stateFileName = simFilePrefix + "-state.json"

const defaultNVMePort = 4420

// disk is one file-backed disk of the table. Its size is not stored: the
// backing file's length is the truth.
type disk struct {
	Slot      string `json:"slot"`
	FilePath  string `json:"filePath"` // RouterOS path, "/storage-pool/k8s/pvc-1.img"
	Export    bool   `json:"nvmeTcpExport"`
	Port      int    `json:"nvmeTcpServerPort"`
	NQN       string `json:"nvmeTcpServerNqn"`
	AllowHost string `json:"nvmeTcpServerAllowHostName"`
	// Password: nvme-tcp-server-password; "" means none (no
	// authentication). Never printed (a sensitive value).
	Password string `json:"nvmeTcpServerPassword,omitempty"`
	// Mounted: a disk mounted beside the driver's (an image; AddMountedImage).
	Mounted bool `json:"mounted,omitempty"`
}

type stateFile struct {
	Version int     `json:"version"`
	Disks   []*disk `json:"disks"`
}

// loadState reads the disk table from the data directory; a missing file is
// an empty table.
func loadState(dataDir string) ([]*disk, error) {
	data, err := os.ReadFile(filepath.Join(dataDir, stateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read simulator state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("parse simulator state %s: %w", filepath.Join(dataDir, stateFileName), err)
	}
	if st.Version != 1 {
		return nil, fmt.Errorf("simulator state %s has unknown version %d", filepath.Join(dataDir, stateFileName), st.Version)
	}
	return st.Disks, nil
}

// saveState writes the disk table atomically: temp file, fsync, rename,
// fsync of the directory.
func saveState(dataDir string, disks []*disk) error {
	data, err := json.MarshalIndent(stateFile{Version: 1, Disks: disks}, "", "  ")
	if err != nil {
		return err
	}
	// 0600: it holds the disks' passwords, from which their secrets follow.
	return writeFileAtomic(filepath.Join(dataDir, stateFileName), data, 0o600)
}

func writeFileAtomic(name string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(name)
	tmp, err := os.CreateTemp(dir, simFilePrefix+"-tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// relPath maps a disk file-path ("/storage-pool/k8s/pvc-1.img") to a clean
// path relative to the data directory ("k8s/pvc-1.img").
func (s *Server) relPath(filePath string) (string, error) {
	prefix := "/" + s.pool + "/"
	rel, ok := strings.CutPrefix(filePath, prefix)
	if !ok || rel == "" || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("file-path %q is not a file under %s", filePath, prefix)
	}
	for _, seg := range strings.Split(rel, "/") {
		if strings.HasPrefix(seg, simFilePrefix) {
			return "", fmt.Errorf("file-path %q is reserved", filePath)
		}
	}
	return rel, nil
}

func (s *Server) hostPath(rel string) string {
	return filepath.Join(s.dataDir, filepath.FromSlash(rel))
}

// fileSize is the logical size of a disk's backing file; -1 if it is gone.
func (s *Server) fileSize(d *disk) int64 {
	rel, err := s.relPath(d.FilePath)
	if err != nil {
		return -1
	}
	fi, err := os.Stat(s.hostPath(rel))
	if err != nil {
		return -1
	}
	return fi.Size()
}

// fileEntry is one entry of /file.
type fileEntry struct {
	name string // "storage-pool/k8s/pvc-1.img"
	rel  string // "k8s/pvc-1.img"; "" for the pool directory itself
	dir  bool
	info fs.FileInfo
}

// files lists the pool directory and everything under it, in name order,
// leaving out the simulator's own files.
func (s *Server) files() ([]fileEntry, error) {
	var out []fileEntry
	err := filepath.WalkDir(s.dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), simFilePrefix) && p != s.dataDir {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(s.dataDir, p)
		if err != nil {
			return err
		}
		e := fileEntry{name: s.pool, dir: d.IsDir(), info: info}
		if rel != "." {
			e.rel = filepath.ToSlash(rel)
			e.name = s.pool + "/" + e.rel
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// used is the sum of the logical sizes of every file in the pool: disks'
// backing files and files whose disk was removed alike, as on the real
// storage, where a file left behind still takes its space.
func (s *Server) used() (int64, error) {
	entries, err := s.files()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range entries {
		if !e.dir {
			n += e.info.Size()
		}
	}
	return n, nil
}

func (s *Server) free() (int64, error) {
	u, err := s.used()
	if err != nil {
		return 0, err
	}
	return s.poolSize - u, nil
}

func (s *Server) diskBySlot(slot string) *disk {
	for _, d := range s.disks {
		if d.Slot == slot {
			return d
		}
	}
	return nil
}

// diskFlags are the /disk flags the simulator sets, in the order of
// RouterOS's /disk reference (X A E B M F S f r c g p t i s n m L O o),
// which is the order of the legend's columns.
var diskFlags = []flagColumn{{'B', "BLOCK-DEVICE"}, {'M', "MOUNTED"}, {'t', "NVME-TCP-EXPORT"}}

// diskLegend is the Flags line of a /disk print that matches nothing.
const diskLegend = "B - BLOCK-DEVICE; M - MOUNTED; t - NVME-TCP-EXPORT"

// diskKeys are the properties /disk where and find accept: those of the
// pool disk and of file disks.
var diskKeys = propKeys((&Server{}).poolItem(0, 0), fileDiskItem(&disk{}, 0, false))

func propKeys(items ...item) map[string]bool {
	keys := map[string]bool{}
	for _, it := range items {
		for _, p := range it.props {
			keys[p.key] = true
		}
	}
	return keys
}

func (s *Server) poolItem(size, free int64) item {
	return item{flags: "BM", props: []prop{
		bareProp("type", "partition"),
		strProp("slot", s.pool),
		strProp("slot-default", ""),
		strProp("parent", ""),
		bareProp("fs", "btrfs"),
		strProp("model", ""),
		rawProp("size", spacedNumber(size)),
		rawProp("free", spacedNumber(free)),
		bareProp("mount-filesystem", "yes"),
		bareProp("mount-read-only", "no"),
		strProp("mount-point", s.pool),
		bareProp("compress", "no"),
		bareProp("sector-size", "512"),
		bareProp("raid-master", "none"),
		bareProp("nvme-tcp-export", "no"),
		bareProp("iscsi-export", "no"),
		bareProp("nfs-sharing", "no"),
		bareProp("smb-sharing", "no"),
		bareProp("media-sharing", "no"),
		bareProp("media-interface", "none"),
		bareProp("swap", "no"),
	}}
}

// fileDiskItem is a file disk as /disk print shows it. hideClosed leaves
// the NVMe/TCP server properties out of the print while the export is off
// (Config.ClosedExportProps hidden); conditions still see them. A mounted
// disk (an image mounted beside the driver's disks) carries M and its
// mount point.
func fileDiskItem(d *disk, size int64, hideClosed bool) item {
	flags := "B"
	mounted := "no"
	if d.Mounted {
		flags += "M"
		mounted = "yes"
	}
	if d.Export {
		flags += "t"
	}
	hide := hideClosed && !d.Export
	sz := max(size, 0)
	props := []prop{
		bareProp("type", "file"),
		strProp("slot", d.Slot),
		strProp("slot-default", ""),
		strProp("parent", ""),
		bareProp("fs", "-"),
		strProp("model", d.FilePath),
		{key: "size", raw: fmt.Sprint(sz), text: spacedNumber(sz)},
		bareProp("mount-filesystem", mounted),
		bareProp("mount-read-only", mounted),
	}
	if d.Mounted {
		props = append(props, strProp("mount-point", d.Slot))
	}
	props = append(props,
		bareProp("compress", "no"),
		bareProp("sector-size", "512"),
		bareProp("raid-master", "none"),
		bareProp("nvme-tcp-export", yesNo(d.Export)),
		hidden(bareProp("nvme-tcp-server-port", fmt.Sprint(d.Port)), hide),
		hidden(strProp("nvme-tcp-server-nqn", d.NQN), hide),
		hidden(strProp("nvme-tcp-server-allow-host-name", d.AllowHost), hide),
		bareProp("iscsi-export", "no"),
		bareProp("nfs-sharing", "no"),
		bareProp("smb-sharing", "no"),
		bareProp("media-sharing", "no"),
		bareProp("media-interface", "none"),
		bareProp("swap", "no"),
		bareProp("file-path", d.FilePath),
		bareProp("file-size", humanSize(sz)),
		bareProp("file-offset", "0"),
	)
	if d.Password != "" {
		// Only with a password: the hardware captures (docs/routeros.md)
		// print no such property on disks without one.
		props = slices.Insert(props, slices.IndexFunc(props, func(p prop) bool { return p.key == "iscsi-export" }),
			hidden(strProp("nvme-tcp-server-secret", serverSecret(d.Password)), hide))
	}
	return item{flags: flags, props: props}
}

func hidden(p prop, hide bool) prop {
	p.hidden = hide
	return p
}

// diskItems returns the pool disk and then every file disk, in table order,
// paired with the disk (nil for the pool).
func (s *Server) diskItems() ([]item, []*disk, error) {
	f, err := s.free()
	if err != nil {
		return nil, nil, err
	}
	items := []item{s.poolItem(s.poolSize, f)}
	disks := []*disk{nil}
	for _, d := range s.disks {
		items = append(items, fileDiskItem(d, s.fileSize(d), s.closedProps == ClosedExportHidden))
		disks = append(disks, d)
	}
	return items, disks, nil
}

// fileKeys are the properties /file where and find accept.
var fileKeys = map[string]bool{"name": true, "type": true, "size": true, "last-modified": true}

func fileItem(e fileEntry) item {
	typ := "directory"
	size := ""
	if !e.dir {
		typ = "file"
		if ext := path.Ext(e.name); ext != "" && !strings.Contains(ext, "/") {
			typ = ext + " file"
		}
		size = humanSize(e.info.Size())
	}
	props := []prop{bareProp("name", e.name), rawProp("type", typ)}
	if !e.dir {
		props = append(props, prop{key: "size", raw: fmt.Sprint(e.info.Size()), text: size})
	}
	props = append(props, rawProp("last-modified", e.info.ModTime().UTC().Format("2006-01-02 15:04:05")))
	return item{props: props}
}
